"""The sweep report, built only from a saved study result (sweep.json) and the
recommendation computed from it (passed in: this package never imports the jobs).

Numbers first (pure functions below), then drawing through report.plots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.knee import UslFit
from autotune.report import html, plots
from autotune.report.columns import Column, html_table
from autotune.results import Recommendation, SweepResult, TrialRecord

TOP_CURVES = 3
CURVE_SAMPLES = 60


def _knob(name: str) -> Column[TrialRecord]:
    return Column(name, lambda t: t.knobs.get(name))


def trial_columns(result: SweepResult) -> tuple[Column[TrialRecord], ...]:
    """The trials table (the report's and trials.csv): trial, state, every knob any
    trial set, then what was measured."""
    knobs = dict.fromkeys(name for trial in result.trials for name in trial.knobs)
    return (
        Column("trial", lambda t: t.number),
        Column("state", lambda t: t.state),
        *(_knob(name) for name in knobs),
        Column("value", lambda t: t.value),
        Column("feasible", lambda t: t.feasible),
        Column("peak_parallelism", lambda t: t.curve.peak_parallelism if t.curve else None),
        Column(
            "recommended_parallelism",
            lambda t: t.curve.recommended_parallelism if t.curve else None,
        ),
        Column("p95_latency_s", lambda t: t.p95_latency_s),
        Column("probe_s", lambda t: t.probe_s),
        Column("wall_s", lambda t: t.wall_s),
        Column("infeasible_reason", lambda t: t.infeasible_reason),
    )


FAILURE_COLUMNS: tuple[Column[TrialRecord], ...] = (
    Column("trial", lambda t: t.number),
    Column("server knobs", lambda t: _knobs(t.knobs)),
    Column("reason", lambda t: t.infeasible_reason),
)


def top_trials(result: SweepResult, count: int = TOP_CURVES) -> list[TrialRecord]:
    """The best feasible trials with a fitted curve, best first."""
    feasible = [t for t in result.completed if t.feasible and t.curve]
    return sorted(feasible, key=lambda t: t.value or 0.0, reverse=True)[:count]


def knee_curves(
    result: SweepResult,
) -> dict[str, tuple[list[float], list[float], list[float], list[float]]]:
    """Measured points and fitted USL lines of the best configurations."""
    curves = {}
    for trial in top_trials(result):
        points = [p for p in trial.points if p.error_rate <= result.max_error_rate]
        xs = [float(p.parallelism) for p in points]
        ys = [p.metric(result.metric) for p in points]
        fit = trial.curve.fit if trial.curve else None
        line_x: list[float] = []
        line_y: list[float] = []
        if fit:
            usl = UslFit(fit["lambda"], fit["sigma"], fit["kappa"], fit["r2"])
            low, high = 1.0, max(xs) * 1.5
            line_x = [low * (high / low) ** (i / (CURVE_SAMPLES - 1)) for i in range(CURVE_SAMPLES)]
            line_y = [usl.throughput(x) for x in line_x]
        label = f"trial {trial.number}: " + ", ".join(f"{k}={v}" for k, v in trial.knobs.items())
        curves[label or f"trial {trial.number}"] = (xs, ys, line_x, line_y)
    return curves


def history(result: SweepResult) -> dict[str, tuple[list[float], list[float]]]:
    """Each complete trial's objective and the best so far, by trial number."""
    numbers, values, best, running = [], [], [], 0.0
    for trial in sorted(result.completed, key=lambda t: t.number):
        value = (trial.value or 0.0) if trial.feasible else 0.0
        running = max(running, value)
        numbers.append(float(trial.number))
        values.append(value)
        best.append(running)
    return {"trial": (numbers, values), "best so far": (numbers, best)}


def render(result: SweepResult, recommended: Recommendation | None) -> str:
    metric = result.metric.replace("_", " ")
    sections = [_recommendation_section(recommended)]
    curves = knee_curves(result)
    if curves and recommended:
        marks = {
            "peak": recommended.peak.parallelism,
            "knee": recommended.knee_parallelism,
            "recommended (80% of peak)": recommended.recommended.parallelism,
        }
        level = ("80% of peak throughput", 0.8 * recommended.peak.throughput)
        sections.append(
            html.section(
                "Throughput versus parallelism",
                html.image(
                    plots.curves_with_marks(
                        curves,
                        marks,
                        level,
                        "client parallelism",
                        metric,
                        "Knee plot (best configurations)",
                    ),
                    "throughput versus parallelism with fitted curves, peak, knee and 80%",
                ),
                html.paragraph(recommended.note),
            )
        )
    if result.completed:
        sections.append(
            html.section(
                "Optimisation history",
                html.image(
                    plots.time_series(
                        history(result), metric, "Objective by trial", xlabel="trial"
                    ),
                    "objective value by trial",
                ),
            )
        )
    if result.importances:
        sections.append(
            html.section(
                "Parameter importances",
                html.image(
                    plots.horizontal_bars(
                        result.importances, "importance (PED-ANOVA)", "What mattered"
                    ),
                    "parameter importances",
                ),
            )
        )
    if result.trials:
        sections.append(
            html.section(
                "Trials",
                html_table(trial_columns(result), result.trials, caption="also in trials.csv"),
            )
        )
    failures = [t for t in result.completed if t.infeasible_reason]
    sections.append(
        html.section(
            "Failed configurations",
            html_table(FAILURE_COLUMNS, failures)
            if failures
            else html.paragraph("Every configuration tried started and held up."),
        )
    )
    target = result.spec["target"]
    sections.append(
        html.section(
            "Study",
            html.definition_list(
                [
                    ("study", result.study),
                    ("target", f"{target['kind']} {' '.join(target.get('args', []))}".strip()),
                    ("storage", result.storage),
                    (
                        "trials",
                        f"{len(result.completed)} finished ({result.trials_reused} reused)",
                    ),
                    ("probe time", f"{result.probe_s_total:.0f} s"),
                    ("autotune", result.machine["autotune"]),
                ]
            ),
        )
    )
    banner = None
    if result.simulated:
        banner = "SIMULATED — measured on autotune's simulated vLLM-like server, not real hardware"
    return html.page(
        f"autotune sweep: {result.study}",
        sections,
        banner=banner,
        subtitle="Rebuilt from sweep.json; `autotune report DIR` renders it again.",
    )


def _knobs(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "(client only)"


def _recommendation_section(recommended: Recommendation | None) -> str:
    if recommended is None:
        return html.section(
            "Recommendation",
            html.callout(
                "No configuration was feasible: see the failed configurations below.", "warning"
            ),
        )
    rec, peak, snippets = recommended.recommended, recommended.peak, recommended.snippets
    text = (
        f"Recommended: parallelism {rec.parallelism} with {_knobs(recommended.server)}"
        f" — predicted {rec.predicted_throughput:.3g} {recommended.metric} "
        f"(peak {peak.throughput:.3g} at parallelism {peak.parallelism:.0f})."
    )
    return html.section(
        "Recommendation",
        html.callout(text, "verdict"),
        *([] if peak.inside_searched_range else [html.callout(recommended.note, "warning")]),
        html.definition_list(
            [
                ("NeMo Gym", snippets.nemo_gym),
                ("vLLM", snippets.vllm),
                ("OpenRLHF", f"{snippets.openrlhf} ({snippets.openrlhf_note})"),
                ("knee", f"parallelism {recommended.knee_parallelism:.0f}"),
                (
                    "smallest parallelism at 80% of peak throughput",
                    str(recommended.smallest_parallelism_at_80pct_of_peak_throughput),
                ),
            ]
        ),
    )


def write(result: SweepResult, recommended: Recommendation | None, directory: Path) -> Path:
    return html.write_report(directory, render(result, recommended))
