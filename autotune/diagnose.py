"""`autotune diagnose`: a low and a high parallelism probe of one workload → a verdict.

Both probes run the same tasks with the same output limits against the same server,
so they differ only in parallelism. The verdict comes from `classify`, from what was
measured; the result is saved as JSON and every report is rebuilt from that file.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from autotune.classify import classify
from autotune.config import PROBE_DEFAULTS, CollectConfig
from autotune.errors import CollectionError, UsageError
from autotune.pipeline import open_pipeline
from autotune.probe import ProbeSettings
from autotune.probe.command import run_command_probe
from autotune.probe.engine import run_probe
from autotune.results import (
    DiagnoseResult,
    DiagnoseSettings,
    DiagnoseTarget,
    DiagnoseWorkload,
    ProbeResult,
    Thresholds,
    machine_identity,
    save,
)
from autotune.workload import Workload

# The embedded default runs 20× faster than real time, so a diagnosis takes seconds.
SIM_DEFAULT_ARGS = ("--time-scale", "0.05")
RESULT_FILE = "diagnose.json"
COMMAND_LIMIT_PER_SLOT = 10  # a --command run's default {limit}: 10 rollouts per high slot


@dataclass(frozen=True, slots=True)
class DiagnoseConfig:
    """The workload and target (as for collect), the two parallelisms, and the rules."""

    collect: CollectConfig
    low: int = 5
    high: int = 20
    min_s: float = PROBE_DEFAULTS.min_s
    max_s: float = PROBE_DEFAULTS.max_s
    target_halfwidth: float = PROBE_DEFAULTS.target_halfwidth
    thresholds: Thresholds = field(default_factory=Thresholds)
    command: str | None = None  # the user's own collector instead of autotune's engine

    def __post_init__(self) -> None:
        if not 1 <= self.low < self.high:
            raise UsageError(f"--low {self.low} must be at least 1 and below --high {self.high}.")


async def diagnose(config: DiagnoseConfig) -> DiagnoseResult:
    """Runs both probes and returns what RESULT_FILE saves."""
    if config.command is not None:
        return await _diagnose_command(config, config.command)
    collect = config.collect
    workload = Workload(collect.input, collect.synthetic, collect.limit, 1, collect.shard)
    tasks = workload.probe_tasks()
    async with open_pipeline(collect, SIM_DEFAULT_ARGS) as pipeline:
        target, target_config = pipeline.target, pipeline.target_config
        probes = []
        for parallelism in (config.low, config.high):
            settings = ProbeSettings(
                parallelism=parallelism,
                min_s=config.min_s,
                max_s=config.max_s,
                target_halfwidth=config.target_halfwidth,
            )
            probe = await run_probe(
                settings,
                tasks,
                pipeline.backend,
                pipeline.verifier,
                pipeline.session,
                target.base_url,
            )
            probes.append(probe)
            if parallelism == config.low and probe.completed == 0:
                raise CollectionError(
                    f"no rollout completed at parallelism {parallelism} "
                    f"({_errors(probe.errors_by_class)}); check the server and the "
                    "workload with `autotune collect --limit 5` first."
                )
    target_record = DiagnoseTarget(
        base_url=target.base_url,
        model=target.model,
        simulated=target.simulated,
        api=target_config.api,
        stream=target_config.stream,
    )
    workload_record = DiagnoseWorkload(
        input=str(collect.input) if collect.input else None,
        tasks=len(tasks),
        verifier=collect.verifier,
        verifier_workers=collect.verifier_workers,
    )
    return _saved(config, probes, target_record, workload_record)


async def _diagnose_command(config: DiagnoseConfig, template: str) -> DiagnoseResult:
    """Both probes run the user's collector command; its rows are timed as they land."""
    limit = config.collect.limit or COMMAND_LIMIT_PER_SLOT * config.high
    workdir = Path(tempfile.mkdtemp(prefix="autotune-command-"))
    probes = [
        await run_command_probe(template, parallelism, limit, workdir)
        for parallelism in (config.low, config.high)
    ]
    shutil.rmtree(workdir)  # kept when a run failed: the error names its log there
    target = DiagnoseTarget(base_url=None, model=None, simulated=False, command=template)
    return _saved(config, probes, target, DiagnoseWorkload(input=None, tasks=limit))


def _saved(
    config: DiagnoseConfig,
    probes: list[ProbeResult],
    target: DiagnoseTarget,
    workload: DiagnoseWorkload,
) -> DiagnoseResult:
    """The verdict for the probe pair and everything needed to rebuild its report."""
    return DiagnoseResult(
        created_at=time.time(),
        verdict=classify(probes[0], probes[1], config.thresholds),
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
    )


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "no error recorded"


def write_outputs(result: DiagnoseResult, directory: Path) -> list[Path]:
    """diagnose.json, then index.html rebuilt from it (also what `autotune report` calls)."""
    from autotune.report import diagnose_report

    saved = save(result, directory / RESULT_FILE)
    return [saved, diagnose_report.write(result, directory)]
