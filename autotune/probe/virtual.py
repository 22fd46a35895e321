"""The virtual-time probe: the simulated engine stepped without sleeping and measured in
simulated seconds, for benchmarks of the search itself (`VirtualProbe`, and
`VirtualSimLauncher` for a study's configurations). Why: docs/design/probes.md.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.config.knobs import NUM_ENGINES
from autotune.engine_model.scheduler import SimEngine
from autotune.engine_model.state import engine_config
from autotune.errors import ServerStartupError
from autotune.hardware.deployment import SimArgs, SimConfig, SimConfigError
from autotune.results.probes import ProbeResult
from autotune.results.stages import StageLatency, no_latencies
from autotune.rollout.replicas import ReplicaSet
from autotune.stats import batch_means_rate
from autotune.window import ProbeSettings, Window, steady_window

CHECK_EVERY = 32  # completions between convergence checks
HITS = "server/vllm:prefix_cache_hits_total"  # as the Prometheus sampler names them
QUERIES = "server/vllm:prefix_cache_queries_total"

Planned = tuple[float, int, list[Any]]  # an engine step: duration, decodes, completing


@dataclass(slots=True)
class _Clock:
    """Steps every engine on one virtual clock: the next step to end is the next event.

    It runs the engines' own step (`plan_step`, `end_step`: what each engine's asyncio
    task runs) instead of starting those tasks, since each task would advance its own
    engine's clock alone, and several engines would drift apart.
    """

    engines: list[SimEngine]
    now: float = 0.0
    _steps: list[tuple[float, int, Planned]] = field(default_factory=list)
    _busy: set[int] = field(default_factory=set)

    def _plan(self) -> None:
        """Start a step on every engine that is free and has work, at `now`."""
        for index, engine in enumerate(self.engines):
            if index in self._busy:
                continue
            planned = engine.plan_step()
            if planned is None:
                continue
            engine.sim_time_s = max(engine.sim_time_s, self.now)  # idle until now
            heapq.heappush(self._steps, (engine.sim_time_s + planned[0], index, planned))
            self._busy.add(index)

    async def run(self, stop: asyncio.Event) -> None:
        """Step until `stop` is set; after each step the clients it finished run (and
        submit again) before anything else is planned."""
        await asyncio.sleep(0)  # the clients' first submissions
        while not stop.is_set():
            self._plan()
            if not self._steps:
                raise RuntimeError("no engine can run a step: the clients sent nothing")
            end, index, (duration, decodes, completing) = heapq.heappop(self._steps)
            self.now = end
            self._busy.discard(index)
            self.engines[index].end_step(
                duration, decodes, completing, asyncio.get_running_loop().time()
            )
            await asyncio.sleep(0)

    def drop_steps(self) -> None:
        """Forget the steps under way once every request was aborted (a probe's end):
        they would only advance sequences that no longer exist."""
        self._steps.clear()
        self._busy.clear()


@dataclass(slots=True)
class VirtualProbe:
    engines: list[SimEngine]
    settings: ProbeSettings
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    seed: int
    num_repeats: int = 1
    clock: _Clock = field(init=False)
    # Task numbers run on across probes: a prefix key names one prompt for the engines' life.
    tasks: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.clock = _Clock(self.engines)

    def _work(self, rng: random.Random) -> Iterator[tuple[int, int, int]]:
        """(task, prompt tokens, output tokens) of each rollout in turn: a task's
        `num_repeats` rollouts one after another, sharing its prompt."""
        for task in self.tasks:
            prompt = max(1, round(rng.gauss(*self.prompt_tokens)))
            for _ in range(self.num_repeats):
                yield task, prompt, max(1, round(rng.gauss(*self.output_tokens)))

    async def measure(self, parallelism: int, settings: ProbeSettings | None = None) -> ProbeResult:
        """A closed-loop probe at `parallelism`, timed in simulated seconds."""
        clock = self.clock
        settings = replace(settings or self.settings, parallelism=parallelism)
        start = clock.now
        hits_before, queries_before = _prefix_counts(self.engines)
        done_at: list[float] = []
        latencies: list[float] = []
        ttfts: list[float] = []  # what a streamed HTTP probe reports as its ttft stage
        tokens: list[int] = []
        stop = asyncio.Event()
        found: list[Window] = []
        work = self._work(random.Random(self.seed * 7919 + parallelism))
        router = ReplicaSet([str(index) for index in range(len(self.engines))])

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
                task, prompt, output = next(work)
                replica = router.acquire(task)
                submitted = clock.now
                request = self.engines[replica.index].submit(prompt, output, prefix_key=task)
                try:
                    await request.first_token
                    first_token = clock.now - submitted
                    await request.finished
                except asyncio.CancelledError:
                    request.abort()  # the probe is over: free the engine for the next one
                    raise
                now = clock.now
                router.succeeded(replica, now - submitted, output)
                done_at.append(now)
                latencies.append(now - submitted)
                ttfts.append(first_token)
                tokens.append(output)
                if (len(done_at) % CHECK_EVERY == 0 or len(done_at) == parallelism) and not found:
                    check(now)

        clients = [asyncio.create_task(client()) for _ in range(parallelism)]
        try:
            await clock.run(stop)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            clock.drop_steps()
        window = found[0]
        estimate = window.estimate or batch_means_rate(done_at, window.start, window.end)
        in_window = [i for i, t in enumerate(done_at) if window.start < t <= window.end]
        measured = max(window.end - window.start, 1e-9)
        latency = no_latencies()
        latency["total"] = StageLatency.of([latencies[i] for i in in_window])
        latency["ttft"] = StageLatency.of([ttfts[i] for i in in_window])
        hits, queries = _prefix_counts(self.engines)
        telemetry = {  # over the whole probe: the cache's share hardly drifts in a probe
            HITS: {"delta": float(hits - hits_before)},
            QUERIES: {"delta": float(queries - queries_before)},
        }
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
            telemetry=telemetry,
        )


def _prefix_counts(engines: Sequence[SimEngine]) -> tuple[int, int]:
    """Prompt tokens found in the engines' prefix caches, and looked up, so far."""
    hits = sum(engine.prefix_cache_hits_total for engine in engines)
    return hits, sum(engine.prefix_cache_queries_total for engine in engines)


@dataclass(slots=True)
class VirtualSimLauncher:
    """Starts the simulated engines in-process per configuration, in virtual time:
    `num_engines` of them (the knob; one without it), each with the other knobs."""

    fixed_args: Sequence[str]
    settings: ProbeSettings
    prompt_tokens: tuple[int, int] = (256, 64)
    output_tokens: tuple[int, int] = (128, 32)
    seed: int = 0
    num_repeats: int = 1

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[VirtualProbe]:
        flags = {name: value for name, value in knobs.items() if name != NUM_ENGINES}
        try:
            config = SimConfig.of(SimArgs.parse(self.fixed_args).with_knobs(flags))
        except SimConfigError as error:
            raise ServerStartupError(
                f"the simulated server refused this configuration: {error}", reason=str(error)
            ) from None
        one_engine = replace(engine_config(config), time_scale=0.0)
        # Never started: the probe's clock steps them (see _Clock).
        engines = [SimEngine(one_engine) for _ in range(int(knobs.get(NUM_ENGINES, 1)))]
        try:
            yield VirtualProbe(
                engines,
                self.settings,
                self.prompt_tokens,
                self.output_tokens,
                self.seed,
                self.num_repeats,
            )
        finally:
            for engine in engines:
                await engine.aclose()
