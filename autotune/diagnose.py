"""`autotune diagnose`: a low and a high parallelism probe of one workload → a verdict.

Both probes run the same tasks with the same output limits against the same server,
so they differ only in parallelism. The verdict comes from `classify`, from what was
measured; the result is saved as JSON and every report is rebuilt from that file.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from autotune.classify import Thresholds, classify
from autotune.config import CollectConfig
from autotune.errors import CollectionError, UsageError
from autotune.pipeline import open_pipeline
from autotune.probe import ProbeResult, ProbeSettings, run_probe
from autotune.results import SCHEMA_VERSION, machine_identity
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
    min_s: float = 3.0
    max_s: float = 20.0
    target_halfwidth: float = 0.05
    thresholds: Thresholds = field(default_factory=Thresholds)
    command: str | None = None  # the user's own collector instead of autotune's engine

    def __post_init__(self) -> None:
        if not 1 <= self.low < self.high:
            raise UsageError(f"--low {self.low} must be at least 1 and below --high {self.high}.")


async def diagnose(config: DiagnoseConfig) -> dict[str, Any]:
    """Runs both probes and returns the saved-result dict (see RESULT_FILE)."""
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
    target_record = {
        "base_url": target.base_url,
        "model": target.model,
        "simulated": target.simulated,
        "api": target_config.api,
        "stream": target_config.stream,
    }
    workload_record = {
        "input": str(collect.input) if collect.input else None,
        "tasks": len(tasks),
        "verifier": collect.verifier,
        "verifier_workers": collect.verifier_workers,
    }
    return _saved(config, probes, target_record, workload_record)


async def _diagnose_command(config: DiagnoseConfig, template: str) -> dict[str, Any]:
    """Both probes run the user's collector command; its rows are timed as they land."""
    from autotune.servers.command import run_command_probe

    limit = config.collect.limit or COMMAND_LIMIT_PER_SLOT * config.high
    workdir = Path(tempfile.mkdtemp(prefix="autotune-command-"))
    probes = [
        await run_command_probe(template, parallelism, limit, workdir)
        for parallelism in (config.low, config.high)
    ]
    shutil.rmtree(workdir)  # kept when a run failed: the error names its log there
    # The same keys as an engine diagnosis has (reports read them); what a command
    # hides from autotune is None.
    target_record = {
        "command": template,
        "base_url": None,
        "model": None,
        "simulated": False,
        "api": None,
        "stream": None,
    }
    workload_record = {"input": None, "tasks": limit, "verifier": None, "verifier_workers": None}
    return _saved(config, probes, target_record, workload_record)


def _saved(
    config: DiagnoseConfig,
    probes: list[ProbeResult],
    target: dict[str, Any],
    workload: dict[str, Any],
) -> dict[str, Any]:
    """The verdict for the probe pair and everything needed to rebuild its report."""
    verdict = classify(probes[0], probes[1], config.thresholds)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "diagnose",
        "created_at": time.time(),
        **verdict.to_dict(),
        "probes": [probe.to_dict() for probe in probes],
        "target": target,
        "workload": workload,
        "settings": {
            "low": config.low,
            "high": config.high,
            "min_s": config.min_s,
            "max_s": config.max_s,
            "target_halfwidth": config.target_halfwidth,
            "thresholds": asdict(config.thresholds),
        },
        "machine": machine_identity(),
    }


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "no error recorded"


def save_result(result: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILE
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return path
