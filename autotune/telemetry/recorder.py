"""Sample every telemetry source at a fixed interval while a probe runs; owns the `Sampler`
Protocol. Why: docs/design/telemetry.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of one source: `t` is `time.time()` when the reading came back."""

    t: float
    source: str  # "client" | "server" | "gpu"
    values: dict[str, float]


class Sampler(Protocol):
    """A telemetry source. `sample()` returns None when it has nothing this time."""

    name: str
    available: bool
    reason: str | None

    async def sample(self) -> dict[str, float] | None: ...

    async def aclose(self) -> None: ...


class TelemetryRecorder:
    """`async with TelemetryRecorder([...]) as recorder:` samples in one background task.

    All sources are read together every `interval_s`; a tick that overruns (a slow
    scrape) is followed by the next one at once, never by a burst of missed ones. On a
    clean exit one last tick is taken, so counters cover the run's end. The recorder
    owns its samplers and closes them on exit.
    """

    def __init__(self, samplers: Sequence[Sampler], interval_s: float = 0.5) -> None:
        self.samples: list[Sample] = []
        self.unavailable: dict[str, str] = {}
        self._samplers = list(samplers)
        self._live = list(samplers)
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name="telemetry-recorder")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._task is not None:
                self._task.cancel()
                # wait() rather than await: the task's CancelledError is not ours to raise.
                await asyncio.wait({self._task})
            if exc_type is None:
                await self._tick()
        finally:
            await asyncio.gather(*(s.aclose() for s in self._samplers), return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self._tick()
            if not self._live:
                return
            next_at = max(next_at + self._interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _tick(self) -> None:
        for sampler in [s for s in self._live if not s.available]:
            self._drop(sampler, sampler.reason or f"no {sampler.name} telemetry")
        await asyncio.gather(*(self._sample_one(s) for s in self._live))

    async def _sample_one(self, sampler: Sampler) -> None:
        try:
            values = await sampler.sample()
        except Exception as exc:  # a telemetry bug must not end the probe it watches
            self._drop(sampler, f"{sampler.name} telemetry failed: {exc!r}")
            return
        if values:
            self.samples.append(Sample(time.time(), sampler.name, values))
        if not sampler.available:
            self._drop(sampler, sampler.reason or f"no {sampler.name} telemetry")

    def _drop(self, sampler: Sampler, reason: str) -> None:
        self.unavailable[sampler.name] = reason
        if sampler in self._live:
            self._live.remove(sampler)
