"""The virtual-time probe: the simulated engine measured in simulated seconds, for
benchmarks of the search itself.

The sweep's efficiency is judged in probe-seconds: how long its probes would have run
on the real server. Driving the engine with `time_scale=0` (no sleeping) and closed-loop
clients gives the same steady-state measurement as an HTTP probe, in simulated
seconds, at a tiny fraction of the wall time, so an exhaustive grid over hundreds of
configurations (the true optimum) can be measured in minutes. Same flags, same
start-up refusals (vLLM-like error lines) as the HTTP server.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from autotune.errors import ServerStartupError
from autotune.probe.window import ProbeSettings, Window, steady_window
from autotune.results import ProbeResult, StageLatency, no_latencies
from autotune.servers.flags import server_flags
from autotune.servers.sim.scheduler import SimEngine
from autotune.servers.sim.server import SimConfigError, load_config
from autotune.stats import batch_means_rate

CHECK_EVERY = 32  # completions between convergence checks


@dataclass(slots=True)
class VirtualProbe:
    engine: SimEngine
    settings: ProbeSettings
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    seed: int

    async def measure(self, parallelism: int, settings: ProbeSettings | None = None) -> ProbeResult:
        """A closed-loop probe at `parallelism`, timed in simulated seconds."""
        engine = self.engine
        settings = replace(settings or self.settings, parallelism=parallelism)
        start = engine.sim_time_s
        done_at: list[float] = []
        latencies: list[float] = []
        tokens: list[int] = []
        stop = asyncio.Event()
        found: list[Window] = []
        rng = random.Random(self.seed * 7919 + parallelism)

        def lengths() -> tuple[int, int]:
            prompt = max(1, round(rng.gauss(*self.prompt_tokens)))
            output = max(1, round(rng.gauss(*self.output_tokens)))
            return prompt, output

        def check(now: float) -> None:
            mean_latency = sum(latencies) / len(latencies)
            window = steady_window(
                done_at, settings, started=start, now=now, mean_latency_s=mean_latency
            )
            if window is not None:
                found.append(window)
                stop.set()

        async def client() -> None:
            while not stop.is_set():
                prompt, output = lengths()
                submitted = engine.sim_time_s
                request = engine.submit(prompt, output)
                try:
                    await request.finished
                except asyncio.CancelledError:
                    request.abort()  # the probe is over: free the engine for the next one
                    raise
                now = engine.sim_time_s
                done_at.append(now)
                latencies.append(now - submitted)
                tokens.append(output)
                if (len(done_at) % CHECK_EVERY == 0 or len(done_at) == parallelism) and not found:
                    check(now)

        clients = [asyncio.create_task(client()) for _ in range(parallelism)]
        await stop.wait()
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        window = found[0]
        estimate = window.estimate or batch_means_rate(done_at, window.start, window.end)
        in_window = [i for i, t in enumerate(done_at) if window.start < t <= window.end]
        measured = max(window.end - window.start, 1e-9)
        latency = no_latencies()
        latency["total"] = StageLatency.of([latencies[i] for i in in_window])
        return ProbeResult(
            parallelism=parallelism,
            rollouts_per_s=estimate.rate,
            rollouts_per_s_ci=(estimate.low, estimate.high),
            output_tokens_per_s=sum(tokens[i] for i in in_window) / measured,
            error_rate=0.0,
            completed=len(in_window),
            failed=0,
            measured_s=window.end - window.start,
            warmup_s=window.start - start,
            stop_reason=window.reason,
            latency_s=latency,
            batches=estimate.batches,
        )


@dataclass(slots=True)
class VirtualSimLauncher:
    """Starts the simulated engine in-process per configuration, in virtual time."""

    fixed_args: Sequence[str]
    settings: ProbeSettings
    prompt_tokens: tuple[int, int] = (256, 64)
    output_tokens: tuple[int, int] = (128, 32)
    seed: int = 0

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[VirtualProbe]:
        try:
            config = load_config([*self.fixed_args, *server_flags(knobs)])
        except SimConfigError as error:
            raise ServerStartupError(
                f"the simulated server refused this configuration: {error}", reason=str(error)
            ) from None
        engine_config = replace(config.engine_config(), time_scale=0.0)
        async with SimEngine(engine_config) as engine:
            yield VirtualProbe(
                engine, self.settings, self.prompt_tokens, self.output_tokens, self.seed
            )
