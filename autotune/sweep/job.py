"""`autotune sweep STUDY.yaml`: run (or resume) a study, then save what it found.

Outputs in `reports/<study>/`: `sweep.json` (the SweepResult), and, rebuilt from it
alone by `write_outputs` (also what `autotune report DIR` calls): `index.html`,
`trials.csv`, `recommendation.json` and `recommendation.yaml`.
"""

from __future__ import annotations

import csv
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from autotune.config import Study
from autotune.results import SweepResult, machine_identity, save, to_json
from autotune.sweep.curve import Launcher, TrialOutcome
from autotune.sweep.launchers import command_launcher, http_launcher
from autotune.sweep.recommend import recommendation
from autotune.sweep.search import (
    check_space,
    finished_trials,
    importances,
    open_study,
    optimise,
    storage_url,
    trial_records,
    with_storage_hidden,
)
from autotune.verifiers import VerifierOptions, load_verifier

log = logging.getLogger("autotune")

RESULT_FILE = "sweep.json"


async def run_sweep(
    study: Study,
    *,
    storage: str | None = None,
    studies_dir: Path = Path("studies"),
    launcher: Launcher | None = None,
    on_trial: Callable[[int, TrialOutcome], None] | None = None,
) -> SweepResult:
    """Runs or resumes the study to its budget; returns what sweep.json saves."""
    from autotune.telemetry import gpu_count

    gpus = gpu_count() if study.target.kind == "vllm" else 0
    check_space(study, gpus)
    url = storage_url(study, storage, studies_dir)
    optuna_study = open_study(study, url)
    already = len(finished_trials(optuna_study))
    if already:
        log.info("resuming study %s: %d finished trials reused", study.name, already)
    started = time.time()
    if launcher is None and study.target.kind == "command":
        launcher = command_launcher(study, studies_dir)
    if launcher is not None:
        await optimise(study, optuna_study, launcher, gpus, on_trial)
    else:
        verifier = await load_verifier(
            study.workload.verifier,
            VerifierOptions(
                workers=study.workload.verifier_workers, cost_ms=study.workload.verifier_cost_ms
            ),
        )
        try:
            await optimise(study, optuna_study, http_launcher(study, verifier), gpus, on_trial)
        finally:
            await verifier.aclose()
    return SweepResult(
        study=study.name,
        created_at=time.time(),
        started_at=started,
        simulated=study.target.kind == "sim",
        storage=with_storage_hidden(url),
        trials_reused=already,
        metric=study.objective.metric,
        max_error_rate=study.objective.max_error_rate,
        model=_model_name(study),
        spec=_saved_spec(study),
        trials=trial_records(optuna_study),
        importances=importances(optuna_study),
        machine=machine_identity(),
    )


_SECRET_FLAG = re.compile(r"key|token|secret|password", re.IGNORECASE)


def redacted(args: Sequence[str]) -> list[str]:
    """Server flags as saved in results: the value of any secret-looking flag hidden."""
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            shown.append("***")
            hide_next = False
        elif arg.startswith("-") and _SECRET_FLAG.search(arg):
            name, has_value, _ = arg.partition("=")
            shown.append(f"{name}=***" if has_value else arg)
            hide_next = not has_value
        else:
            shown.append(arg)
    return shown


def _saved_spec(study: Study) -> dict[str, Any]:
    """The study as validated, without the server's environment or secret flag values."""
    spec = study.model_dump(mode="json")
    spec["target"] = {
        **study.target.model_dump(mode="json", exclude={"env", "args"}),
        "args": redacted(study.target.args),
    }
    return spec


def _model_name(study: Study) -> str | None:
    """The model the recommendation's `vllm serve` line names."""
    if study.target.model:
        return study.target.model
    args = study.target.args
    if "--model" in args[:-1]:
        return args[args.index("--model") + 1]
    return None


def write_trials_csv(result: SweepResult, path: Path) -> Path:
    """trials.csv: the report's trials table (one column definition for both)."""
    from autotune.report.columns import headers, rows
    from autotune.report.sweep_report import trial_columns

    columns = trial_columns(result)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(headers(columns))
        writer.writerows(rows(columns, result.trials))
    return path


def write_outputs(result: SweepResult, directory: Path) -> list[Path]:
    """sweep.json, then everything rebuilt from it: trials.csv, recommendation.json/.yaml,
    index.html. `autotune report` calls this with a loaded sweep.json."""
    from autotune.report import sweep_report

    written = [save(result, directory / RESULT_FILE)]
    written.append(write_trials_csv(result, directory / "trials.csv"))
    recommended = recommendation(result)
    if recommended is not None:
        as_json = directory / "recommendation.json"
        as_json.write_bytes(to_json(recommended))
        as_yaml = directory / "recommendation.yaml"
        as_yaml.write_text(yaml.safe_dump(recommended.to_dict(), sort_keys=False))
        written += [as_json, as_yaml]
    written.append(sweep_report.write(result, recommended, directory))
    return written
