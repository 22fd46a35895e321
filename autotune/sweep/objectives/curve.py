"""`objective.metric: rollouts_per_s` or `output_tokens_per_s`: each trial measures a
throughput curve over client parallelism, and the recommendation is a parallelism on the
best curve, validated at load (sweep/curve.py, sweep/recommend.py, sweep/validate.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config.study import Study
from autotune.probe import Launcher
from autotune.report.sweep_report import curve_sections
from autotune.report.terminal import curve_lines
from autotune.results.trials import Recommendation, SweepResult, TrialOutcome, Validation
from autotune.sweep.curve import run_trial, start_parallelism
from autotune.sweep.objectives.base import TrialContext
from autotune.sweep.recommend import recommendation
from autotune.sweep.validate import validate


@dataclass(frozen=True, slots=True)
class CurveObjective:
    """A throughput (`metric`: a CurvePoint figure) measured up a parallelism ladder."""

    metric: str
    searched: tuple[str, ...] = ()

    async def run_trial(
        self, study: Study, launcher: Launcher, knobs: dict[str, Any], context: TrialContext
    ) -> TrialOutcome:
        """Each rung reported to Optuna and, in a one-objective study, the curve pruned once
        it cannot reach the best value so far."""
        best, known, trial = context.best, context.known, context.trial
        one_objective = study.objective.second_objective is None
        start = start_parallelism(
            study,
            best.parallelism if best else None,
            known.ceiling,
            best_level=best is not None and best.level,
        )
        return await run_trial(
            launcher,
            knobs,
            study,
            start,
            best=best if one_objective else None,
            top=known.ceiling,
            on_rung=(lambda step, value: trial.report(value, step)) if one_objective else None,
        )

    def record_trial(self, study: Study, trial: Any, outcome: TrialOutcome) -> None:
        return None

    async def validate(
        self, study: Study, launcher: Launcher, result: SweepResult
    ) -> list[Validation]:
        return await validate(study, launcher, result)

    def recommend(self, result: SweepResult) -> Recommendation | None:
        return recommendation(result)

    def trial_text(self, outcome: TrialOutcome) -> str:
        return (
            f"{outcome.value:.3g} at parallelism "
            f"{outcome.curve.best_measured_parallelism if outcome.curve else '-'}"
        )

    def summary_lines(self, result: SweepResult, recommended: Any) -> list[str]:
        return curve_lines(result, recommended)

    def report_sections(self, result: SweepResult, recommended: Any) -> list[str]:
        return curve_sections(result, recommended)

    def validation_note(self, verdict: str) -> str:
        return (
            f"The recommended configuration was held at load before it was "
            f"recommended (budget.validate_rollouts); the last run {verdict}. A "
            "failed run steps down to 80% of its parallelism and validates again."
        )
