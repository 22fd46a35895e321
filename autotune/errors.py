"""One exception root for everything a caller can catch.

    AutotuneError                 every error autotune raises on purpose
    ├── UsageError                bad flag, bad spec, malformed or missing input file
    │   └── ResultFormatError     a saved file is not a result this version can read
    ├── ServerError               the model server or verifier endpoint cannot be used
    │   ├── ServerUnreachable     nothing answers at the address
    │   ├── ServerStartupError    a launched server exited or never became healthy
    │   └── VerifierHTTPError     the verifier endpoint answered, but not a verification
    ├── CollectionError           a run could not go on (every request failing, ...)
    └── BaselineUnavailable       `autotune bench`: the baseline is missing or unreadable

Every class is defined here but ResultFormatError (autotune.results, beside the reader
that raises it); autotune.verifiers.http and autotune.bench re-export theirs. Not in the
tree, because no user sees them: a rollout's ModelCallError (counted in the error table,
never raised to the caller) and the simulated server's own start-up errors (printed to
its log, as vLLM's are, and read back into a ServerStartupError).

The CLI prints `str(error)` as one sentence (cause and fix) and exits non-zero: 2 for a
UsageError, 1 for the others; `autotune bench` exits 3 for BaselineUnavailable and 4 for
the others (1 means a regression there).
"""


class AutotuneError(Exception):
    """Root of autotune's exceptions; the message is shown to the user as is."""


class UsageError(AutotuneError):
    """The user gave something autotune cannot use (flag, file, spec)."""


class ServerError(AutotuneError):
    """A server autotune talks to cannot be used."""


class ServerUnreachable(ServerError):
    """Nothing answers at the server's address."""


class ServerStartupError(ServerError):
    """A server autotune launched died or never became healthy.

    `reason` holds the server's own last error line, for infeasible-trial records.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class VerifierHTTPError(ServerError):
    """The verifier endpoint answered, but not with a usable verification."""


class CollectionError(AutotuneError):
    """A collection run had to stop (its rollouts so far are kept)."""


class BaselineUnavailable(AutotuneError):
    """The bench baseline file is missing or unreadable: nothing can be compared (exit 3)."""
