"""The simulated engine measured in virtual time, for benchmarks of the search itself.

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
from autotune.launchers import Point
from autotune.probe import ProbeSettings
from autotune.results import percentile
from autotune.servers.sim.scheduler import SimEngine
from autotune.servers.sim.server import SimConfigError, load_config
from autotune.stats import batch_means_rate
from autotune.study import knob_flags

CHECK_EVERY = 32  # completions between convergence checks


@dataclass(slots=True)
class VirtualSession:
    engine: SimEngine
    settings: ProbeSettings
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    seed: int

    async def measure(self, parallelism: int) -> Point:
        """A closed-loop probe at `parallelism`, timed in simulated seconds."""
        engine, settings = self.engine, self.settings
        start = engine.sim_time_s
        done_at: list[float] = []
        latencies: list[float] = []
        tokens: list[tuple[float, int]] = []
        stop = asyncio.Event()
        window: list[float] = []  # [warm_until, stop_at]
        rng = random.Random(self.seed * 7919 + parallelism)

        def lengths() -> tuple[int, int]:
            prompt = max(1, round(rng.gauss(*self.prompt_tokens)))
            output = max(1, round(rng.gauss(*self.output_tokens)))
            return prompt, output

        def check(now: float) -> None:
            if not window:
                if len(done_at) >= parallelism and now - start >= settings.warmup_s:
                    window.append(now)
                elif now - start > settings.max_s:
                    window.append(start)
                return
            elapsed = now - window[0]
            if elapsed >= settings.max_s:
                window.append(now)
                stop.set()
            elif elapsed >= max(settings.min_s, sum(latencies) / len(latencies)):
                estimate = batch_means_rate(done_at, window[0], now)
                if (
                    estimate.events >= 20
                    and estimate.relative_halfwidth <= settings.target_halfwidth
                ):
                    window.append(now)
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
                tokens.append((now, output))
                if len(done_at) % CHECK_EVERY == 0 or len(done_at) == parallelism:
                    check(now)

        clients = [asyncio.create_task(client()) for _ in range(parallelism)]
        await stop.wait()
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        warm, end = window[0], window[1]
        estimate = batch_means_rate(done_at, warm, end)
        in_window = [i for i, t in enumerate(done_at) if warm <= t < end]
        output = sum(tokens[i][1] for i in in_window)
        return Point(
            parallelism=parallelism,
            rollouts_per_s=estimate.rate,
            output_tokens_per_s=output / max(end - warm, 1e-9),
            error_rate=0.0,
            p95_latency_s=percentile([latencies[i] for i in in_window], 95),
            probe_s=end - start,
            stop_reason="converged" if end - warm < settings.max_s else "time cap",
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
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[VirtualSession]:
        try:
            config = load_config([*self.fixed_args, *knob_flags(knobs)])
        except SimConfigError as error:
            raise ServerStartupError(
                f"the simulated server refused this configuration: {error}", reason=str(error)
            ) from None
        engine_config = replace(config.engine_config(), time_scale=0.0)
        async with SimEngine(engine_config) as engine:
            yield VirtualSession(
                engine, self.settings, self.prompt_tokens, self.output_tokens, self.seed
            )
