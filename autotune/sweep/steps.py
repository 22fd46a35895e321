"""A goodput study (`objective.metric: informative_groups_per_s`): each trial runs
training steps of GRPO groups, as a synchronous trainer consumes them, instead of a
parallelism curve.

A trainer does not ask for rollouts at a parallelism: it asks for B groups of n samples
a step and waits for the step's last one. What it can use is informative groups (rewards
that differ: DAPO's dynamic sampling drops the rest) per second, and how long a step
takes bounds how often it can update. So a trial is the server's knobs and the batch
settings (groups a step, over-sampling share, carry-over), measured over
`probe.steps` steps (batch.run_steps); its value is informative groups/s, and a step
time SLO (`objective.max_step_s`, on the steps' p95) is a constraint. The
recommendation is the best trial as it was measured, validated by running its steps
again, with the lines each RL framework takes, in its own names.
"""

from __future__ import annotations

import time
from typing import Any

from autotune.config.rl_specs import BATCH_KNOBS, BatchSpec
from autotune.config.study import GOODPUT, Study, server_part
from autotune.errors import ServerStartupError, UsageError
from autotune.probe.realtime import EngineProbe
from autotune.results.runs import BatchSummary
from autotune.results.trials import (
    StepSnippets,
    StepsRecommendation,
    SweepResult,
    TrialOutcome,
    TrialRecord,
    Validation,
)
from autotune.rl.batch import launched_groups
from autotune.sweep.curve import Launcher
from autotune.sweep.recommend import vllm_serve_line

VALIDATION_SHARE = 0.8  # a validation run keeps at least this share of the trial's goodput


def batch_spec(study: Study, knobs: dict[str, Any]) -> BatchSpec:
    """The trial's batch settings: the searched ones over the workload's fixed ones."""
    fixed = study.workload.batch.model_dump() if study.workload.batch else {}
    drawn = {name: knobs[name] for name in BATCH_KNOBS if name in knobs}
    return BatchSpec.model_validate({**fixed, **drawn})


async def measure_steps(launcher: Launcher, study: Study, knobs: dict[str, Any]) -> BatchSummary:
    """The configuration's server started, `probe.steps` training steps run on it."""
    async with launcher.running(server_part(knobs)) as probe:
        if not isinstance(probe, EngineProbe):  # Study._steps admits no other target
            raise UsageError(f"objective {GOODPUT} runs training steps through autotune's engine.")
        return await probe.steps(
            batch_spec(study, knobs), study.workload.num_repeats, study.probe.steps
        )


async def run_step_trial(launcher: Launcher, knobs: dict[str, Any], study: Study) -> TrialOutcome:
    """Start the configuration, run its steps, stop it; a refusal becomes an outcome."""
    started = time.perf_counter()
    try:
        batch = await measure_steps(launcher, study, knobs)
    except ServerStartupError as error:
        return _outcome(knobs, None, error.reason, time.perf_counter() - started)
    reason = None
    if batch.error_rate > study.objective.max_error_rate:
        reason = (
            f"{batch.error_rate:.0%} of samples failed, above the "
            f"{study.objective.max_error_rate:.0%} allowed"
        )
    return _outcome(knobs, batch, reason, time.perf_counter() - started)


def _outcome(
    knobs: dict[str, Any], batch: BatchSummary | None, reason: str | None, wall_s: float
) -> TrialOutcome:
    return TrialOutcome(
        knobs=knobs,
        points=[],
        curve=None,
        value=batch.informative_groups_per_s if batch and reason is None else 0.0,
        p95_latency_s=None,
        error_rate=batch.error_rate if batch else 1.0,
        infeasible_reason=reason,
        probe_s=_measured_s(batch),
        wall_s=wall_s,
        batch=batch,
    )


def _measured_s(batch: BatchSummary | None) -> float:
    """The steps' generation time: what the trial spent measuring."""
    return sum(step.generation_s for step in batch.steps) if batch else 0.0


def step_p95(batch: BatchSummary | None) -> float | None:
    """The p95 training-step time, seconds: what `objective.max_step_s` bounds."""
    return batch.step_s.p95 if batch else None


# -- the recommendation ------------------------------------------------------------------


def steps_recommendation(result: SweepResult) -> StepsRecommendation | None:
    """None when no feasible trial ran its steps."""
    best = result.best()
    if best is None or best.batch is None:
        return None
    batch = best.batch
    group_size = int((result.spec or {}).get("workload", {}).get("num_repeats", 1))
    server = server_part(best.knobs)
    validations = [v for v in result.validations if v.trial == best.number]
    return StepsRecommendation(
        simulated=result.simulated,
        metric=result.metric,
        server=server,
        group_size=group_size,
        batch_groups=batch.batch_groups,
        over_sample=batch.over_sample,
        carry_over=batch.carry_over,
        informative_groups_per_s=batch.informative_groups_per_s,
        step_p95_s=step_p95(batch),
        busy_share=batch.busy_share,
        tail_share=batch.tail_share,
        staleness_mean=batch.staleness_mean,
        cancelled_tokens=batch.cancelled_tokens,
        max_step_s=(result.spec or {}).get("objective", {}).get("max_step_s"),
        snippets=step_snippets(result.model, server, group_size, batch),
        validated=validations[-1].passed if validations else None,
        validations=validations,
    )


def step_snippets(
    model: str | None, server: dict[str, Any], group_size: int, batch: BatchSummary
) -> StepSnippets:
    """Groups a step, group size, over-sampling (a larger generation batch and a filter
    that drops groups of equal rewards) and carry-over (partial rollouts), per framework."""
    groups, launched = batch.batch_groups, launched_groups(batch.batch_groups, batch.over_sample)
    openrlhf = [f"--rollout.n_samples_per_prompt {group_size}", f"--rollout.batch_size {groups}"]
    verl = [f"actor_rollout_ref.rollout.n={group_size}", f"data.train_batch_size={groups}"]
    slime = [f"--n-samples-per-prompt {group_size}", f"--rollout-batch-size {groups}"]
    collect = [f"--num-repeats {group_size}", f"--batch-groups {groups}"]
    if batch.over_sample > 0:
        openrlhf.append("--algo.dynamic_filtering_enable")
        verl += [
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=acc",
            f"data.gen_batch_size={launched}",
        ]
        slime += [
            f"--over-sampling-batch-size {launched}",
            "--dynamic-sampling-filter-path "
            "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        ]
        collect.append(f"--over-sample {batch.over_sample:g}")
    if batch.carry_over:
        openrlhf += ["--train.async_enable", "--train.partial_rollout_enable"]
        verl.append("async_training.partial_rollout=True")
        slime.append("--partial-rollout")
        collect.append("--carry-over")
    return StepSnippets(
        openrlhf=" ".join(openrlhf),
        verl=" ".join(verl),
        slime=" ".join(slime),
        vllm=vllm_serve_line(model, server),
        autotune="autotune collect " + " ".join(collect),
    )


# -- validation ----------------------------------------------------------------------------


async def validate_steps(study: Study, launcher: Launcher, result: SweepResult) -> list[Validation]:
    """The best trial's steps run again on a fresh server: it passes when its goodput
    keeps VALIDATION_SHARE of the trial's, its samples fail within the study's limit and
    its p95 step time meets the SLO. None when validate_rollouts is 0."""
    best = result.best()
    if study.budget.rollouts_to_validate(study.target.kind) == 0 or not (best and best.batch):
        return []
    try:
        batch = await measure_steps(launcher, study, best.knobs)
    except ServerStartupError as error:
        return [_validation(study, best, None, [f"the server did not start: {error.reason}"])]
    return [_validation(study, best, batch, _problems(study, best, batch))]


def _problems(study: Study, best: TrialRecord, batch: BatchSummary) -> list[str]:
    problems = []
    expected = best.value or 0.0
    if batch.informative_groups_per_s < VALIDATION_SHARE * expected:
        problems.append(
            f"goodput {batch.informative_groups_per_s:.3g} informative groups/s below "
            f"{VALIDATION_SHARE:.0%} of the trial's {expected:.3g}"
        )
    if batch.error_rate > study.objective.max_error_rate:
        problems.append(
            f"{batch.error_rate:.1%} of samples failed, above the "
            f"{study.objective.max_error_rate:.0%} allowed"
        )
    slo, p95 = study.objective.max_step_s, step_p95(batch)
    if slo is not None and p95 is not None and p95 > slo:
        problems.append(f"p95 step time {p95:.3g} s over the {slo:g} s SLO")
    return problems


def _validation(
    study: Study, best: TrialRecord, batch: BatchSummary | None, problems: list[str]
) -> Validation:
    launched = launched_groups(best.batch.batch_groups, best.batch.over_sample) if best.batch else 0
    return Validation.rerun(
        best,
        study.objective.max_error_rate,
        problems,
        parallelism=batch.capacity if batch else 0,
        rollouts=study.workload.num_repeats * study.probe.steps * launched,
        completed=batch.completed_samples if batch else 0,
        throughput=batch.informative_groups_per_s if batch else 0.0,
        error_rate=batch.error_rate if batch else 1.0,
        probe_s=_measured_s(batch),
    )
