"""One exception root for everything a caller can catch.

    AutotuneError                 every error autotune raises on purpose
    ├── UsageError                bad flag, bad spec, malformed or missing input file
    ├── ServerError               the model server or verifier endpoint cannot be used
    │   ├── ServerUnreachable     nothing answers at the address
    │   └── ServerStartupError    a launched server exited or never became healthy
    └── CollectionError           a run could not go on (every request failing, ...)

The CLI prints `str(error)` as one sentence (cause and fix) and exits non-zero.
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


class CollectionError(AutotuneError):
    """A collection run had to stop (its rollouts so far are kept)."""
