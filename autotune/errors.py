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
never raised to the caller), engine.VerifierResultError (a verifier answer no row can
hold: that rollout fails as a `verifier_error`, never the run) and the simulated
server's own start-up errors (printed to its log, as vLLM's are, and read back into a
ServerStartupError).

The CLI prints `str(error)` as one `autotune: error:` sentence (cause and fix) and exits
with one of these codes (each command's --help repeats them):

    0    done
    1    a runtime error: any AutotuneError but a UsageError
    2    a usage error: a UsageError, or a flag argparse refuses (out of range, unknown)
    3    the run finished but fails its gate: `collect` when no rollout succeeded or a
         larger share failed than --max-failure-rate (what it collected is kept);
         `diagnose` when the verdict is one of --fail-on
    130  interrupted (Ctrl-C); 143 terminated (SIGTERM): finished work is kept

`autotune bench` keeps its own table, made for CI: 1 is a regression, 3 a
BaselineUnavailable, 4 any other error.
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
