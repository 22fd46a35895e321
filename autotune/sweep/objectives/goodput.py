"""`objective.metric: informative_groups_per_s`: each trial runs training steps of GRPO
groups, as a synchronous trainer consumes them, instead of a parallelism curve; its value
is informative groups/s, with the p95 step time as a constraint (`objective.max_step_s`).
Why: docs/design/sweep.md."""

from __future__ import annotations

from typing import Any

from autotune.config.rl_specs import BATCH_KNOBS, BatchSpec
from autotune.config.study import GOODPUT, Study
from autotune.probe.realtime import EngineProbe
from autotune.report import html
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
    Validation,
)
from autotune.rl.batch import launched_groups
from autotune.sweep.objectives.base import (
    VALIDATION_SHARE,
    EngineObjective,
    best_configuration_line,
    framework_lines,
    validated_line,
    validated_word,
    validation_fields,
)
from autotune.sweep.recommend import vllm_serve_line


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

    def outcome(
        self, knobs: dict[str, Any], summary: BatchSummary | None, reason: str | None, wall_s: float
    ) -> TrialOutcome:
        return TrialOutcome(
            knobs=knobs,
            points=[],
            curve=None,
            value=summary.informative_groups_per_s if summary and reason is None else 0.0,
            p95_latency_s=None,
            error_rate=summary.error_rate if summary else 1.0,
            infeasible_reason=reason,
            probe_s=self.measured_s(summary),
            wall_s=wall_s,
            batch=summary,
        )

    def record_trial(self, study: Study, trial: Any, outcome: TrialOutcome) -> None:
        """The p95 step time, and the step-time SLO as a constraint."""
        slo = study.objective.max_step_s
        if slo is not None:
            p95 = step_p95(outcome.batch)
            trial.set_user_attr("step_p95_s", p95)
            trial.set_constraint("step_time", min(p95 if p95 is not None else 1e9, 1e9) - slo)

    def trial_summary(self, best: TrialRecord) -> BatchSummary | None:
        return best.batch

    def validation(
        self, study: Study, best: TrialRecord, summary: BatchSummary | None, problems: list[str]
    ) -> Validation:
        launched = (
            launched_groups(best.batch.batch_groups, best.batch.over_sample) if best.batch else 0
        )
        return Validation.rerun(
            best,
            study.objective.max_error_rate,
            problems,
            parallelism=summary.capacity if summary else 0,
            rollouts=study.workload.num_repeats * study.probe.steps * launched,
            completed=summary.completed_samples if summary else 0,
            throughput=summary.informative_groups_per_s if summary else 0.0,
            error_rate=summary.error_rate if summary else 1.0,
            probe_s=self.measured_s(summary),
        )

    def recommend(self, result: SweepResult) -> StepsRecommendation | None:
        """The best trial as measured; None when no feasible trial ran its steps."""
        measured = self.best_measured(result)
        if measured is None:
            return None
        _, batch, group_size, server, validations = measured
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
            **validation_fields(validations),
        )

    def trial_text(self, outcome: TrialOutcome) -> str:
        batch = outcome.batch
        assert batch is not None
        return (
            f"{outcome.value:.3g} informative groups/s, p95 step {seconds_text(batch.step_s.p95)}, "
            f"busy {share_text(batch.busy_share)}"
        )

    def summary_lines(self, result: SweepResult, recommended: Any) -> list[str]:
        """The best configuration, its steps and the framework lines."""
        rec: StepsRecommendation = recommended
        carry = ", carry-over" if rec.carry_over else ""
        slo = f" (SLO {rec.max_step_s:g} s)" if rec.max_step_s is not None else ""
        return [
            best_configuration_line(rec.server),
            f"training steps       {rec.batch_groups} groups of {rec.group_size}, over-sampling "
            f"{rec.over_sample:g}{carry}",
            f"goodput              {rec.informative_groups_per_s:.3g} informative groups/s, p95 "
            f"step {seconds_text(rec.step_p95_s)}{slo}, busy {share_text(rec.busy_share)}, tail "
            f"{share_text(rec.tail_share)}",
            validated_line(rec.validated, rec.validations),
            "",
            *framework_lines(rec.snippets.rows()),
        ]

    def report_sections(self, result: SweepResult, recommended: Any) -> list[str]:
        """The best configuration and batch settings as measured, and the lines each RL
        framework takes."""
        from autotune.report.sweep_report import no_recommendation_section

        if recommended is None:
            return [no_recommendation_section()]
        rec: StepsRecommendation = recommended
        unit = "informative groups/s"
        carry = "on" if rec.carry_over else "off"
        slo = f" (SLO {rec.max_step_s:g} s)" if rec.max_step_s is not None else ""
        text = (
            f"Recommended: {rec.batch_groups} groups of {rec.group_size} a step, over-sampling "
            f"{rec.over_sample:g}, carry-over {carry}, with {knobs_text(rec.server)} — measured "
            f"{quantity(rec.informative_groups_per_s)} {unit}."
        )
        return [
            html.section(
                "Recommendation",
                html.callout(text, "verdict"),
                html.definition_list(
                    [
                        ("p95 step time", f"{figure_text(rec.step_p95_s)} s{slo}"),
                        ("server busy share", share_text(rec.busy_share)),
                        ("tail share of a step", share_text(rec.tail_share)),
                        ("tokens generated for cancelled samples", str(rec.cancelled_tokens)),
                        ("staleness (steps, mean)", figure_text(rec.staleness_mean)),
                        ("validated", validated_word(rec.validated)),
                        *rec.snippets.rows(),
                    ]
                ),
            )
        ]

    def validation_note(self, verdict: str) -> str:
        return (
            f"The recommended configuration's training steps ran again on a fresh "
            f"server before it was recommended; the run {verdict}. It must keep 80% "
            "of the trial's informative groups/s, and meet the step-time SLO."
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
