"""One collect run's live metering: the metrics endpoint, the samples, the drift watch.
How a collect uses it: docs/design/live.md.
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from autotune.config.collection import PROBE_DEFAULTS, CollectConfig
from autotune.live.expect import diagnose_command, workload_differences
from autotune.live.figures import RunState, Sources, StageHistograms
from autotune.live.samples import Sampler, StatsFile, stats_path
from autotune.results.runs import CollectSummary, DriftWarning, Expectation, LiveSample
from autotune.rollout.engine import EngineObserver
from autotune.rollout.pipeline import Pipeline
from autotune.rollout.workload import workload_record

if TYPE_CHECKING:
    from autotune.live.drift import DriftWatch
    from autotune.live.metrics import Scrapes

REPORT_EVERY_S = 5.0  # the sample interval of `--report` without `--stats-every`
WARM_POLL_S = 0.25  # how often the drift watch looks whether warm-up is over


class _CompletionClock:
    """The drift watch's event times: when each rollout completed (perf_counter). Passes
    every event on to the next observer (the progress bar)."""

    __slots__ = ("_next", "done_at")

    def __init__(self, following: EngineObserver | None) -> None:
        self.done_at = array("d")
        self._next = following

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None:
        self.done_at.append(time.perf_counter())
        if self._next is not None:
            self._next.rollout_done(timings, output_tokens)

    def rollout_failed(self, failure_class: str) -> None:
        if self._next is not None:
            self._next.rollout_failed(failure_class)


class LiveMonitor:
    """Everything a collect reports while it runs; inert when no live flag is given."""

    def __init__(
        self, config: CollectConfig, expectation: Expectation | None, say: Callable[[str], None]
    ) -> None:
        self._config = config
        self._live = config.live
        self._say = say
        self.state = RunState(expectation)
        self.samples: list[LiveSample] = []
        self.scrapes: Scrapes | None = None
        self.stats_file: StatsFile | None = None
        self.watch: DriftWatch | None = None
        self._clock: _CompletionClock | None = None
        self._sampler: Sampler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._unreported: DriftWarning | None = None  # for the next sample

    @property
    def expectation(self) -> Expectation | None:
        return self.state.expectation

    def observer(self, following: EngineObserver | None) -> EngineObserver | None:
        """The engine's observer: a completion clock before `following` if drift is watched."""
        if self.state.expectation is None:
            return following
        self._clock = _CompletionClock(following)
        return self._clock

    def attach(self, sources: Sources, pipeline: Pipeline, parallelism: int) -> None:
        """The engine exists: read its totals from now on and start the periodic tasks."""
        self.state.sources = sources
        live = self._live
        if live.metrics_port is not None:
            self.state.histograms = StageHistograms(sources.stats.samples)
        if live.sampled:
            self._sampler = Sampler(sources, time.time())
            if live.stats_every_s is not None and self._config.output is not None:
                self.stats_file = StatsFile(stats_path(self._config.output))
            every = live.stats_every_s or REPORT_EVERY_S
            self._tasks.append(asyncio.create_task(self._sample_every(sources, every)))
        expectation = self.state.expectation
        if expectation is not None and self._clock is not None:
            run = replace(self._config, target=pipeline.target_config)  # the fields sent
            workload = workload_record(run)  # hashes a task file: once
            differs = workload_differences(expectation, workload)
            if differs:
                self._say(
                    f"autotune: warning: this run's workload differs from the one "
                    f"{expectation.source} was measured on ({'; '.join(differs)}): a shortfall "
                    "will be reported as the workload's, not as drift; for a like-with-like "
                    "check run the recommendation's `autotune` line with --expect"
                )
            hint = diagnose_command(run, workload, pipeline.target.model, parallelism)
            watching = self._watch_drift(
                sources, expectation, hint, self._clock, parallelism, differs
            )
            self._tasks.append(asyncio.create_task(watching))

    async def _sample_every(self, sources: Sources, every: float) -> None:
        started = sources.stats.started
        assert self._sampler is not None
        tick = 0
        while True:
            tick += 1
            await asyncio.sleep(max(0.0, started + tick * every - time.perf_counter()))
            drift, self._unreported = self._unreported, None
            sample = self._sampler.take(time.perf_counter(), steady=self.state.steady, drift=drift)
            self._record(sample)

    def _record(self, sample: LiveSample) -> None:
        if self._live.report is not None:
            self.samples.append(sample)
        if self.stats_file is not None:
            self.stats_file.write(sample)

    async def _watch_drift(
        self,
        sources: Sources,
        expectation: Expectation,
        hint: str,
        clock: _CompletionClock,
        parallelism: int,
        differs: list[str],
    ) -> None:
        """Windows from the end of warm-up until the drain begins, each fed to the watch."""
        from autotune.live.drift import DriftWatch, WindowFigures, auto_window_s, window_rate
        from autotune.window import MIN_BATCHES, warm_until

        stats, done_at, samples = sources.stats, clock.done_at, sources.stats.samples.samples
        started = stats.started
        warm = None
        while warm is None:
            await asyncio.sleep(WARM_POLL_S)
            warm = warm_until(done_at, parallelism, started, PROBE_DEFAULTS.warmup_s)
        width = self._live.drift_window_s
        if width is None:
            totals = samples["total"]
            width = auto_window_s(sum(totals) / len(totals) if totals else 0.0)
        watch = DriftWatch(expectation, self._live.drift_windows, width, hint, differs)
        self.watch = watch
        cuts = {stage: len(values) for stage, values in samples.items()}
        start, told_short = warm, False
        while True:
            end = start + width
            await asyncio.sleep(max(0.0, end - time.perf_counter()))
            if sources.draining:
                return  # from here fewer rollouts are in flight: not steady state
            means = {}
            for stage, values in samples.items():
                count = len(values)
                if count > cuts[stage]:
                    means[stage] = sum(values[cuts[stage] : count]) / (count - cuts[stage])
                cuts[stage] = count
            rate = window_rate(done_at, start, end, means.get("total", 0.0))
            if rate.batches < MIN_BATCHES and not told_short:
                told_short = True
                self._say(
                    f"autotune: warning: a drift window of {width:.3g} s holds {rate.batches} "
                    f"batches of completions (each spans two mean rollout latencies), too few "
                    f"for its interval to tell drift from noise; pass --drift-window "
                    f"{auto_window_s(means.get('total', 0.0)):.0f} or more"
                )
            if math.isfinite(rate.high):  # two batches at least: an interval to show
                self.state.steady = (rate.rate, rate.low, rate.high)
            warning = watch.add(WindowFigures(start - started, end - started, rate, means))
            if warning is not None:
                self.state.drifted = True
                self._unreported = warning
                self._say(f"autotune: warning: {warning.message}")
            start = end

    async def stop_tasks(self) -> BaseException | None:
        """Stop the periodic tasks; returns the first error one of them met."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        errors = [task.exception() for task in tasks if not task.cancelled()]
        return next((error for error in errors if error is not None), None)

    async def finish(self, summary: CollectSummary) -> CollectSummary:
        """The run has ended: the closing summary with the drift warning, if one fired,
        which the last sample carries; figures final."""
        error = await self.stop_tasks()
        if error is not None:
            raise error  # a stats file that could not be written: one sentence
        if self.watch is not None:
            summary = replace(summary, drift=self.watch.warning)
        sources = self.state.sources
        if self._sampler is not None and sources is not None:
            drift, self._unreported = self._unreported, None
            steady = self.state.steady
            finished = sources.stats.finished
            self._record(self._sampler.take(finished, steady=steady, drift=drift, summary=summary))
        self.state.finished = True
        return summary

    async def linger(self) -> None:
        """With --metrics-linger: serve until one scrape has read the final figures."""
        if self.scrapes is not None and self._live.metrics_linger_s > 0:
            await self.scrapes.next(self._live.metrics_linger_s)


@asynccontextmanager
async def open_monitor(
    config: CollectConfig, expectation: Expectation | None, say: Callable[[str], None]
) -> AsyncIterator[LiveMonitor]:
    """The monitor of one run: its metrics endpoint bound first; everything stopped after."""
    monitor = LiveMonitor(config, expectation, say)
    live = config.live
    async with AsyncExitStack() as stack:
        if live.metrics_port is not None:
            from autotune.live.metrics import RunCollector, serve_metrics

            monitor.scrapes = await stack.enter_async_context(
                serve_metrics(RunCollector(monitor.state), live.metrics_host, live.metrics_port)
            )
        try:
            yield monitor
        finally:
            await monitor.stop_tasks()  # after an error, one of theirs matters less
            if monitor.stats_file is not None:
                monitor.stats_file.close()
