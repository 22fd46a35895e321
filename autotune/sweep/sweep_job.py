"""`autotune sweep STUDY.yaml`: run (or resume) a study, validate its recommendation, then
save sweep.json in `reports/<study>/` and rebuild every output from it alone
(`write_outputs`, also what `autotune report DIR` calls). Why: docs/design/sweep.md.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from autotune.config.collection import collect_config
from autotune.config.study import Study, study_target_config
from autotune.errors import UsageError
from autotune.probe import Launcher
from autotune.results.codec import Record, machine_identity, save, to_json
from autotune.results.runs import WorkloadRecord
from autotune.results.trials import SweepResult, TrialOutcome, Validation
from autotune.rollout.workload import workload_record
from autotune.sweep.objectives import objective_for
from autotune.sweep.search import (
    check_space,
    finished_trials,
    importances,
    measure_caching_twin,
    open_study,
    optimise,
    rank_on_prior,
    storage_url,
    trial_records,
)

log = logging.getLogger("autotune")

RESULT_FILE = "sweep.json"


async def run_sweep(
    study: Study,
    launcher: Launcher,
    *,
    storage: str | None = None,
    studies_dir: Path = Path("studies"),
    on_trial: Callable[[int, TrialOutcome], None] | None = None,
) -> SweepResult:
    """Runs or resumes the study to its budget with `launcher` starting each configuration
    (probe.launchers.study_launcher), and validates its recommendation (once per best
    trial: a resumed study whose best did not change reuses the runs); returns what
    sweep.json saves."""
    from autotune.telemetry import gpu_count

    gpus = gpu_count() if study.target.engine is not None else 0
    check_space(study, gpus)
    check_storage(storage)
    url = storage_url(study, storage, studies_dir)
    optuna_study = open_study(study, url)
    already = len(finished_trials(optuna_study))
    if already:
        log.info("resuming study %s: %d finished trials reused", study.name, already)
    started = time.time()
    return await _search(study, optuna_study, launcher, gpus, on_trial, url, started, already)


async def _search(
    study: Study,
    optuna_study: Any,
    launcher: Launcher,
    gpus: int,
    on_trial: Callable[[int, TrialOutcome], None] | None,
    url: str,
    started: float,
    already: int,
) -> SweepResult:
    """The trials, then the validation runs of what they recommend. A trial is reused
    when this run did not measure it: finished before a resume (`already`), or copied
    from a configuration the study had measured already."""
    copied = 0

    def told(number: int, outcome: TrialOutcome) -> None:
        nonlocal copied
        copied += outcome.copied_from is not None
        if on_trial is not None:
            reason = outcome.infeasible_reason
            hidden = redact_text(reason) if reason else reason
            on_trial(number, dataclasses.replace(outcome, infeasible_reason=hidden))

    prior = await rank_on_prior(study, gpus) if study.prior is not None else None
    await optimise(study, optuna_study, launcher, gpus, told, prior=prior)
    await measure_caching_twin(study, optuna_study, launcher, gpus, told)
    result = SweepResult(
        study=study.name,
        created_at=time.time(),
        started_at=started,
        simulated=study.target.kind == "sim",
        storage=url,  # its password hidden below
        trials_reused=already + copied,
        metric=study.objective.metric,
        max_error_rate=study.objective.max_error_rate,
        model=_model_name(study),
        spec=_saved_spec(study),
        trials=trial_records(optuna_study),
        importances=importances(optuna_study),
        machine=machine_identity(),
        p95_latency_slo_s=study.objective.p95_latency_slo_s,
        p95_ttft_slo_s=study.objective.p95_ttft_slo_s,
        p99_latency_slo_s=study.objective.p99_latency_slo_s,
        workload=_workload(study),
    )
    best = result.best()
    saved = optuna_study.user_attrs.get(VALIDATIONS, {})
    if best is not None and str(best.number) in saved:
        runs = [Validation.from_dict(run) for run in saved[str(best.number)]]
    else:
        runs = await objective_for(study.objective.metric).validate(study, launcher, result)
        if best is not None and runs:
            optuna_study.set_user_attr(VALIDATIONS, {str(best.number): [r.to_dict() for r in runs]})
    return redact_result(dataclasses.replace(result, validations=runs))


VALIDATIONS = "validations"  # the study's user attribute: the best trial's validation runs


STORAGE_SCHEMES = ("sqlite", "postgresql", "mysql")  # what Optuna's RDB storage opens


def check_storage(storage: str | None) -> None:
    """Refuse a storage URL Optuna cannot open before anything starts (it would end in a
    traceback from deep inside Optuna or SQLAlchemy)."""
    if storage is None:
        return
    scheme, is_url, _ = storage.partition("://")
    if is_url and scheme.partition("+")[0].lower() in STORAGE_SCHEMES:
        return
    shown = redact_text(storage)
    if not is_url:
        raise UsageError(
            f"--storage {shown} is not a storage URL; for a file pass sqlite:///{shown}, "
            "for a study shared by several machines postgresql://user@host/db."
        )
    raise UsageError(
        f"--storage {shown} names a storage autotune cannot open ({scheme}); pass a "
        "sqlite://, postgresql:// or mysql:// URL, e.g. sqlite:///studies/NAME.db."
    )


HIDDEN = "***"
# A name that holds a secret: `--api-key`, `HF_TOKEN`, `db.password` (not `max-tokens`,
# not `api_key_env`, which names the variable that holds it).
_SECRET_NAME = re.compile(
    r"(?<![a-z0-9])(?:key|token|secret|password|passwd|credentials?)$", re.IGNORECASE
)
_VALUE = r"""(?P<value>'[^']*'|"[^"]*"|[^\s'"&]+)"""
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)[^/\s@'\"]+@", re.IGNORECASE)
_AUTHORIZATION = re.compile(
    r"""(?P<name>\bauthorization['"]?\s*[:=]\s*['"]?(?:(?:bearer|basic|token)\s+)?|\bbearer\s+)"""
    r"""(?P<value>[^\s'"]+)""",
    re.IGNORECASE,
)
_FLAG_VALUE = re.compile(r"(?<!\S)(?P<name>--?[a-z][\w.-]*)(?P<sep>=|\s+)(?!-)" + _VALUE, re.I)
_ASSIGNMENT = re.compile(r"(?<![\w.-])(?P<name>[a-z_][\w.]*)(?P<sep>=)" + _VALUE, re.I)


def _hide_secret_value(match: re.Match[str]) -> str:
    if not _SECRET_NAME.search(match["name"]):
        return match[0]
    return f"{match['name']}{match['sep']}{HIDDEN}"


def redact_text(text: str) -> str:
    """`text` (a URL, a command line, an error line) with every secret in it hidden: a
    URL's `user:password@`, `Authorization: Bearer ...`, and the value of a secret-looking
    flag or variable (`--api-key K`, `--hf-token=K`, `OPENAI_API_KEY=K`)."""
    text = _URL_USERINFO.sub(rf"\g<scheme>{HIDDEN}@", text)
    text = _AUTHORIZATION.sub(rf"\g<name>{HIDDEN}", text)
    text = _FLAG_VALUE.sub(_hide_secret_value, text)
    return _ASSIGNMENT.sub(_hide_secret_value, text)


def redacted(args: Sequence[str]) -> list[str]:
    """An argument list as saved in results: what redact_text hides in each argument,
    and the argument after a secret-looking flag (`--api-key`, `K`)."""
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            shown.append(HIDDEN)
        else:
            shown.append(redact_text(arg))
        hide_next = arg.startswith("-") and "=" not in arg and bool(_SECRET_NAME.search(arg))
    return shown


def _scrubbed(value: Any) -> Any:
    """A saved spec's value with every secret hidden, however deep (JSON types only)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return redacted(value)
    if isinstance(value, list):
        return [_scrubbed(item) for item in value]
    if isinstance(value, dict):
        return {
            key: HIDDEN if isinstance(item, str) and _SECRET_NAME.search(key) else _scrubbed(item)
            for key, item in value.items()
        }
    return value


def redact_result(result: SweepResult) -> SweepResult:
    """The result with every secret it could hold hidden: in the study spec (base URL,
    command template, server flags), the storage URL and the servers' error lines."""
    return dataclasses.replace(
        result,
        storage=redact_text(result.storage),
        spec=_scrubbed(result.spec),
        trials=[
            dataclasses.replace(trial, infeasible_reason=redact_text(trial.infeasible_reason))
            if trial.infeasible_reason
            else trial
            for trial in result.trials
        ],
    )


def _saved_spec(study: Study) -> dict[str, Any]:
    """The study as validated, without the server's environment (redact_result hides the
    secrets in the rest)."""
    return study.model_dump(mode="json", exclude={"target": {"env"}})


def _workload(study: Study) -> WorkloadRecord | None:
    """The workload every trial measured; None where a user's command made the rollouts."""
    if study.target.kind == "command":
        return None
    return workload_record(collect_config(study.workload, study_target_config(study)))


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


def recommend(result: SweepResult) -> Record | None:
    """The study's recommendation, as its objective makes it."""
    return objective_for(result.metric).recommend(result)


def write_outputs(result: SweepResult, directory: Path) -> list[Path]:
    """sweep.json, then everything rebuilt from it: trials.csv, recommendation.json/.yaml,
    index.html. `autotune report` calls this with a loaded sweep.json."""
    from autotune.report import sweep_report

    result = redact_result(result)  # a sweep.json from before secrets were hidden, too
    written = [save(result, directory / RESULT_FILE)]
    written.append(write_trials_csv(result, directory / "trials.csv"))
    recommended = recommend(result)
    if recommended is not None:
        as_json = directory / "recommendation.json"
        as_json.write_bytes(to_json(recommended))
        as_yaml = directory / "recommendation.yaml"
        # The JSON's values, so both files say the same (an open interval's "Infinity").
        as_yaml.write_text(yaml.safe_dump(orjson.loads(as_json.read_bytes()), sort_keys=False))
        written += [as_json, as_yaml]
    objective = objective_for(result.metric)
    written.append(sweep_report.write(result, recommended, directory, objective))
    return written
