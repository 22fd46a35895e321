"""Verifiers: a finished rollout row in, a reward (and verifier fields) out. The engine
owns the Protocol; `load_verifier` maps names to builtin, pool and http verifiers.
Why: docs/design/verifiers.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from autotune.errors import UsageError
from autotune.verifiers.builtin import BoxedVerifier, ExactVerifier, McqaVerifier, NoneVerifier
from autotune.verifiers.pool import CallableVerifier, CodeVerifier, PoolVerifier, SyntheticVerifier

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "VERIFIERS",
    "BoxedVerifier",
    "CallableVerifier",
    "CodeVerifier",
    "ExactVerifier",
    "McqaVerifier",
    "NoneVerifier",
    "SyntheticVerifier",
    "Verifier",
    "VerifierOptions",
    "load_verifier",
]


class Verifier(Protocol):
    """One verifier.

    `capacity` is None for a cheap verifier that runs inline on the event loop, else
    the number of verifications it can run at once (process-pool workers, HTTP
    connections); the engine queues rollouts in front of it up to that capacity.
    `verify` returns a dict with a float `reward` plus any verifier fields to store in
    the output row (`extracted_answer`, ...). It may raise, or answer what no row can
    hold (a NaN reward, a set); the engine then records the rollout as a
    `verifier_error` failure and goes on. Keys the engine writes itself
    (`engine.RESERVED_KEYS`: `_ng_task_index`, `response`, ...) are dropped from the answer.
    """

    name: str
    capacity: int | None

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class VerifierOptions:
    """Knobs shared by verifier kinds (only some apply to each).

    `workers` None means the kind's own default: the usable CPU count for process
    pools (code, synthetic, user callables), 64 connections for HTTP.
    `timeout_s` (`--verifier-timeout`) bounds one HTTP verification or one
    user-callable call (whose stuck worker is then replaced); the code verifier uses
    min(6 s, timeout_s) per unit test.
    """

    workers: int | None = None
    cost_ms: float = 0.0
    timeout_s: float = 60.0


# Named verifiers; paths (`file.py:fn`, `pkg.mod:fn`) and URLs are recognised by shape.
VERIFIERS: dict[str, Callable[[VerifierOptions], Verifier]] = {
    "none": NoneVerifier,
    "exact": ExactVerifier,
    "boxed": BoxedVerifier,
    "mcqa": McqaVerifier,
    "code": CodeVerifier,
    "synthetic": SyntheticVerifier,
}

_UNKNOWN = (
    "unknown verifier {spec!r}: use one of none, exact, boxed, mcqa, code, synthetic, "
    "path/to/file.py:function, package.module:function, or an http(s)://host:port/verify URL."
)


async def load_verifier(
    spec: str,
    options: VerifierOptions | None = None,
    session: aiohttp.ClientSession | None = None,
) -> Verifier:
    """The verifier `spec` names, started and ready.

    Async because pool verifiers start (and warm) their worker processes here, so that
    start-up is neither inside a measurement nor a surprise on the first rollout; an
    HTTP verifier without a `session` opens its own (closed by `aclose`). Raises
    UsageError, one sentence naming the cause and the fix, for a spec it cannot use.
    """
    options = options or VerifierOptions()
    spec = spec.strip()
    if options.workers is not None and options.workers < 1:
        raise UsageError(
            f"verifier {spec!r}: workers must be at least 1 (got {options.workers}); "
            "omit it for the default."
        )
    if options.cost_ms < 0:
        raise UsageError(f"verifier {spec!r}: cost_ms must be zero or more; got {options.cost_ms}.")
    if options.timeout_s <= 0:
        raise UsageError(f"verifier {spec!r}: timeout_s must be positive; got {options.timeout_s}.")

    if spec.lower().startswith(("http://", "https://")):
        from autotune.verifiers.http import HttpVerifier  # lazy: keeps aiohttp out of workers

        return await HttpVerifier.open(spec, options, session)

    verifier: Verifier
    kind = VERIFIERS.get(spec)
    if kind is not None:
        verifier = kind(options)
    elif ":" in spec:
        verifier = CallableVerifier.from_spec(spec, options)
    elif spec.endswith(".py"):
        raise UsageError(
            f"verifier {spec!r} names a file but no function; write it as {spec}:function."
        )
    else:
        raise UsageError(_UNKNOWN.format(spec=spec))

    if isinstance(verifier, PoolVerifier):
        await verifier.start()
    return verifier
