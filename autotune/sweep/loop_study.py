"""A loop study (`objective.metric: trained_samples_per_s`): each trial runs the RL loop,
a trainer stand-in beside the rollouts, instead of a parallelism curve.

What a trainer gets from a GPU-hour is trained samples, and the loop's mode decides how
many: synchronous, colocated (the server asleep while the trainer trains, on a GPU it
shares: a lower `gpu_memory_utilization`), or asynchronous with a bound on how far
generation runs ahead and how stale a trained group may be. So a trial is the server's
knobs and the loop's (mode, ahead_steps, max_staleness, pause_mode, batch_groups),
measured over the loop's steps (trainer.run_on_server); its value is trained samples/s,
and `objective.staleness_limit` (the off-policyness accepted) is a constraint on the
oldest sample it trained. The recommendation is the best trial, validated by running its
loop again, with its gain over the best trial of every other mode and the lines each RL
framework takes, in its own names.
"""

from __future__ import annotations

import time
from typing import Any

from autotune.config.study import TRAINED, Study, loop_spec, server_part
from autotune.errors import ServerStartupError, UsageError
from autotune.probe.realtime import EngineProbe
from autotune.results.runs import LoopSummary
from autotune.results.trials import (
    LoopRecommendation,
    LoopSnippets,
    SweepResult,
    TrialOutcome,
    TrialRecord,
    Validation,
)
from autotune.sweep.curve import Launcher
from autotune.sweep.recommend import vllm_serve_line

VALIDATION_SHARE = 0.8  # a validation run keeps at least this share of the trial's value


async def measure_loop(launcher: Launcher, study: Study, knobs: dict[str, Any]) -> LoopSummary:
    """The configuration's server started, the trial's loop run on it."""
    async with launcher.running(server_part(knobs)) as probe:
        if not isinstance(probe, EngineProbe):  # Study._loop admits no other target
            raise UsageError(f"objective {TRAINED} runs the loop through autotune's engine.")
        return await probe.loop(loop_spec(study.workload.loop, knobs), study.workload.num_repeats)


async def run_loop_trial(launcher: Launcher, knobs: dict[str, Any], study: Study) -> TrialOutcome:
    """Start the configuration, run its loop, stop it; a refusal becomes an outcome."""
    started = time.perf_counter()
    try:
        summary = await measure_loop(launcher, study, knobs)
    except ServerStartupError as error:
        return _outcome(knobs, None, error.reason, time.perf_counter() - started)
    return _outcome(knobs, summary, _problem(study, summary), time.perf_counter() - started)


def _problem(study: Study, summary: LoopSummary) -> str | None:
    """Why a measured loop cannot be recommended: failures, or staler samples than allowed."""
    ended = summary.trained_samples + summary.failed_samples
    failed = summary.failed_samples / ended if ended else 1.0
    if failed > study.objective.max_error_rate:
        return f"{failed:.0%} of samples failed, above the {study.objective.max_error_rate:.0%}"
    limit = study.objective.staleness_limit
    if limit is not None and (summary.staleness_max or 0) > limit:
        return (
            f"trained samples {summary.staleness_max} policy versions old, past the "
            f"staleness_limit of {limit}"
        )
    return None


def _outcome(
    knobs: dict[str, Any], summary: LoopSummary | None, reason: str | None, wall_s: float
) -> TrialOutcome:
    ended = (summary.trained_samples + summary.failed_samples) if summary else 0
    return TrialOutcome(
        knobs=knobs,
        points=[],
        curve=None,
        value=summary.trained_samples_per_s if summary and reason is None else 0.0,
        p95_latency_s=None,
        error_rate=summary.failed_samples / ended if summary and ended else 1.0,
        infeasible_reason=reason,
        probe_s=summary.elapsed_s if summary else 0.0,
        wall_s=wall_s,
        loop=summary,
    )


# -- the recommendation ------------------------------------------------------------------


def loop_recommendation(result: SweepResult) -> LoopRecommendation | None:
    """None when no feasible trial ran its loop."""
    best = result.best()
    if best is None or best.loop is None:
        return None
    summary = best.loop
    spec = result.spec or {}
    group_size = int(spec.get("workload", {}).get("num_repeats", 1))
    server = server_part(best.knobs)
    by_mode: dict[str, float] = {}
    for trial in result.completed:
        if trial.feasible and trial.loop is not None:
            mode, value = trial.loop.mode, trial.value or 0.0
            by_mode[mode] = max(by_mode.get(mode, 0.0), value)
    gains = {
        mode: (best.value or 0.0) / value
        for mode, value in by_mode.items()
        if mode != summary.mode and value > 0
    }
    validations = [v for v in result.validations if v.trial == best.number]
    return LoopRecommendation(
        simulated=result.simulated,
        metric=result.metric,
        server=server,
        group_size=group_size,
        mode=summary.mode,
        batch_groups=summary.batch_groups,
        max_ahead=summary.max_ahead if summary.mode == "async" else None,
        max_staleness=summary.max_staleness,
        pause_mode=summary.pause_mode,
        trained_samples_per_s=best.value or 0.0,
        best_by_mode=by_mode,
        gain_over_modes=gains,
        staleness_p95=summary.staleness_p95,
        staleness_max=summary.staleness_max,
        trainer_idle_share=summary.trainer_idle_share,
        generator_idle_share=summary.generator_idle_share,
        sync_share=summary.sync_share,
        staleness_limit=spec.get("objective", {}).get("staleness_limit"),
        snippets=loop_snippets(result.model, server, group_size, summary),
        validated=validations[-1].passed if validations else None,
        validations=validations,
    )


def loop_snippets(
    model: str | None, server: dict[str, Any], group_size: int, summary: LoopSummary
) -> LoopSnippets:
    """The mode, its bound, the batch and the shared GPU's memory per framework, in the
    names each one's own code uses (OpenRLHF 0.10.2+'s dotted flags, verl's fully-async
    trainer, NeMo RL's GRPO config; read from their repositories, none guessed)."""
    groups, mode = summary.batch_groups, summary.mode
    openrlhf = [f"--rollout.n_samples_per_prompt {group_size}", f"--rollout.batch_size {groups}"]
    verl = [f"actor_rollout_ref.rollout.n={group_size}", f"data.train_batch_size={groups}"]
    nemo_rl = [
        f"grpo.num_generations_per_prompt={group_size}",
        f"grpo.num_prompts_per_step={groups}",
    ]
    autotune = [f"--num-repeats {group_size}", f"--batch-groups {groups}", f"--mode {mode}"]
    memory = server.get("gpu_memory_utilization")
    if mode == "colocated":
        openrlhf += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
        verl += [
            "actor_rollout_ref.hybrid_engine=True",
            "actor_rollout_ref.rollout.free_cache_engine=True",
        ]
        nemo_rl.append("policy.generation.colocated.enabled=true")
    elif mode == "async":
        steps_ahead = max(1, summary.max_ahead // max(groups, 1))
        openrlhf += ["--train.async_enable", f"--train.async_queue_size {steps_ahead}"]
        staleness = summary.max_staleness if summary.max_staleness is not None else steps_ahead
        verl.append(f"async_training.staleness_threshold={staleness}")
        nemo_rl += [
            "grpo.async_grpo.enabled=true",
            f"grpo.async_grpo.max_trajectory_age_steps={staleness}",
        ]
        autotune.append(f"--max-ahead {summary.max_ahead}")
        if summary.max_staleness is not None:
            autotune.append(f"--max-staleness {summary.max_staleness}")
        autotune.append(f"--pause-mode {summary.pause_mode}")
    else:
        nemo_rl.append("policy.generation.colocated.enabled=false")
    if memory is not None:
        openrlhf.append(f"--vllm.gpu_memory_utilization {memory}")
        verl.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={memory}")
        nemo_rl.append(f"policy.generation.vllm_cfg.gpu_memory_utilization={memory}")
    return LoopSnippets(
        openrlhf=" ".join(openrlhf),
        verl=" ".join(verl),
        nemo_rl=" ".join(nemo_rl),
        vllm=vllm_serve_line(model, server),
        autotune="autotune loop " + " ".join(autotune),
    )


# -- validation ----------------------------------------------------------------------------


async def validate_loop(study: Study, launcher: Launcher, result: SweepResult) -> list[Validation]:
    """The best trial's loop run again on a fresh server: it passes when it trains at least
    VALIDATION_SHARE of the trial's samples/s, within the failure and staleness limits.
    None when validate_rollouts is 0."""
    best = result.best()
    if study.budget.rollouts_to_validate(study.target.kind) == 0 or not (best and best.loop):
        return []
    try:
        summary = await measure_loop(launcher, study, best.knobs)
    except ServerStartupError as error:
        return [_validation(study, best, None, [f"the server did not start: {error.reason}"])]
    problems = []
    expected = best.value or 0.0
    if summary.trained_samples_per_s < VALIDATION_SHARE * expected:
        problems.append(
            f"{summary.trained_samples_per_s:.3g} trained samples/s, below "
            f"{VALIDATION_SHARE:.0%} of the trial's {expected:.3g}"
        )
    problem = _problem(study, summary)
    if problem is not None:
        problems.append(problem)
    return [_validation(study, best, summary, problems)]


def _validation(
    study: Study, best: TrialRecord, summary: LoopSummary | None, problems: list[str]
) -> Validation:
    ended = (summary.trained_samples + summary.failed_samples) if summary else 0
    return Validation.rerun(
        best,
        study.objective.max_error_rate,
        problems,
        parallelism=summary.max_ahead * summary.group_size if summary else 0,
        rollouts=summary.trained_samples if summary else 0,
        completed=summary.trained_samples if summary else 0,
        throughput=summary.trained_samples_per_s if summary else 0.0,
        error_rate=summary.failed_samples / ended if summary and ended else 1.0,
        probe_s=summary.elapsed_s if summary else 0.0,
    )
