"""`autotune diagnose`: a low and a high parallelism probe of one workload, measured in
alternating blocks, then a verdict from `classify`, saved as JSON.
Why: docs/design/diagnose.md.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from autotune.config.collection import (
    HIGH_PARALLELISM,
    LOW_PARALLELISM,
    PROBE_DEFAULTS,
    CollectConfig,
)
from autotune.diagnose.checks import speedup_interval
from autotune.diagnose.classify import classify, tail_bound
from autotune.errors import CollectionError, UsageError
from autotune.probe import ProbeSettings
from autotune.probe.command_probe import rollouts_per_run, run_command_probe
from autotune.probe.realtime import ProbeRun, cycle_work
from autotune.probe.status import ProbeStatus
from autotune.probe.timescale import in_simulated_time
from autotune.results.codec import machine_identity
from autotune.results.diagnosis import (
    DiagnoseResult,
    DiagnoseSettings,
    DiagnoseTarget,
    DiagnoseWorkload,
    Thresholds,
)
from autotune.results.probes import ProbeResult
from autotune.results.runs import BatchSummary
from autotune.rl.batch import run_steps
from autotune.rollout.pipeline import Pipeline, open_pipeline
from autotune.rollout.workload import Task, Workload
from autotune.stats import RatioInterval
from autotune.telemetry.prometheus import metrics_url

# The embedded default runs 20× faster than real time, so a diagnosis takes seconds;
# its figures are converted to simulated time (probe.timescale).
SIM_DEFAULT_ARGS = ("--time-scale", "0.05")
# The first pass measures each probe in ROUNDS blocks, pooled to ±15%: enough when the
# speedup lies far from a threshold (×1 or ×4 against ×2), and quick to reach even on a
# busy real server. Near a threshold more rounds follow, each block up to --max-s ÷
# ROUNDS, until the verdict is decided or a probe has measured EXTEND_UNTIL of --max-s.
ROUNDS = 2
FIRST_PASS_HALFWIDTH = 0.15
EXTEND_UNTIL = 0.95
BLOCKS = 2 * ROUNDS  # the first pass's blocks, for a progress display
DiagnoseWatch = Callable[[int, ProbeStatus], None]  # (which block, its status): progress


@dataclass(frozen=True, slots=True)
class DiagnoseConfig:
    """The workload and target (as for collect), the two parallelisms, and the rules."""

    collect: CollectConfig
    low: int = LOW_PARALLELISM
    high: int = HIGH_PARALLELISM
    min_s: float = PROBE_DEFAULTS.min_s
    max_s: float = PROBE_DEFAULTS.max_s
    target_halfwidth: float = FIRST_PASS_HALFWIDTH
    thresholds: Thresholds = field(default_factory=Thresholds)
    command: str | None = None  # the user's own collector instead of autotune's engine

    def __post_init__(self) -> None:
        if not 1 <= self.low < self.high:
            raise UsageError(f"--low {self.low} must be at least 1 and below --high {self.high}.")
        if self.command is not None and self.collect.target.agent_url is not None:
            raise UsageError(
                "--command and --agent-url each name the collector to diagnose; pass one."
            )


async def diagnose(config: DiagnoseConfig, watch: DiagnoseWatch | None = None) -> DiagnoseResult:
    """Runs both probes in alternating blocks (more rounds while the speedup's interval
    straddles the threshold) and returns what diagnose.json saves; `watch` is told each
    block's progress (its index first, in the order measured)."""
    if config.command is not None:
        return await _diagnose_command(config, config.command, watch)
    collect = config.collect
    workload = Workload(
        collect.input, collect.synthetic, collect.limit, collect.num_repeats, collect.shard
    )
    # One pass through the tasks for all probes: a prompt the server has just cached for
    # one probe is not sent again by the next (which would flatter the prefix cache).
    tasks = workload.probe_tasks()
    work = cycle_work(tasks)
    began = time.time()
    async with open_pipeline(collect, SIM_DEFAULT_ARGS) as pipeline:
        target, target_config = pipeline.target, pipeline.target_config
        runs = [
            ProbeRun(
                ProbeSettings(
                    parallelism=parallelism,
                    min_s=config.min_s / ROUNDS,
                    max_s=config.max_s,
                    # ROUNDS blocks at this precision pool to the target's
                    target_halfwidth=config.target_halfwidth * ROUNDS**0.5,
                    group_size=collect.num_repeats,
                    in_tokens=True,
                ),
                work,
                pipeline.backend,
                pipeline.verifier,
                target.base_url,
                metrics=target_config.metrics_url,
            )
            for parallelism in (config.low, config.high)
        ]
        probes = await _measure_in_rounds(config, runs, watch)
        batch = await _batch_probe(collect, pipeline, tasks) if collect.batch else None
    scale = target.time_scale if target.simulated else None
    if scale:
        probes = [in_simulated_time(probe, scale, began) for probe in probes]
    target_record = DiagnoseTarget(
        base_url=target.base_url,
        model=target.model,
        simulated=target.simulated,
        api=target_config.api,
        stream=target_config.stream,
        time_scale=scale,
    )
    workload_record = DiagnoseWorkload(
        input=str(collect.input) if collect.input else None,
        tasks=len(tasks) // collect.num_repeats,
        num_repeats=collect.num_repeats,
        verifier=collect.verifier,
        verifier_workers=collect.verifier_workers,
    )
    return _saved(config, probes, target_record, workload_record, batch)


async def _batch_probe(
    collect: CollectConfig, pipeline: Pipeline, tasks: list[Task]
) -> BatchSummary:
    """Training steps of the workload's groups, as a synchronous trainer makes them
    (`collect --batch-groups`): what the tail-bound rule reads."""
    assert collect.batch is not None
    return await run_steps(
        pipeline.backend,
        pipeline.verifier,
        pipeline.session,
        pipeline.target_config.metrics_url or metrics_url(pipeline.target.base_url),
        tasks,
        collect.batch,
        collect.num_repeats,
        PROBE_DEFAULTS.steps,
        collect.parallelism,
        collect.target.total_max_num_seqs,
    )


async def _measure_in_rounds(
    config: DiagnoseConfig, runs: list[ProbeRun], watch: DiagnoseWatch | None
) -> list[ProbeResult]:
    """Low and high blocks in turn, each up to `max_s` ÷ ROUNDS: ROUNDS rounds (fewer if
    the server dies), then more while the verdict is `inconclusive` and a narrower
    interval could still change that (the speedup's interval neither clears the
    threshold's margin nor lies inside it), until a probe has measured EXTEND_UNTIL of
    `max_s`."""
    zone = config.thresholds.undecided_zone(config.high / config.low)
    probes: list[ProbeResult] = []
    rounds = 0
    while True:
        for index, run in enumerate(runs):
            block_s = min(config.max_s - run.measured_s, config.max_s / ROUNDS)
            run.watch = None if watch is None else partial(watch, 2 * rounds + index)
            probe = await run.measure(max_s=block_s)
            if rounds == 0 and index == 0 and not run.meter.done_at:  # none, drain included
                raise CollectionError(
                    f"no rollout completed at parallelism {config.low} "
                    f"({_errors(run.meter.failed_at)}); check the server and the "
                    "workload with `autotune collect --limit 5` first."
                )
            probes[index : index + 1] = [probe]
        rounds += 1
        if any(probe.stop_reason == "server died" for probe in probes):
            return probes
        if rounds < ROUNDS:
            continue
        if any(run.measured_s >= EXTEND_UNTIL * config.max_s for run in runs):
            return probes
        verdict = classify(probes[0], probes[1], config.thresholds).verdict
        if verdict != "inconclusive" or _decided(speedup_interval(probes[0], probes[1]), zone):
            return probes


def _decided(interval: RatioInterval, zone: tuple[float, float]) -> bool:
    """The speedup's interval clears the threshold's margin, or lies inside it (where no
    precision could move it to either side): the verdict needs no more measuring."""
    below, above = zone
    return (
        interval.high < below
        or interval.low >= above
        or below <= interval.low <= interval.high <= above
    )


async def _diagnose_command(
    config: DiagnoseConfig, template: str, watch: DiagnoseWatch | None
) -> DiagnoseResult:
    """Both probes run the user's collector command; its rows are timed as they land."""
    workdir = Path(tempfile.mkdtemp(prefix="autotune-command-"))
    probes = []
    for index, parallelism in enumerate((config.low, config.high)):
        if watch is not None:  # its rows are timed once it has finished
            status = ProbeStatus(
                "running the command", parallelism, 0, 0.0, config.max_s, config.target_halfwidth
            )
            watch(index, status)
        limit = rollouts_per_run(config.collect.limit, parallelism)
        probes.append(await run_command_probe(template, parallelism, limit, workdir))
    shutil.rmtree(workdir)  # kept when a run failed: the error names its log there
    target = DiagnoseTarget(base_url=None, model=None, simulated=False, command=template)
    return _saved(config, probes, target, DiagnoseWorkload(input=None, tasks=limit))


def _saved(
    config: DiagnoseConfig,
    probes: list[ProbeResult],
    target: DiagnoseTarget,
    workload: DiagnoseWorkload,
    batch: BatchSummary | None = None,
) -> DiagnoseResult:
    """The verdict for the probe pair (and the batch steps, when measured) and everything
    needed to rebuild its report."""
    verdict = classify(probes[0], probes[1], config.thresholds)
    if batch is not None:
        verdict = tail_bound(batch, verdict, config.thresholds)
    return DiagnoseResult(
        created_at=time.time(),
        verdict=verdict,
        probes=probes,
        target=target,
        workload=workload,
        settings=DiagnoseSettings(
            low=config.low,
            high=config.high,
            min_s=config.min_s,
            max_s=config.max_s,
            target_halfwidth=config.target_halfwidth,
            thresholds=config.thresholds,
        ),
        machine=machine_identity(),
        batch=batch,
    )


def _errors(failed_at: list[tuple[float, str]]) -> str:
    """Every failure of the run, warm-up and drain included: with none completed, the
    failures are the only evidence, wherever they fell."""
    errors = Counter(failure_class for _, failure_class in failed_at)
    return ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "no error recorded"
