"""`autotune diagnose`: a low and a high parallelism probe of one workload → a verdict.

Both probes run the same tasks with the same output limits against the same server,
so they differ only in parallelism. The verdict comes from `classify`, from what was
measured; the result is saved as JSON and every report is rebuilt from that file.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from autotune import __version__
from autotune.classify import Thresholds, classify
from autotune.config import CollectConfig
from autotune.errors import CollectionError, UsageError
from autotune.pipeline import open_pipeline
from autotune.probe import ProbeSettings, run_probe
from autotune.results import SCHEMA_VERSION
from autotune.workload import Workload

# The embedded default runs 20× faster than real time, so a diagnosis takes seconds.
SIM_DEFAULT_ARGS = ("--time-scale", "0.05")
RESULT_FILE = "diagnose.json"


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

    def __post_init__(self) -> None:
        if not 1 <= self.low < self.high:
            raise UsageError(f"--low {self.low} must be at least 1 and below --high {self.high}.")


async def diagnose(config: DiagnoseConfig) -> dict[str, Any]:
    """Runs both probes and returns the saved-result dict (see RESULT_FILE)."""
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
    verdict = classify(probes[0], probes[1], config.thresholds)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "diagnose",
        "created_at": time.time(),
        **verdict.to_dict(),
        "probes": [probe.to_dict() for probe in probes],
        "target": {
            "base_url": target.base_url,
            "model": target.model,
            "simulated": target.simulated,
            "api": target_config.api,
            "stream": target_config.stream,
        },
        "workload": {
            "input": str(collect.input) if collect.input else None,
            "tasks": len(tasks),
            "verifier": collect.verifier,
            "verifier_workers": collect.verifier_workers,
        },
        "settings": {
            "low": config.low,
            "high": config.high,
            "min_s": config.min_s,
            "max_s": config.max_s,
            "target_halfwidth": config.target_halfwidth,
            "thresholds": asdict(config.thresholds),
        },
        "machine": {
            "host": platform.node(),
            "python": platform.python_version(),
            "autotune": __version__,
        },
    }


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "no error recorded"


def save_result(result: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILE
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return path
