"""`objective.metric: trained_samples_per_s`: each trial runs the RL loop, a trainer
stand-in beside the rollouts (sync, colocated or async with its bounds), instead of a
parallelism curve; `objective.staleness_limit` bounds the oldest sample it trained.
Why: docs/design/sweep.md."""

from __future__ import annotations

from typing import Any

from autotune.config.rl_specs import LOOP_KNOBS
from autotune.config.study import TRAINED, Study, loop_spec
from autotune.engines import Engine
from autotune.engines.known import VLLM
from autotune.probe.realtime import EngineProbe
from autotune.report.sweep_report import figure_text, knobs_text, share_text
from autotune.results.diagnosis import quantity
from autotune.results.runs import LoopSummary
from autotune.results.trials import (
    LoopRecommendation,
    LoopSnippets,
    SweepResult,
    TrialRecord,
)
from autotune.sweep.objectives.base import (
    VALIDATION_SHARE,
    EngineObjective,
    joined,
)
from autotune.sweep.recommend import serve_line


def _failed_share(summary: LoopSummary) -> float:
    ended = summary.trained_samples + summary.failed_samples
    return summary.failed_samples / ended if ended else 1.0


class LoopObjective(EngineObjective[LoopSummary]):
    """Trained samples/s of the loop's steps (trainer.run_on_server)."""

    metric = TRAINED
    searched = (*LOOP_KNOBS, "batch_groups")
    what = "the loop"
    summary_field = "loop"
    recommended_figures = (
        "mode", "batch_groups", "max_staleness", "pause_mode", "staleness_p95", "staleness_max",
        "trainer_idle_share", "generator_idle_share", "sync_share",
    )  # fmt: skip
    bound = "staleness_limit"
    rerun = "loop", "trained samples/s", "within the failure and staleness limits"

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

    def validation_counts(
        self, study: Study, best: TrialRecord, summary: LoopSummary | None
    ) -> tuple[int, int, int]:
        if summary is None:
            return 0, 0, 0
        trained = summary.trained_samples
        return summary.max_ahead * summary.group_size, trained, trained

    def recommendation(
        self, result: SweepResult, best: TrialRecord, summary: LoopSummary, common: dict[str, Any]
    ) -> LoopRecommendation:
        """With the trial's gain over the best trial of every other mode."""
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
            **common,
            max_ahead=summary.max_ahead if summary.mode == "async" else None,
            trained_samples_per_s=best.value or 0.0,
            best_by_mode=by_mode,
            gain_over_modes=gains,
        )

    def figures_text(self, value: float, summary: LoopSummary) -> str:
        return (
            f"{value:.3g} trained samples/s ({summary.mode}), staleness max "
            f"{summary.staleness_max}, trainer idle {share_text(summary.trainer_idle_share)}"
        )

    def recommendation_lines(self, rec: LoopRecommendation) -> list[str]:
        bound = f", at most {rec.max_ahead} groups ahead" if rec.max_ahead is not None else ""
        if rec.max_staleness is not None:
            bound += f", older than {rec.max_staleness} versions dropped"
        gains = ", ".join(f"×{g:.2f} {mode}" for mode, g in sorted(rec.gain_over_modes.items()))
        return [
            f"loop                 {rec.mode}: {rec.batch_groups} groups of {rec.group_size} a "
            f"step{bound}; pause {rec.pause_mode}",
            f"trained              {rec.trained_samples_per_s:.3g} samples/s"
            + (f" ({gains} the best of each other mode)" if gains else ""),
            f"staleness            p95 {rec.staleness_p95}, max {rec.staleness_max}"
            + (f" (limit {rec.staleness_limit})" if rec.staleness_limit is not None else ""),
        ]

    def recommendation_text(self, rec: LoopRecommendation) -> str:
        bound = f", at most {rec.max_ahead} groups ahead" if rec.max_ahead is not None else ""
        if rec.max_staleness is not None:
            bound += f", groups older than {rec.max_staleness} versions dropped"
        return (
            f"Recommended: the {rec.mode} loop, {rec.batch_groups} groups of {rec.group_size} a "
            f"step{bound}, pause {rec.pause_mode}, with {knobs_text(rec.server)} — measured "
            f"{quantity(rec.trained_samples_per_s)} trained samples/s."
        )

    def recommendation_facts(self, rec: LoopRecommendation) -> list[tuple[str, str]]:
        gains = [
            (f"× the best {mode} trial", f"{gain:.2f}")
            for mode, gain in sorted(rec.gain_over_modes.items())
        ]
        return [
            *gains,
            ("staleness p95 / max (versions)", f"{figure_text(rec.staleness_p95)} / "
             f"{rec.staleness_max}"),
            ("staleness limit", str(rec.staleness_limit)),
            ("trainer idle", share_text(rec.trainer_idle_share)),
            ("generator idle", share_text(rec.generator_idle_share)),
            ("paused for syncs", share_text(rec.sync_share)),
        ]  # fmt: skip

    def snippets(
        self,
        model: str | None,
        server: dict[str, Any],
        group_size: int,
        summary: LoopSummary,
        engine: Engine = VLLM,
    ) -> LoopSnippets:
        """The mode, its bound, the batch and the shared GPU's memory per framework, in the
        names each one's own code uses (OpenRLHF 0.10.2+'s dotted flags, verl's fully-async
        trainer, NeMo RL's GRPO config; read from their repositories, none guessed)."""
        groups, mode = summary.batch_groups, summary.mode
        openrlhf = [
            f"--rollout.n_samples_per_prompt {group_size}",
            f"--rollout.batch_size {groups}",
        ]
        verl = [f"actor_rollout_ref.rollout.n={group_size}", f"data.train_batch_size={groups}"]
        nemo_rl = [
            f"grpo.num_generations_per_prompt={group_size}",
            f"grpo.num_prompts_per_step={groups}",
        ]
        autotune = [
            "autotune loop",
            f"--num-repeats {group_size}",
            f"--batch-groups {groups}",
            f"--mode {mode}",
        ]
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
        if memory is not None:  # verl's key maps onto SGLang's too; the others are vLLM's
            verl.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={memory}")
            if engine.name == "vllm":
                openrlhf.append(f"--vllm.gpu_memory_utilization {memory}")
                nemo_rl.append(f"policy.generation.vllm_cfg.gpu_memory_utilization={memory}")
        lines = joined(openrlhf=openrlhf, verl=verl, nemo_rl=nemo_rl, autotune=autotune)
        return LoopSnippets(**lines, serve=serve_line(engine, model, server), engine=engine.name)
