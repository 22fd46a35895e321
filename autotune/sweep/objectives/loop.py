"""`objective.metric: trained_samples_per_s`: each trial runs the RL loop, a trainer
stand-in beside the rollouts (sync, colocated or async with its bounds), instead of a
parallelism curve; `objective.staleness_limit` bounds the oldest sample it trained.
Why: docs/design/sweep.md."""

from __future__ import annotations

from typing import Any

from autotune.config.rl_specs import LOOP_KNOBS
from autotune.config.study import TRAINED, Study, loop_spec
from autotune.probe.realtime import EngineProbe
from autotune.report import html
from autotune.report.sweep_report import figure_text, knobs_text, share_text
from autotune.results.diagnosis import quantity
from autotune.results.runs import LoopSummary
from autotune.results.trials import (
    LoopRecommendation,
    LoopSnippets,
    SweepResult,
    TrialOutcome,
    TrialRecord,
    Validation,
)
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


def _failed_share(summary: LoopSummary) -> float:
    ended = summary.trained_samples + summary.failed_samples
    return summary.failed_samples / ended if ended else 1.0


class LoopObjective(EngineObjective[LoopSummary]):
    """Trained samples/s of the loop's steps (trainer.run_on_server)."""

    metric = TRAINED
    searched = (*LOOP_KNOBS, "batch_groups")
    what = "the loop"

    async def measure(self, probe: EngineProbe, study: Study, knobs: dict[str, Any]) -> LoopSummary:
        return await probe.loop(loop_spec(study.workload.loop, knobs), study.workload.num_repeats)

    def value(self, summary: LoopSummary) -> float:
        return summary.trained_samples_per_s

    def error_rate(self, summary: LoopSummary) -> float:
        return _failed_share(summary)

    def measured_s(self, summary: LoopSummary | None) -> float:
        return summary.elapsed_s if summary else 0.0

    def trial_problem(self, study: Study, summary: LoopSummary) -> str | None:
        """Failures, or staler samples than allowed."""
        failed = _failed_share(summary)
        if failed > study.objective.max_error_rate:
            return f"{failed:.0%} of samples failed, above the {study.objective.max_error_rate:.0%}"
        limit = study.objective.staleness_limit
        if limit is not None and (summary.staleness_max or 0) > limit:
            return (
                f"trained samples {summary.staleness_max} policy versions old, past the "
                f"staleness_limit of {limit}"
            )
        return None

    def shortfall(self, summary: LoopSummary, expected: float) -> str:
        return (
            f"{summary.trained_samples_per_s:.3g} trained samples/s, below "
            f"{VALIDATION_SHARE:.0%} of the trial's {expected:.3g}"
        )

    def outcome(
        self, knobs: dict[str, Any], summary: LoopSummary | None, reason: str | None, wall_s: float
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
            probe_s=self.measured_s(summary),
            wall_s=wall_s,
            loop=summary,
        )

    def trial_summary(self, best: TrialRecord) -> LoopSummary | None:
        return best.loop

    def validation(
        self, study: Study, best: TrialRecord, summary: LoopSummary | None, problems: list[str]
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
            probe_s=self.measured_s(summary),
        )

    def recommend(self, result: SweepResult) -> LoopRecommendation | None:
        """The best trial, with its gain over the best trial of every other mode; None when
        no feasible trial ran its loop."""
        measured = self.best_measured(result)
        if measured is None:
            return None
        best, summary, group_size, server, validations = measured
        spec = result.spec or {}
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
            **validation_fields(validations),
        )

    def trial_text(self, outcome: TrialOutcome) -> str:
        loop = outcome.loop
        assert loop is not None
        return (
            f"{outcome.value:.3g} trained samples/s ({loop.mode}), staleness max "
            f"{loop.staleness_max}, trainer idle {share_text(loop.trainer_idle_share)}"
        )

    def summary_lines(self, result: SweepResult, recommended: Any) -> list[str]:
        """The mode and its bounds, its gain over the other modes, and the framework lines."""
        rec: LoopRecommendation = recommended
        bound = f", at most {rec.max_ahead} groups ahead" if rec.max_ahead is not None else ""
        if rec.max_staleness is not None:
            bound += f", older than {rec.max_staleness} versions dropped"
        gains = ", ".join(f"×{g:.2f} {mode}" for mode, g in sorted(rec.gain_over_modes.items()))
        return [
            best_configuration_line(rec.server),
            f"loop                 {rec.mode}: {rec.batch_groups} groups of {rec.group_size} a "
            f"step{bound}; pause {rec.pause_mode}",
            f"trained              {rec.trained_samples_per_s:.3g} samples/s"
            + (f" ({gains} the best of each other mode)" if gains else ""),
            f"staleness            p95 {rec.staleness_p95}, max {rec.staleness_max}"
            + (f" (limit {rec.staleness_limit})" if rec.staleness_limit is not None else ""),
            validated_line(rec.validated, rec.validations),
            "",
            *framework_lines(rec.snippets.rows()),
        ]

    def report_sections(self, result: SweepResult, recommended: Any) -> list[str]:
        """The mode and its bounds as measured, its gain over the best trial of each other
        mode, and the lines each RL framework takes."""
        from autotune.report.sweep_report import no_recommendation_section

        if recommended is None:
            return [no_recommendation_section()]
        rec: LoopRecommendation = recommended
        bound = f", at most {rec.max_ahead} groups ahead" if rec.max_ahead is not None else ""
        if rec.max_staleness is not None:
            bound += f", groups older than {rec.max_staleness} versions dropped"
        text = (
            f"Recommended: the {rec.mode} loop, {rec.batch_groups} groups of {rec.group_size} a "
            f"step{bound}, pause {rec.pause_mode}, with {knobs_text(rec.server)} — measured "
            f"{quantity(rec.trained_samples_per_s)} trained samples/s."
        )
        gains = [
            (f"× the best {mode} trial", f"{gain:.2f}")
            for mode, gain in sorted(rec.gain_over_modes.items())
        ]
        return [
            html.section(
                "Recommendation",
                html.callout(text, "verdict"),
                html.definition_list(
                    [
                        *gains,
                        ("staleness p95 / max (versions)", f"{figure_text(rec.staleness_p95)} / "
                         f"{rec.staleness_max}"),
                        ("staleness limit", str(rec.staleness_limit)),
                        ("trainer idle", share_text(rec.trainer_idle_share)),
                        ("generator idle", share_text(rec.generator_idle_share)),
                        ("paused for syncs", share_text(rec.sync_share)),
                        ("validated", validated_word(rec.validated)),
                        *rec.snippets.rows(),
                    ]
                ),
            )
        ]  # fmt: skip

    def validation_note(self, verdict: str) -> str:
        return (
            f"The recommended loop ran again on a fresh server before it was "
            f"recommended; the run {verdict}. It must keep 80% of the trial's trained "
            "samples/s, within the failure and staleness limits."
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
