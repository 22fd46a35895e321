"""The engine probe: autotune's rollout engine at one parallelism against one server,
measured in one or more blocks pooled into one result.
Why: docs/design/probes.md.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from autotune.config.rl_specs import BatchSpec, LoopSpec
from autotune.probe.server_counts import server_tokens, token_check
from autotune.probe.status import ProbeWatch, drain_status, probe_status
from autotune.results.probes import ProbeBlock, ProbeResult, RateCheck
from autotune.results.runs import BatchSummary, LoopSummary
from autotune.results.stages import STAGES, StageLatency, percentile, stage_durations
from autotune.rl.batch import run_steps
from autotune.rl.groups import ClosedGroup, GroupTracker, summarise_closed
from autotune.rl.trainer import run_on_server
from autotune.rollout.backends import ModelBackend
from autotune.rollout.engine import Engine
from autotune.rollout.replicas import CallEnd, ReplicaCounts, calls_heard, replica_stats, several
from autotune.rollout.store import RolloutSink
from autotune.rollout.workload import Task, WorkItem
from autotune.stats import RateEstimate, mean
from autotune.telemetry import Sample, Sampler, summarise
from autotune.telemetry.client import ClientSampler
from autotune.telemetry.gpu import GpuSampler
from autotune.telemetry.prometheus import PrometheusSampler, metrics_url
from autotune.telemetry.recorder import TelemetryRecorder
from autotune.verifiers import Verifier
from autotune.window import (
    ProbeSettings,
    Window,
    counted_in_rounds,
    in_rollouts,
    length_spread,
    long_rollouts,
    pooled_blocks,
    pooled_estimate,
    reconcile,
    steady_window,
    token_window,
    warm_until,
)

CHECK_EVERY_S = 0.25
TIMELINE_BINS = 60  # bins of a probe's throughput-over-time, at most


class _Meter:
    """Engine observer that keeps what steady-state estimation needs, compactly."""

    def __init__(self) -> None:
        self.done_at: list[float] = []
        self.timings: list[dict[str, float | None]] = []
        self.tokens: list[int] = []
        self.failed_at: list[tuple[float, str]] = []
        self.latency_sum = 0.0

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None:
        self.done_at.append(time.time())
        self.timings.append(timings)
        self.tokens.append(output_tokens)
        self.latency_sum += (timings["verify_end"] or 0.0) - (timings["queued"] or 0.0)

    @property
    def mean_latency_s(self) -> float:
        return self.latency_sum / len(self.done_at) if self.done_at else 0.0

    def rollout_failed(self, failure_class: str) -> None:
        self.failed_at.append((time.time(), failure_class))


def cycle_work(tasks: Sequence[Task]) -> Iterator[WorkItem]:
    """The probe's tasks over and over; each pass is a new rollout index. Probes that
    share one such iterator go on where the last stopped instead of resending prompts
    the server has just cached."""
    for rollout_index in itertools.count():
        for task in tasks:
            yield WorkItem(task, rollout_index)


async def run_probe(
    settings: ProbeSettings,
    tasks: Sequence[Task],
    backend: ModelBackend,
    verifier: Verifier,
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    metrics: str | None = None,
) -> ProbeResult:
    """Measure one parallelism in steady state; the model server's queue comes from
    `metrics` (its /metrics URL; default: beside `base_url`, where vLLM serves it)."""
    run = ProbeRun(settings, cycle_work(tasks), backend, verifier, base_url, metrics=metrics)
    return await run.measure()


@dataclass(frozen=True, slots=True)
class _Run:
    """One stretch of the engine at the probe's parallelism (wall-clock instants)."""

    started: float
    warm: float  # end of warm-up: the measured window starts here
    stop: float  # the window's end
    drained: float  # the rollouts in flight at the stop have finished
    reason: str


class ProbeRun:
    """One parallelism on one server, measured in one block and, on request, in more.

    `measure` runs the engine until this block's estimate is precise enough (or its
    window reaches `max_s`) and returns the result pooled over every block so far, each
    block listed on its own: a diagnosis that alternates parallelisms calls it again.
    """

    def __init__(
        self,
        settings: ProbeSettings,
        work: Iterator[WorkItem],
        backend: ModelBackend,
        verifier: Verifier,
        base_url: str,
        watch: ProbeWatch | None = None,
        metrics: str | None = None,
    ) -> None:
        self.settings = settings
        self.work = work  # the rollouts to send, from where the last probe stopped
        self.backend = backend
        self.verifier = verifier
        self.base_url = base_url
        self.replicas = several(backend.counters.replicas)
        # The model server's /metrics: every replica's when several serve it.
        self.metrics: list[str] = (
            [metrics]
            if metrics
            else [metrics_url(replica.url) for replica in self.replicas.replicas]
            if self.replicas is not None
            else [metrics_url(base_url)]
        )
        self.watch = watch  # told the phase and the interval so far, for a progress display
        self.meter = _Meter()
        self.runs: list[_Run] = []
        self.samples: list[Sample] = []
        self.unavailable: dict[str, str] = {}
        self.server_engine: str | None = None  # the engine the server's metrics showed
        self.counted = (0.0,) * len(_snapshot(backend.counters))  # over the windows
        self.replica_counted: list[ReplicaCounts] | None = None  # over the windows
        self.estimate: RateEstimate | None = None
        self.blocks: list[ProbeBlock] = []
        self.closed: list[tuple[float, ClosedGroup]] = []  # when each group ended
        self.stuck_tool_calls = 0  # hanging when a block's drain gave up
        self.retries: Counter[str] = Counter()  # over every block's whole run

    @property
    def windows(self) -> list[tuple[float, float]]:
        return [(run.warm, run.stop) for run in self.runs]

    @property
    def measured_s(self) -> float:
        return sum(end - start for start, end in self.windows)

    async def measure(self, *, max_s: float | None = None) -> ProbeResult:
        """One more block, until its own interval is within ±`target_halfwidth` or its
        window reaches `max_s` (the settings' unless given); the result covers every
        block measured so far."""
        settings = self.settings
        limits = settings if max_s is None else replace(settings, max_s=max_s)
        meter, counters = self.meter, self.backend.counters
        groups = None
        if settings.group_size > 1:
            groups = GroupTracker(settings.group_size)
            groups.on_close = lambda group: self.closed.append((time.time(), group))
        engine = Engine(
            self.backend,
            self.verifier,
            RolloutSink(None, resume=False),
            settings.parallelism,
            observer=meter,
            groups=groups,
        )
        retried_before = Counter(counters.retries)
        # The counters at every look (every CHECK_EVERY_S) and at the stop: a window's
        # counts run from the look at its start, which is known only once it has ended (a
        # window timed in tokens starts long before the completions' warm-up is over).
        looks: list[_Look] = []

        def look(now: float) -> None:
            looks.append(_Look(now, _snapshot(counters), self._replica_snapshot()))

        with calls_heard(self.replicas) as calls:  # each replica's, timed as completions
            # Scrapes get their own connection: at a parallelism near the pool's limit they would
            # otherwise queue behind model calls and time out exactly when the server is busiest.
            async with aiohttp.ClientSession() as metrics_session:
                server = PrometheusSampler(metrics_session, self.metrics)
                samplers: list[Sampler] = [ClientSampler(), server, GpuSampler()]
                async with TelemetryRecorder(samplers, settings.telemetry_interval_s) as recorder:
                    started = time.time()
                    look(started)
                    run = asyncio.create_task(engine.run(self.work))
                    streamed: list[tuple[float, float]] = []
                    in_pieces = True  # whether the last reading counted streamed pieces

                    def tokens_so_far(now: float) -> list[tuple[float, float]]:
                        """Output tokens generated so far: the server's own counter where it
                        has one, else the pieces streamed to the client (a server may send
                        several tokens a piece, so they are the second choice)."""
                        nonlocal in_pieces
                        streamed.append((now, counters.streamed_tokens))
                        counted = server_tokens(recorder.samples)
                        in_pieces = len(counted) < 2
                        return streamed if in_pieces else counted

                    def checked(window: Window) -> tuple[RateEstimate, RateCheck]:
                        """A window timed in tokens as rollouts/s, beside its completions."""
                        return _checked(
                            window, meter, counters, settings.parallelism, in_pieces=in_pieces
                        )

                    window, reason = await _watch(
                        limits,
                        meter,
                        run,
                        engine,
                        started,
                        look,
                        tokens_so_far,
                        checked,
                        self.watch,
                    )
                    look(time.time())
                    engine.stop()
                    if self.watch is not None:
                        measured = [(window.start, window.end)]
                        done = len(meter.done_at)
                        self.watch(drain_status(limits, done, measured, window.estimate))
                    if window.tokens is not None and not meter.tokens:
                        # a rollout's tokens convert the rate: wait for the first to finish
                        await _first_completion(run, meter, settings.max_s + 5.0)
                    self.stuck_tool_calls += await _drain(
                        run, _drain_limit_s(window, meter), counters
                    )
                    drained = time.time()
        self.retries += Counter(counters.retries) - retried_before
        self.samples.extend(recorder.samples)
        self.unavailable.update(recorder.unavailable)
        self.server_engine = server.engine or self.server_engine
        first, last = _look_at(looks, window.start), looks[-1]
        self.counted = tuple(
            total + b - a
            for total, a, b in zip(self.counted, first.counters, last.counters, strict=True)
        )
        self._count_replicas(window, calls, first.replicas, last.replicas)
        self.runs.append(_Run(started, window.start, window.end, drained, reason))
        check = None
        if window.tokens is not None:  # its rollouts/s, now that the drain has finished some
            estimate, check = checked(window)
            tokens = _in_tokens(window.tokens, counters, in_pieces=in_pieces)
            window = replace(window, estimate=estimate, tokens=tokens)
        self.estimate = window.estimate
        self.blocks.append(self._block(window, check))
        return self._result()

    def _block(self, window: Window, check: RateCheck | None) -> ProbeBlock:
        """The block just measured, on its own estimate (the pool is `_result`'s); timed in
        tokens, by the rate `check` chose."""
        done_at, timings = self.meter.done_at, self.meter.timings
        latencies = [
            seconds
            for i in _between(done_at, window.start, window.end)
            for stage, seconds in stage_durations(timings[i])
            if stage == "total"
        ]
        estimate = (
            window.estimate
            or pooled_estimate(done_at, [(window.start, window.end)], self.meter.mean_latency_s)[0]
        )
        tokens = window.tokens if check is None or check.used == "tokens" else None
        return ProbeBlock(
            at=window.start,
            rollouts_per_s=estimate.rate,
            rollouts_per_s_ci=(estimate.low, estimate.high),
            batches=estimate.batches,
            measured_s=window.end - window.start,
            latency_p50_s=percentile(latencies, 50),
            latency_p95_s=percentile(latencies, 95),
            stop_reason=window.reason,
            output_tokens_per_s=tokens.rate if tokens else None,
            output_tokens_per_s_ci=(tokens.low, tokens.high) if tokens else None,
            rate_check=check,
        )

    def _replica_snapshot(self) -> list[ReplicaCounts]:
        return self.replicas.snapshot() if self.replicas is not None else []

    def _count_replicas(
        self,
        window: Window,
        calls: Sequence[tuple[float, CallEnd]],
        start: list[ReplicaCounts],
        stop: list[ReplicaCounts],
    ) -> None:
        """Adds each replica's calls that ended inside the window, as the probe's
        completions are counted (bursts of calls ending together make two snapshots near
        its ends miss a few), and its times out of rotation from the looks at its ends."""
        if self.replicas is None:
            return
        inside = [end for t, end in calls if window.start < t <= window.end]
        counts = [
            after.since(before).with_calls(inside)
            for before, after in zip(start, stop, strict=True)
        ]
        if self.replica_counted is not None:
            counts = [
                now.plus(earlier) for now, earlier in zip(counts, self.replica_counted, strict=True)
            ]
        self.replica_counted = counts

    def _result(self) -> ProbeResult:
        settings, meter, windows = self.settings, self.meter, self.windows
        measured = max(self.measured_s, 1e-9)
        estimate = self.estimate
        if any(block.token_rate for block in self.blocks):  # timed in tokens
            estimate = pooled_blocks(self.blocks)
        elif estimate is None or len(windows) > 1:  # a dead server's, or several blocks
            estimate, _ = pooled_estimate(meter.done_at, windows, meter.mean_latency_s)
        in_window = [i for start, end in windows for i in _between(meter.done_at, start, end)]
        failures = [cls for t, cls in meter.failed_at if _inside(t, windows)]
        last = self.runs[-1]
        if last.reason == "server died":  # the failures that killed the probe count too
            failures += [cls for t, cls in meter.failed_at if t > last.stop]
        errors: dict[str, int] = {}
        for cls in failures:
            errors[cls] = errors.get(cls, 0) + 1
        stage_values: dict[str, list[float]] = {stage: [] for stage in STAGES}
        for i in in_window:
            for stage, seconds in stage_durations(meter.timings[i]):
                stage_values[stage].append(seconds)
        latency = {stage: StageLatency.of(values) for stage, values in stage_values.items()}
        tokens = sum(meter.tokens[i] for i in in_window)
        attempts = len(in_window) + len(failures)
        verify_busy = sum(stage_values["verify"])
        capacity = self.verifier.capacity
        mean_verify = mean(stage_values["verify"])
        client_tps = tokens / measured
        if self.blocks and all(block.token_rate for block in self.blocks):  # timed in tokens
            client_tps = sum(
                (block.output_tokens_per_s or 0.0) * block.measured_s for block in self.blocks
            ) / max(sum(block.measured_s for block in self.blocks), 1e-9)
        telemetry = _summarise_windows(self.samples, windows)
        groups = None
        if settings.group_size > 1:
            ended = [group for t, group in self.closed if _inside(t, windows)]
            groups = summarise_closed(settings.group_size, ended, measured)
        return ProbeResult(
            parallelism=settings.parallelism,
            rollouts_per_s=estimate.rate,
            rollouts_per_s_ci=(estimate.low, estimate.high),
            output_tokens_per_s=client_tps,
            error_rate=len(failures) / attempts if attempts else (1.0 if failures else 0.0),
            completed=len(in_window),
            failed=len(failures),
            measured_s=measured,
            warmup_s=sum(run.warm - run.started for run in self.runs),
            stop_reason=last.reason,
            latency_s=latency,
            errors_by_class=errors,
            rate_limited_responses=int(self.counted[0]),
            retry_after_seen=int(self.counted[1]),
            limiter_wait_share=min(1.0, self.counted[2] / (measured * settings.parallelism)),
            verifier_capacity=capacity,
            verifier_busy_fraction=verify_busy / (measured * (capacity or 1)),
            verifier_capacity_rps=(capacity or 1) / mean_verify if mean_verify else None,
            telemetry=telemetry,
            telemetry_unavailable=dict(self.unavailable),
            server_engine=self.server_engine,
            token_check=token_check(
                self.samples,
                windows,
                client_tps,
                estimate.relative_halfwidth,
                len(in_window) / measured if not self.backend.counters.tool_calls else None,
            ),
            series=[{"t": s.t, "source": s.source, **s.values} for s in self.samples],
            batches=estimate.batches,
            latency_cv=_coefficient_of_variation(stage_values["total"]),
            timeouts=int(self.counted[3]) + errors.get("timeout", 0),
            timeline=_timeline(meter.done_at, self.runs, meter.mean_latency_s),
            phases=_phases(self.runs),
            replicas=replica_stats(
                self.replica_counted, self.replicas.replicas, measured, telemetry
            )
            if self.replicas is not None and self.replica_counted is not None
            else [],
            groups=groups,
            blocks=list(self.blocks),
            tool_calls=int(self.counted[4]),
            tool_errors=int(self.counted[5]),
            stuck_tool_calls=self.stuck_tool_calls,
            retries_by_class=dict(self.retries),
        )


@dataclass(slots=True)
class EngineProbe:
    """Measures one running server at any parallelism, each probe going on through the
    tasks where the last one stopped."""

    session: aiohttp.ClientSession
    backend: ModelBackend
    verifier: Verifier
    tasks: Sequence[Task]
    base_url: str
    settings: ProbeSettings
    metrics: str | None = None  # the model server's /metrics, if not beside base_url
    max_num_seqs: int | None = None  # the server's batch limit, over its replicas, if known
    work: Iterator[WorkItem] = field(init=False)

    def __post_init__(self) -> None:
        self.work = cycle_work(self.tasks)

    async def measure(self, parallelism: int, settings: ProbeSettings | None = None) -> ProbeResult:
        settings = replace(settings or self.settings, parallelism=parallelism)
        run = ProbeRun(
            settings, self.work, self.backend, self.verifier, self.base_url, metrics=self.metrics
        )
        return await run.measure()

    async def loop(self, spec: LoopSpec, group_size: int) -> LoopSummary:
        """The RL loop's trainer stand-in beside this server (trainer.run_on_server)."""
        model = str(getattr(self.backend, "model", ""))
        identity = {
            "model": model,
            "base_url": self.base_url,
            "simulated": model.startswith("sim/"),  # the simulator's names all start so
            "output": None,
        }
        return await run_on_server(
            self.backend,
            self.verifier,
            self.session,
            self.base_url,
            self.tasks,
            spec,
            group_size,
            identity,
        )

    async def steps(self, spec: BatchSpec, group_size: int, steps: int) -> BatchSummary:
        """`steps` training steps of the tasks' groups on this server (batch.run_steps)."""
        metrics = self.metrics or metrics_url(self.base_url)
        return await run_steps(
            self.backend,
            self.verifier,
            self.session,
            metrics,
            self.tasks,
            spec,
            group_size,
            steps,
            max_num_seqs=self.max_num_seqs,
        )


@dataclass(frozen=True, slots=True)
class _Look:
    """The backend's counters and each replica's calls at one look of `_watch`."""

    t: float
    counters: tuple[float, ...]
    replicas: list[ReplicaCounts]


def _look_at(looks: Sequence[_Look], t: float) -> _Look:
    """The look nearest to `t`: where a window's counts start."""
    return min(looks, key=lambda look: abs(look.t - t))


def _snapshot(counters: Any) -> tuple[float, ...]:
    """The backend's counters the window counts: 429s, Retry-Afters, limiter waits,
    timed-out calls that were retried, tool calls and tool calls answered with an error."""
    return (
        counters.rate_limited_responses,
        counters.retry_after_seen,
        counters.limiter_wait_s,
        counters.retries.get("timeout", 0),
        counters.tool_calls,
        counters.tool_errors,
    )


def _between(done_at: Sequence[float], start: float, end: float) -> range:
    """Indices of the completions in (start, end]; `done_at` is in time order."""
    return range(bisect_right(done_at, start), bisect_right(done_at, end))


def _inside(t: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start < t <= end for start, end in windows)


def _coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Standard deviation ÷ mean: how far rollouts' latencies spread, whatever their scale."""
    average = mean(values)
    if not average or len(values) < 2:
        return None
    variance = sum((v - average) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance) / average


def _timeline(
    done_at: Sequence[float], runs: Sequence[_Run], latency_s: float
) -> list[tuple[float, float]]:
    """Rollouts/s in bins from each run's start to its drain's end, in seconds since the
    probe began (runs one after the other). A bin spans at least one mean latency, so
    the waves in which a closed loop's slots finish do not show as spikes."""
    total = sum(run.drained - run.started for run in runs)
    width = max(total / TIMELINE_BINS, latency_s, 1e-3)
    points: list[tuple[float, float]] = []
    offset = 0.0
    for run in runs:
        span = run.drained - run.started
        bins = max(1, round(span / width))
        step = span / bins
        for b in range(bins):
            low = run.started + b * step
            count = bisect_right(done_at, low + step) - bisect_right(done_at, low)
            points.append((offset + (b + 0.5) * step, count / step))
        offset += span
    return points


def _phases(runs: Sequence[_Run]) -> list[tuple[str, float, float]]:
    """Each run's warm-up, measured window and drain, in seconds since the probe began."""
    phases: list[tuple[str, float, float]] = []
    offset = 0.0
    for run in runs:
        warm, stop, drained = (t - run.started + offset for t in (run.warm, run.stop, run.drained))
        phases += [("warm-up", offset, warm), ("measured", warm, stop), ("drain", stop, drained)]
        offset = drained
    return phases


def _summarise_windows(
    samples: Sequence[Sample], windows: Sequence[tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Telemetry over several windows: means weighted by window length, the largest max,
    sample counts and counters' increases added (the gaps between windows belong to
    other probes)."""
    merged: dict[str, dict[str, float]] = {}
    weights: dict[str, float] = {}
    for start, end in windows:
        weight = max(end - start, 1e-9)
        for key, stats in summarise(samples, start, end).items():
            into = merged.setdefault(key, {})
            for stat, value in stats.items():
                if stat == "mean":
                    into[stat] = into.get(stat, 0.0) + value * weight
                elif stat == "max":
                    into[stat] = max(into.get(stat, value), value)
                else:
                    into[stat] = into.get(stat, 0.0) + value
            weights[key] = weights.get(key, 0.0) + weight
    for key, stats in merged.items():
        stats["mean"] /= weights[key]
    return merged


def _drain_limit_s(window: Window, meter: _Meter) -> float:
    """How long the rollouts in flight may take to finish: a few mean latencies. A window
    timed in tokens cancels them at once (the server aborts a request whose client left):
    they may take minutes, and the tokens of one finished rollout are all it needs."""
    if window.tokens is not None and meter.tokens:
        return 0.0
    return 5.0 + 3 * meter.mean_latency_s


async def _first_completion(run: asyncio.Task[Any], meter: _Meter, limit_s: float) -> None:
    """Until some rollout has finished (or the run ended, or `limit_s` passed)."""
    deadline = time.time() + limit_s
    while not meter.done_at and not run.done() and time.time() < deadline:
        await asyncio.wait({run}, timeout=CHECK_EVERY_S)


async def _drain(run: asyncio.Task[Any], limit_s: float, counters: Any) -> int:
    """Let the rollouts in flight finish (they are not measured), but not for ever; returns
    the tool calls still hanging when a drain of some mean latencies gave up on them (a
    drain of 0 s cancels long rollouts on purpose: none of theirs counts)."""
    done, _ = await asyncio.wait({run}, timeout=limit_s)
    stuck = 0
    if not done:
        stuck = counters.tool_calls_in_flight if limit_s > 0 else 0
        run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    if done and run.exception() is not None:
        raise run.exception()  # type: ignore[misc]
    return stuck


async def _watch(
    settings: ProbeSettings,
    meter: _Meter,
    run: asyncio.Task[Any],
    engine: Engine,
    started: float,
    look: Callable[[float], None],
    tokens: Callable[[float], Sequence[tuple[float, float]]],
    checked: Callable[[Window], tuple[RateEstimate, RateCheck]],
    watch: ProbeWatch | None = None,
) -> tuple[Window, str]:
    """Wait until `steady_window` has a window (telling `look` the time of each look, and
    `watch` how far it is), or, where rollouts are too long for one within `max_s`,
    `token_window` has; returns it and why it ended. A token window whose rate the
    completions `checked` over it contradict measures on, once, to twice `max_s`."""
    timing = settings  # the token window's limits: its max_s doubles on a disagreement
    while True:
        await asyncio.wait({run}, timeout=CHECK_EVERY_S)
        now = time.time()
        look(now)
        if run.done() or engine.stats.stopped_early:
            first = warm_until(meter.done_at, settings.parallelism, started, settings.warmup_s)
            return Window(first or started, now, "server died"), "server died"
        latency = meter.mean_latency_s
        if watch is not None:
            watch(probe_status(meter.done_at, settings, started, now, latency))
        window = steady_window(
            meter.done_at, settings, started=started, now=now, mean_latency_s=latency
        )
        if window is not None and window.reason == "time cap":
            cap_end = window.start + settings.cap_s(latency)
            if now > cap_end:  # a late look (a starved loop): the window ends at its cap
                window = (
                    steady_window(
                        meter.done_at,
                        settings,
                        started=started,
                        now=cap_end,
                        mean_latency_s=latency,
                    )
                    or window
                )
        points = tokens(now) if settings.in_tokens else []
        if (
            (window is None or window.reason == "time cap")
            and len(points) > 1
            and long_rollouts(settings, started, now, latency)
        ):
            timed = token_window(points, timing, started=started, now=now)
            if timed is not None:
                capped = timing is not settings and timed.reason.startswith("time cap")
                if capped or checked(timed)[1].agree:
                    return timed, timed.reason
                timing = replace(settings, max_s=2 * settings.max_s)  # they disagree: measure on
            if now - started < 2 * timing.max_s:  # tokens warming up, or measuring on: not yet
                window = None
        if window is not None:
            return window, window.reason


def _in_tokens(rate: RateEstimate, counters: Any, *, in_pieces: bool) -> RateEstimate:
    """A window's counter rate in the tokens the server's usage counts: streamed pieces
    scaled by the pieces an ended answer had a token (one, on most servers)."""
    if not in_pieces or not counters.ended_pieces or not counters.ended_tokens:
        return rate
    return in_rollouts(rate, counters.ended_pieces / counters.ended_tokens)


def _checked(
    window: Window, meter: _Meter, counters: Any, parallelism: int, *, in_pieces: bool
) -> tuple[RateEstimate, RateCheck]:
    """A window timed in tokens as rollouts/s (by the tokens a finished rollout had, its
    interval widened by how much their lengths vary), and the completions counted over it
    in whole rounds of `parallelism` beside that (`reconcile`)."""
    assert window.tokens is not None
    per_rollout = sum(meter.tokens) / len(meter.tokens) if meter.tokens else None
    tokens = _in_tokens(window.tokens, counters, in_pieces=in_pieces)
    counted = counted_in_rounds(
        meter.done_at, window.start, window.end, parallelism, meter.mean_latency_s
    )
    return reconcile(in_rollouts(tokens, per_rollout, length_spread(meter.tokens)), counted)
