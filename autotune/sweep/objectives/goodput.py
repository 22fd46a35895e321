"""`objective.metric: informative_groups_per_s`: each trial runs training steps of GRPO
groups, as a synchronous trainer consumes them, instead of a parallelism curve; its value
is informative groups/s, with the p95 step time as a constraint (`objective.max_step_s`).
Why: docs/design/sweep.md."""

from __future__ import annotations

from typing import Any

from autotune.config.rl_specs import BATCH_KNOBS, BatchSpec
from autotune.config.study import GOODPUT, Study
from autotune.engines import Engine
from autotune.engines.known import VLLM
from autotune.probe.realtime import EngineProbe
from autotune.report.sweep_report import figure_text, knobs_text, share_text
from autotune.report.terminal import seconds_text
from autotune.results.diagnosis import quantity
from autotune.results.runs import BatchSummary
from autotune.results.trials import (
    StepSnippets,
    StepsRecommendation,
    SweepResult,
    TrialOutcome,
    TrialRecord,
)
from autotune.rl.batch import launched_groups
from autotune.sweep.objectives.base import (
    VALIDATION_SHARE,
    EngineObjective,
    joined,
)
from autotune.sweep.recommend import serve_line


def batch_spec(study: Study, knobs: dict[str, Any]) -> BatchSpec:
    """The trial's batch settings: the searched ones over the workload's fixed ones."""
    fixed = study.workload.batch.model_dump() if study.workload.batch else {}
    drawn = {name: knobs[name] for name in BATCH_KNOBS if name in knobs}
    return BatchSpec.model_validate({**fixed, **drawn})


def step_p95(batch: BatchSummary | None) -> float | None:
    """The p95 training-step time, seconds: what `objective.max_step_s` bounds."""
    return batch.step_s.p95 if batch else None


class GoodputObjective(EngineObjective[BatchSummary]):
    """Informative groups/s of `probe.steps` training steps (batch.run_steps)."""

    metric = GOODPUT
    searched = BATCH_KNOBS
    what = "training steps"
    summary_field = "batch"
    recommended_figures = (
        "batch_groups", "over_sample", "carry_over", "informative_groups_per_s", "busy_share",
        "tail_share", "staleness_mean", "cancelled_tokens",
    )  # fmt: skip
    bound = "max_step_s"
    rerun = "configuration's training steps", "informative groups/s", "and meet the step-time SLO"

    async def measure(
        self, probe: EngineProbe, study: Study, knobs: dict[str, Any]
    ) -> BatchSummary:
        return await probe.steps(
            batch_spec(study, knobs), study.workload.num_repeats, study.probe.steps
        )

    def value(self, summary: BatchSummary) -> float:
        return summary.informative_groups_per_s

    def error_rate(self, summary: BatchSummary) -> float:
        return summary.error_rate

    def measured_s(self, summary: BatchSummary | None) -> float:
        """The steps' generation time: what the trial spent measuring."""
        return sum(step.generation_s for step in summary.steps) if summary else 0.0

    def trial_problem(self, study: Study, summary: BatchSummary) -> str | None:
        if summary.error_rate > study.objective.max_error_rate:
            return (
                f"{summary.error_rate:.0%} of samples failed, above the "
                f"{study.objective.max_error_rate:.0%} allowed"
            )
        return None

    def validation_problems(self, study: Study, summary: BatchSummary) -> list[str]:
        problems = []
        if summary.error_rate > study.objective.max_error_rate:
            problems.append(
                f"{summary.error_rate:.1%} of samples failed, above the "
                f"{study.objective.max_error_rate:.0%} allowed"
            )
        slo, p95 = study.objective.max_step_s, step_p95(summary)
        if slo is not None and p95 is not None and p95 > slo:
            problems.append(f"p95 step time {p95:.3g} s over the {slo:g} s SLO")
        return problems

    def shortfall(self, summary: BatchSummary, expected: float) -> str:
        return (
            f"goodput {summary.informative_groups_per_s:.3g} informative groups/s below "
            f"{VALIDATION_SHARE:.0%} of the trial's {expected:.3g}"
        )

    def record_trial(self, study: Study, trial: Any, outcome: TrialOutcome) -> None:
        """The p95 step time, and the step-time SLO as a constraint."""
        slo = study.objective.max_step_s
        if slo is not None:
            p95 = step_p95(outcome.batch)
            trial.set_user_attr("step_p95_s", p95)
            trial.set_constraint("step_time", min(p95 if p95 is not None else 1e9, 1e9) - slo)

    def validation_counts(
        self, study: Study, best: TrialRecord, summary: BatchSummary | None
    ) -> tuple[int, int, int]:
        launched = (
            launched_groups(best.batch.batch_groups, best.batch.over_sample) if best.batch else 0
        )
        return (
            study.workload.num_repeats * launched,  # the samples a step launches
            study.workload.num_repeats * study.probe.steps * launched,
            summary.completed_samples if summary else 0,
        )

    def recommendation(
        self, result: SweepResult, best: TrialRecord, summary: BatchSummary, common: dict[str, Any]
    ) -> StepsRecommendation:
        return StepsRecommendation(**common, step_p95_s=step_p95(summary))

    def figures_text(self, value: float, summary: BatchSummary) -> str:
        return (
            f"{value:.3g} informative groups/s, p95 step {seconds_text(summary.step_s.p95)}, "
            f"busy {share_text(summary.busy_share)}"
        )

    def recommendation_lines(self, rec: StepsRecommendation) -> list[str]:
        carry = ", carry-over" if rec.carry_over else ""
        slo = f" (SLO {rec.max_step_s:g} s)" if rec.max_step_s is not None else ""
        return [
            f"training steps       {rec.batch_groups} groups of {rec.group_size}, over-sampling "
            f"{rec.over_sample:g}{carry}",
            f"goodput              {rec.informative_groups_per_s:.3g} informative groups/s, p95 "
            f"step {seconds_text(rec.step_p95_s)}{slo}, busy {share_text(rec.busy_share)}, tail "
            f"{share_text(rec.tail_share)}",
        ]

    def recommendation_text(self, rec: StepsRecommendation) -> str:
        carry = "on" if rec.carry_over else "off"
        return (
            f"Recommended: {rec.batch_groups} groups of {rec.group_size} a step, over-sampling "
            f"{rec.over_sample:g}, carry-over {carry}, with {knobs_text(rec.server)} — measured "
            f"{quantity(rec.informative_groups_per_s)} informative groups/s."
        )

    def recommendation_facts(self, rec: StepsRecommendation) -> list[tuple[str, str]]:
        slo = f" (SLO {rec.max_step_s:g} s)" if rec.max_step_s is not None else ""
        return [
            ("p95 step time", f"{figure_text(rec.step_p95_s)} s{slo}"),
            ("server busy share", share_text(rec.busy_share)),
            ("tail share of a step", share_text(rec.tail_share)),
            ("tokens generated for cancelled samples", str(rec.cancelled_tokens)),
            ("staleness (steps, mean)", figure_text(rec.staleness_mean)),
        ]

    def snippets(
        self,
        model: str | None,
        server: dict[str, Any],
        group_size: int,
        summary: BatchSummary,
        engine: Engine = VLLM,
    ) -> StepSnippets:
        """Groups a step, group size, over-sampling (a larger generation batch and a filter
        that drops groups of equal rewards) and carry-over (partial rollouts), per framework."""
        groups = summary.batch_groups
        launched = launched_groups(groups, summary.over_sample)
        openrlhf = [
            f"--rollout.n_samples_per_prompt {group_size}",
            f"--rollout.batch_size {groups}",
        ]
        verl = [f"actor_rollout_ref.rollout.n={group_size}", f"data.train_batch_size={groups}"]
        slime = [f"--n-samples-per-prompt {group_size}", f"--rollout-batch-size {groups}"]
        collect = ["autotune collect", f"--num-repeats {group_size}", f"--batch-groups {groups}"]
        if summary.over_sample > 0:
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
            collect.append(f"--over-sample {summary.over_sample:g}")
        if summary.carry_over:
            openrlhf += ["--train.async_enable", "--train.partial_rollout_enable"]
            verl.append("async_training.partial_rollout=True")
            slime.append("--partial-rollout")
            collect.append("--carry-over")
        lines = joined(openrlhf=openrlhf, verl=verl, slime=slime, autotune=collect)
        return StepSnippets(**lines, serve=serve_line(engine, model, server), engine=engine.name)
