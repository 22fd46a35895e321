"""`autotune collect`: tasks → model server → verifier → rewarded rollouts on disk.

With no base URL the target is the embedded simulated vLLM-like server, started as a
subprocess (so it runs on the other core, not on the client's event loop).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

import aiohttp

from autotune.config.collection import CollectConfig
from autotune.errors import CollectionError
from autotune.live import load_expectation, open_monitor
from autotune.live.figures import Sources
from autotune.live.monitor import REPORT_EVERY_S, LiveMonitor
from autotune.processes.event_loop import run_async
from autotune.report.collect_report import write_outputs
from autotune.results.codec import machine_identity
from autotune.results.runs import CollectResult, CollectSummary, Expectation
from autotune.results.stages import ReplicaStats
from autotune.rl.batch import BatchRunner
from autotune.rl.groups import GroupTracker
from autotune.rollout.engine import Engine, EngineObserver
from autotune.rollout.pipeline import open_pipeline
from autotune.rollout.replicas import ReplicaSet, replica_stats, several
from autotune.rollout.store import RolloutSink, check_run, failures_path, run_record, save_run
from autotune.rollout.target import Target
from autotune.rollout.workload import Workload, rollout_key, work_items
from autotune.telemetry import Sample, summarise
from autotune.telemetry.prometheus import PrometheusSampler, metrics_url
from autotune.telemetry.summary import COUNTER_SUFFIXES

log = logging.getLogger("autotune")

T = TypeVar("T")


class Progress(EngineObserver, Protocol):
    """The CLI's progress bar: told the total, then of every finished rollout."""

    def set_total(self, total: int) -> None: ...

    def write(self, line: str) -> None:
        """A line for the person watching (above the bar)."""
        ...


async def collect(config: CollectConfig, progress: Progress | None = None) -> CollectSummary:
    """Runs one collection to the end (or until the server dies) and summarises it."""
    workload = Workload(
        config.input, config.synthetic, config.limit, config.num_repeats, config.shard
    )
    workload.validate()
    expectation = load_expectation(config.live)  # a bad --expect file: refused before any write
    say = progress.write if progress is not None else _stderr_line
    async with open_monitor(config, expectation, say) as monitor:  # so is a port in use
        return await _collect(config, workload, progress, monitor)


async def _collect(
    config: CollectConfig, workload: Workload, progress: Progress | None, monitor: LiveMonitor
) -> CollectSummary:
    start, stop = workload.task_range()
    run = run_record(config)
    if config.resume and config.output is not None:
        check_run(config.output, run)  # before the sink cuts a tail: refuse untouched
    sink = RolloutSink(config.output, config.resume)
    repeats = config.num_repeats
    skipped = sum(
        1
        for task_index in range(start, stop)
        for rollout_index in range(repeats)
        if rollout_key(task_index, rollout_index) in sink.done
    )
    parallelism = config.parallelism
    if parallelism is None:
        parallelism = config.target.pool_limit
        log.warning(
            "no --parallelism: unlimited, as in NeMo Gym (bounded only by the %d-connection pool)",
            parallelism,
        )
    todo = (stop - start) * repeats - skipped
    live = config.live
    _check_expectation(monitor.expectation, parallelism)
    try:
        async with open_pipeline(config, metered=live.enabled) as pipeline:
            if config.output is not None:  # the model is known only now
                run["model"] = pipeline.target.model
                if config.resume:
                    check_run(config.output, run)
                save_run(config.output, run)
            if progress is not None:
                progress.set_total(todo)
            slots = max(1, min(parallelism, todo))
            groups = GroupTracker(repeats) if _tracks_groups(config) else None
            engine = Engine(
                pipeline.backend,
                pipeline.verifier,
                sink,
                parallelism=slots,
                observer=monitor.observer(progress),
                extra_row_fields={"simulated": True} if pipeline.target.simulated else None,
                adaptive_concurrency=config.adaptive_concurrency and config.batch is None,
                groups=groups,
            )
            sources = Sources.of(engine, pipeline, todo)
            monitor.attach(sources, pipeline, slots)
            counters = ReplicaCounters(pipeline.session, pipeline.backend.counters.replicas)
            await counters.start()
            items = work_items(workload, start, stop, sink.done)
            batch = None
            try:
                if config.batch is None:
                    stats = await engine.run(items)
                else:
                    sampler = PrometheusSampler(
                        pipeline.session,
                        _metrics_urls(pipeline.target, pipeline.backend.counters.replicas),
                    )
                    runner = BatchRunner(
                        engine,
                        config.batch,
                        repeats,
                        config.parallelism,
                        sampler,
                        config.target.total_max_num_seqs,
                    )
                    batch = await runner.run(items)
                    stats = engine.stats
            except OSError as error:  # the rollout file cannot take another row
                raise CollectionError(
                    f"cannot write rollouts to {config.output} ({error.strerror or error}); "
                    "every row written so far is kept: free space and rerun with --resume."
                ) from None
            replicas = await counters.finish(stats.elapsed_s)
    finally:
        sink.close()
    summary = _summarise(sources, pipeline.target, config, skipped)
    summary = replace(
        summary,
        replicas=replicas,
        groups=groups.summary(stats.elapsed_s) if groups is not None and repeats > 1 else None,
        batch=batch,
    )
    summary = await monitor.finish(summary)
    if live.report is not None:
        _write_report(live.report, summary, monitor, config)
    await monitor.linger()
    if stats.stopped_early:
        where = f"; {stats.completed} rollouts are kept in {config.output}" if config.output else ""
        raise CollectionError(
            f"collection stopped: {stats.stopped_early}{where}; "
            "restart the server and rerun with --resume."
        )
    return summary


class ReplicaCounters:
    """Each replica's share of a whole run, when several serve the model: the calls the
    client made to it, and its /metrics counters (tokens, preemptions, prefix-cache hits)
    read at the start and at the end."""

    def __init__(self, session: aiohttp.ClientSession, replicas: ReplicaSet | None) -> None:
        self._replicas = several(replicas)
        urls = [metrics_url(r.url) for r in self._replicas.replicas] if self._replicas else []
        self._sampler = PrometheusSampler(session, urls, timeout_s=5.0)
        self._samples: list[Sample] = []

    async def start(self) -> None:
        if self._replicas is not None:
            await self._read()

    async def finish(self, elapsed_s: float) -> list[ReplicaStats]:
        if self._replicas is None:
            return []
        await self._read()
        counters = {
            key: stats
            for key, stats in summarise(self._samples, -math.inf, math.inf).items()
            if key.endswith(COUNTER_SUFFIXES)  # two readings make no gauge's mean
        }
        replicas = self._replicas.replicas
        return replica_stats(self._replicas.snapshot(), replicas, elapsed_s, counters)

    async def _read(self) -> None:
        values = await self._sampler.sample()
        if values is not None:
            self._samples.append(Sample(time.time(), PrometheusSampler.name, values))


def _tracks_groups(config: CollectConfig) -> bool:
    return config.batch is not None or (config.num_repeats > 1 and config.track_groups)


def _metrics_urls(target: Target, replicas: ReplicaSet | None) -> list[str]:
    """The model server's /metrics: every replica's when several serve it."""
    chosen = several(replicas)
    if chosen is not None:
        return [metrics_url(replica.url) for replica in chosen.replicas]
    return [metrics_url(target.base_url)]


def _stderr_line(line: str) -> None:
    log.warning(line.removeprefix("autotune: "))


def _check_expectation(expectation: Expectation | None, parallelism: int) -> None:
    """A recommendation's interval holds at its own parallelism: say so if this run differs."""
    if expectation is not None and expectation.parallelism not in (None, parallelism):
        log.warning(
            "the expectation (%s) was measured at parallelism %d and this run uses %d: "
            "the drift watch compares unlike runs (pass --parallelism %d)",
            expectation.source,
            expectation.parallelism,
            parallelism,
            expectation.parallelism,
        )


def _write_report(
    directory: Path, summary: CollectSummary, monitor: LiveMonitor, config: CollectConfig
) -> None:
    """collect.json and the HTML page rebuilt from it; a write that fails is one sentence."""
    live, watch = config.live, monitor.watch
    result = CollectResult(
        created_at=time.time(),
        summary=summary,
        samples=monitor.samples,
        expectation=monitor.expectation,
        drift=watch.warning if watch is not None else None,
        drift_windows_counted=watch.counted if watch is not None else 0,
        settings={
            "sample_every_s": live.stats_every_s or REPORT_EVERY_S,
            "drift_window_s": watch.window_s if watch is not None else live.drift_window_s,
            "drift_windows": live.drift_windows,
        },
        machine=machine_identity(),
    )
    try:
        write_outputs(result, directory)
    except OSError as error:
        kept = f"the rollouts are kept in {config.output}" if config.output else "nothing is lost"
        raise CollectionError(
            f"could not write the report to {directory} ({error.strerror or error}); {kept}: "
            "free space or pick another --report folder."
        ) from None


def failure_gate(summary: CollectSummary, max_failure_rate: float) -> str | None:
    """Why a finished run fails its gate (none succeeded, or a larger share failed than
    `max_failure_rate`), as one sentence; None when it passes."""
    attempted = summary.completed + summary.failed
    if not summary.failed or (summary.completed and summary.failed / attempted <= max_failure_rate):
        return None
    classes = ", ".join(f"{name} {n:,}" for name, n in sorted(summary.errors_by_class.items()))
    if summary.completed:
        share = f"{summary.failed / attempted:.0%}, above --max-failure-rate {max_failure_rate:g}"
    else:
        share = "none succeeded"
    failed = f"{summary.failed:,} of {attempted:,} rollouts failed ({share}; {classes})"
    if summary.output is None:
        return f"{failed}; none was kept (--no-output): drop it to keep each failure's cause."
    kept = summary.completed + summary.skipped
    where = f"keeps the {kept:,} rollouts collected" if kept else "holds no rollout yet"
    failures = failures_path(Path(summary.output))
    return (
        f"{failed}; {summary.output} {where}, and each failure's cause is in {failures}: "
        "fix it and rerun with --resume."
    )


def _summarise(
    sources: Sources, target: Target, config: CollectConfig, skipped: int
) -> CollectSummary:
    """The closing summary: the totals every stats line and /metrics scrape report
    (Sources.totals), with the run's rates, latency percentiles and limiter history."""
    totals = sources.totals()
    elapsed = sources.stats.elapsed_s
    limiter = sources.limiter
    return CollectSummary(
        completed=totals.completed,
        failed=totals.failed,
        skipped=skipped,
        elapsed_s=elapsed,
        rollouts_per_s=totals.completed / elapsed,
        output_tokens_per_s=totals.output_tokens / elapsed,
        input_tokens=totals.input_tokens,
        output_tokens=totals.output_tokens,
        mean_reward=totals.mean_reward,
        latency_s=sources.stats.samples.summarise(),
        errors_by_class=totals.errors_by_class,
        retries_by_class=totals.retries_by_class,
        parallelism=config.parallelism,
        model=target.model,
        base_url=target.base_url,
        simulated=target.simulated,
        output=str(config.output) if config.output else None,
        rate_limited_responses=totals.rate_limited_responses,
        concurrency_decreases=limiter.decreases if limiter else 0,
        concurrency_limit_min=limiter.lowest if limiter else None,
        concurrency_limit_final=totals.concurrency_limit,
        cancelled=totals.cancelled,
        tool_calls=sources.counters.tool_calls,
        tool_errors=sources.counters.tool_errors,
        tool_errors_treatment=config.tool_errors if config.tools is not None else None,
    )


def run_collect(config: CollectConfig, progress: Progress | None = None) -> CollectSummary:
    """Synchronous entry point (benchmarks, tests, the CLI)."""
    return run_async(collect(config, progress))
