"""`autotune sweep STUDY.yaml`: run (or resume) a study, then save what it found.

Outputs, all rebuilt from `sweep.json` by `autotune report`:
`reports/<study>/sweep.json`, `index.html`, `trials.csv`, `recommendation.json` and
`recommendation.yaml`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from autotune.config import SyntheticWorkload, TargetConfig
from autotune.launchers import CommandLauncher, HttpLauncher, Launcher
from autotune.probe import ProbeSettings
from autotune.recommend import recommendation
from autotune.results import SCHEMA_VERSION, machine_identity
from autotune.search import (
    TrialOutcome,
    best_trial,
    check_space,
    finished_trials,
    importances,
    is_feasible,
    open_study,
    optimise,
    storage_url,
    trial_rows,
    with_storage_hidden,
)
from autotune.servers.launcher import ServerProcess
from autotune.study import Study, knob_flags
from autotune.verifiers import VerifierOptions, load_verifier
from autotune.workload import Workload

log = logging.getLogger("autotune")

RESULT_FILE = "sweep.json"
COMMAND_ROLLOUTS = 200  # rollouts per run of a user's collector, unless workload.limit says


def _target_config(study: Study) -> TargetConfig:
    workload = study.workload
    extra_body = workload.extra_body
    if extra_body is None:
        synthetic_on_sim = workload.input is None and study.target.kind == "sim"
        extra_body = {"ignore_eos": True} if synthetic_on_sim else {}
    return TargetConfig(
        base_url=study.target.base_url,
        model=study.target.model if study.target.kind != "vllm" else None,
        api=workload.api,
        stream=workload.stream,
        extra_body=extra_body,
        api_key_env=study.target.api_key_env,
    )


def _tasks(study: Study) -> list[Any]:
    workload = study.workload
    synthetic = SyntheticWorkload(
        num_tasks=workload.synthetic.num_tasks,
        prompt_tokens_mean=workload.synthetic.prompt_tokens[0],
        prompt_tokens_std=workload.synthetic.prompt_tokens[1],
        output_tokens_mean=workload.synthetic.output_tokens[0],
        output_tokens_std=workload.synthetic.output_tokens[1],
        seed=workload.synthetic.seed,
    )
    return Workload(workload.input, synthetic, workload.limit).probe_tasks()


def _launcher(study: Study, verifier: Any, tasks: Sequence[Any]) -> HttpLauncher:
    settings = ProbeSettings(
        parallelism=1,
        min_s=study.probe.min_s,
        max_s=study.probe.max_s,
        target_halfwidth=study.probe.target_halfwidth,
    )
    return HttpLauncher(_target_config(study), verifier, tasks, settings, _server(study))


def _server(study: Study) -> Callable[[Mapping[str, Any]], ServerProcess] | None:
    """What starts one configuration: the simulator, real vLLM, or nothing (kind: server)."""
    target = study.target
    if target.kind == "sim":
        return lambda knobs: ServerProcess.sim(
            [*target.args, *knob_flags(knobs)], startup_timeout_s=target.startup_timeout_s
        )
    if target.kind == "vllm":
        from autotune.servers.vllm import VllmServer

        return lambda knobs: VllmServer(
            target.model or "",  # validated: kind vllm always names its model
            knobs,
            command=[*target.command, *target.args],
            env=target.env,
            startup_timeout_s=target.startup_timeout_s,
        )
    return None


async def run_sweep(
    study: Study,
    *,
    storage: str | None = None,
    studies_dir: Path = Path("studies"),
    launcher: Launcher | None = None,
    on_trial: Callable[[int, TrialOutcome], None] | None = None,
) -> dict[str, Any]:
    """Runs or resumes the study to its budget; returns the saved-result dict."""
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
        launcher = CommandLauncher(
            study.target.template or "",
            study.workload.limit or COMMAND_ROLLOUTS,
            studies_dir / "runs" / study.name,
        )
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
            await optimise(
                study, optuna_study, _launcher(study, verifier, _tasks(study)), gpus, on_trial
            )
        finally:
            await verifier.aclose()
    return results(study, optuna_study, url, reused=already, started=started)


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


def _model_name(study: Study) -> str | None:
    """The model the recommendation's `vllm serve` line names."""
    if study.target.model:
        return study.target.model
    args = study.target.args
    if "--model" in args[:-1]:
        return args[args.index("--model") + 1]
    return None


def _saved_trial(trial: Any) -> dict[str, Any]:
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": float(trial.values[0]) if trial.values else None,
        "feasible": is_feasible(trial),
        "knobs": trial.user_attrs.get("knobs", dict(trial.params)),
        "points": trial.user_attrs.get("points", []),
        "curve": trial.user_attrs.get("curve"),
        "probe_s": trial.user_attrs.get("probe_s"),
        "wall_s": trial.user_attrs.get("wall_s"),
        "p95_latency_s": trial.user_attrs.get("p95_latency_s"),
        "infeasible_reason": trial.user_attrs.get("infeasible_reason"),
    }


def results(
    study: Study, optuna_study: Any, url: str, *, reused: int, started: float
) -> dict[str, Any]:
    """The saved result of a study: every trial, the best, the recommendation."""
    trials = [_saved_trial(t) for t in finished_trials(optuna_study)]
    best = best_trial(optuna_study)
    simulated = study.target.kind == "sim"
    best_saved = _saved_trial(best) if best is not None else None
    recommended = None
    if best_saved is not None and best_saved["curve"]:
        recommended = recommendation(
            best_saved,
            model=_model_name(study),
            metric=study.objective.metric,
            simulated=simulated,
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "sweep",
        "study": study.name,
        "created_at": time.time(),
        "started_at": started,
        "simulated": simulated,
        "storage": with_storage_hidden(url),
        "trials_reused": reused,
        "objective": study.objective.model_dump(),
        "budget": study.budget.model_dump(),
        "search_space": study.search_space.model_dump(),
        "target": {
            **study.target.model_dump(exclude={"env", "args"}),
            "args": redacted(study.target.args),
        },
        "trials": trials,
        "rows": trial_rows(optuna_study),
        "best": best_saved,
        "importances": importances(optuna_study),
        "recommendation": recommended,
        "probe_s_total": sum(t["probe_s"] or 0 for t in trials),
        "machine": machine_identity(),
    }


def save_outputs(result: dict[str, Any], directory: Path) -> list[Path]:
    """sweep.json, trials.csv, recommendation.json/.yaml and index.html."""
    import pandas as pd

    from autotune.report import sweep_report

    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / RESULT_FILE]
    written[0].write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    csv = directory / "trials.csv"
    pd.DataFrame(result["rows"]).to_csv(csv, index=False)
    written.append(csv)
    if result["recommendation"] is not None:
        as_json = directory / "recommendation.json"
        as_json.write_bytes(orjson.dumps(result["recommendation"], option=orjson.OPT_INDENT_2))
        as_yaml = directory / "recommendation.yaml"
        as_yaml.write_text(yaml.safe_dump(result["recommendation"], sort_keys=False))
        written += [as_json, as_yaml]
    written.append(sweep_report.write(result, directory))
    return written
