"""A fourth objective, added as a user would: output tokens/s at the study's lowest
parallelism, one probe per configuration (`objective.metric: first_rung_tokens_per_s`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from autotune.config.study import Study
from autotune.probe import Launcher
from autotune.report import html
from autotune.results.codec import Record
from autotune.results.probes import CurvePoint
from autotune.results.trials import SweepResult, TrialOutcome, Validation
from autotune.sweep.objectives.base import TrialContext


@dataclass(frozen=True, slots=True)
class FirstRungRecommendation(Record):
    server: dict[str, Any]
    parallelism: int
    output_tokens_per_s: float
    validated: bool | None = None
    validations: list[Validation] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FirstRungObjective:
    metric: str = "first_rung_tokens_per_s"
    searched: tuple[str, ...] = ()

    async def run_trial(
        self, study: Study, launcher: Launcher, knobs: dict[str, Any], context: TrialContext
    ) -> TrialOutcome:
        started = time.perf_counter()
        parallelism = study.search_space.parallelism.low
        async with launcher.running(knobs) as probe:
            point = CurvePoint.of(await probe.measure(parallelism))
        return TrialOutcome(
            knobs=knobs,
            points=[point],
            curve=None,
            value=point.output_tokens_per_s,
            p95_latency_s=point.p95_latency_s,
            error_rate=point.error_rate,
            infeasible_reason=None,
            probe_s=point.probe_s,
            wall_s=time.perf_counter() - started,
        )

    def record_trial(self, study: Study, trial: Any, outcome: TrialOutcome) -> None:
        return None

    async def validate(
        self, study: Study, launcher: Launcher, result: SweepResult
    ) -> list[Validation]:
        return []

    def recommend(self, result: SweepResult) -> FirstRungRecommendation | None:
        best = result.best()
        if best is None or not best.points:
            return None
        point = best.points[0]
        return FirstRungRecommendation(best.knobs, point.parallelism, point.output_tokens_per_s)

    def trial_text(self, outcome: TrialOutcome) -> str:
        return f"{outcome.value:.3g} output tokens/s on the first rung"

    def summary_lines(self, result: SweepResult, recommended: Any) -> list[str]:
        return [f"first rung           {recommended.output_tokens_per_s:.3g} output tokens/s"]

    def report_sections(self, result: SweepResult, recommended: Any) -> list[str]:
        if recommended is None:
            return [html.section("First rung", html.paragraph("no feasible configuration"))]
        text = (
            f"Best first rung: {recommended.output_tokens_per_s:.0f} output tokens/s at "
            f"parallelism {recommended.parallelism} with {recommended.server}"
        )
        return [html.section("First rung", html.callout(text, "verdict"))]

    def validation_note(self, verdict: str) -> str:
        return f"not validated ({verdict})"
