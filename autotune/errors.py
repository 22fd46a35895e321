"""One exception root for everything a caller can catch: `AutotuneError` and its subclasses.
The tree, the exit codes the CLI maps them to, and why: docs/design/errors.md.
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
