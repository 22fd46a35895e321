"""`autotune collect`: tasks → model server → verifier → rewarded rollouts on disk.

With no base URL the target is the embedded simulated vLLM-like server, started as a
subprocess (so it runs on the other core, not on the client's event loop).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from autotune.backends.openai import OpenAIBackend
from autotune.config import CollectConfig
from autotune.engine import Engine, EngineObserver, RunStats
from autotune.errors import CollectionError
from autotune.pipeline import open_pipeline
from autotune.results import CollectSummary
from autotune.store import RolloutSink
from autotune.target import Target
from autotune.workload import Workload, rollout_key, work_items

log = logging.getLogger("autotune")

SIM_DEFAULT_ARGS = ("--time-scale", "1.0")


class Progress(EngineObserver, Protocol):
    """The CLI's progress bar: told the total, then of every finished rollout."""

    def set_total(self, total: int) -> None: ...


async def collect(config: CollectConfig, progress: Progress | None = None) -> CollectSummary:
    """Runs one collection to the end (or until the server dies) and summarises it."""
    workload = Workload(
        config.input, config.synthetic, config.limit, config.num_repeats, config.shard
    )
    workload.validate()
    start, stop = workload.task_range()
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
    try:
        async with open_pipeline(config, SIM_DEFAULT_ARGS) as pipeline:
            if progress is not None:
                progress.set_total(todo)
            engine = Engine(
                pipeline.backend,
                pipeline.verifier,
                sink,
                parallelism=max(1, min(parallelism, todo)),
                observer=progress,
                extra_row_fields={"simulated": True} if pipeline.target.simulated else None,
            )
            try:
                stats = await engine.run(work_items(workload, start, stop, sink.done))
            except OSError as error:  # the rollout file cannot take another row
                raise CollectionError(
                    f"cannot write rollouts to {config.output} ({error.strerror or error}); "
                    "every row written so far is kept: free space and rerun with --resume."
                ) from None
    finally:
        sink.close()
    summary = _summarise(stats, pipeline.backend, pipeline.target, config, skipped)
    if stats.stopped_early:
        where = f"; {stats.completed} rollouts are kept in {config.output}" if config.output else ""
        raise CollectionError(
            f"collection stopped: {stats.stopped_early}{where}; "
            "restart the server and rerun with --resume."
        )
    return summary


def _summarise(
    stats: RunStats,
    backend: OpenAIBackend,
    target: Target,
    config: CollectConfig,
    skipped: int,
) -> CollectSummary:
    elapsed = stats.elapsed_s
    return CollectSummary(
        completed=stats.completed,
        failed=stats.failed,
        skipped=skipped,
        elapsed_s=elapsed,
        rollouts_per_s=stats.completed / elapsed,
        output_tokens_per_s=stats.output_tokens / elapsed,
        input_tokens=stats.input_tokens,
        output_tokens=stats.output_tokens,
        mean_reward=stats.reward_sum / stats.reward_count if stats.reward_count else None,
        latency_s=stats.samples.summarise(),
        errors_by_class=dict(stats.errors_by_class),
        retries_by_class=dict(backend.counters.retries),
        parallelism=config.parallelism,
        model=target.model,
        base_url=target.base_url,
        simulated=target.simulated,
        output=str(config.output) if config.output else None,
    )


def run_async(coro: Any) -> Any:
    """Runs a coroutine on uvloop where available (a faster loop for the client)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_collect(config: CollectConfig, progress: Progress | None = None) -> CollectSummary:
    """Synchronous entry point (benchmarks, tests, the CLI)."""
    return run_async(collect(config, progress))
