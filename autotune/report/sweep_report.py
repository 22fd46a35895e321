"""The sweep report, built only from a saved study result (sweep.json).

Numbers first (pure functions below), then drawing through report.plots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.knee import UslFit
from autotune.report import html, plots

TOP_CURVES = 3
CURVE_SAMPLES = 60


def top_trials(result: dict[str, Any], count: int = TOP_CURVES) -> list[dict[str, Any]]:
    """The best feasible trials with a fitted curve, best first."""
    feasible = [t for t in result["trials"] if t["feasible"] and t["curve"]]
    return sorted(feasible, key=lambda t: t["value"] or 0.0, reverse=True)[:count]


def knee_curves(
    result: dict[str, Any],
) -> dict[str, tuple[list[float], list[float], list[float], list[float]]]:
    """Measured points and fitted USL lines of the best configurations."""
    metric = result["objective"]["metric"]
    curves = {}
    for trial in top_trials(result):
        points = [
            p for p in trial["points"] if p["error_rate"] <= result["objective"]["max_error_rate"]
        ]
        xs = [float(p["parallelism"]) for p in points]
        ys = [float(p[metric]) for p in points]
        fit = trial["curve"]["fit"]
        line_x: list[float] = []
        line_y: list[float] = []
        if fit:
            usl = UslFit(fit["lambda"], fit["sigma"], fit["kappa"], fit["r2"])
            low, high = 1.0, max(xs) * 1.5
            line_x = [low * (high / low) ** (i / (CURVE_SAMPLES - 1)) for i in range(CURVE_SAMPLES)]
            line_y = [usl.throughput(x) for x in line_x]
        label = f"trial {trial['number']}: " + ", ".join(
            f"{k}={v}" for k, v in trial["knobs"].items()
        )
        curves[label or f"trial {trial['number']}"] = (xs, ys, line_x, line_y)
    return curves


def history(result: dict[str, Any]) -> dict[str, tuple[list[float], list[float]]]:
    """Each trial's objective and the best so far, by trial number."""
    numbers, values, best, running = [], [], [], 0.0
    for trial in sorted(result["trials"], key=lambda t: t["number"]):
        value = (trial["value"] or 0.0) if trial["feasible"] else 0.0
        running = max(running, value)
        numbers.append(float(trial["number"]))
        values.append(value)
        best.append(running)
    return {"trial": (numbers, values), "best so far": (numbers, best)}


def render(result: dict[str, Any]) -> str:
    metric = result["objective"]["metric"].replace("_", " ")
    sections = [_recommendation_section(result)]
    curves = knee_curves(result)
    recommendation = result["recommendation"]
    if curves and recommendation:
        marks = {
            "peak": recommendation["peak"]["parallelism"],
            "knee": recommendation["knee_parallelism"],
            "recommended (80% of peak)": recommendation["recommended"]["parallelism"],
        }
        level = ("80% of peak throughput", 0.8 * recommendation["peak"]["throughput"])
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
                html.paragraph(recommendation["note"]),
            )
        )
    if result["trials"]:
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
    if result["importances"]:
        sections.append(
            html.section(
                "Parameter importances",
                html.image(
                    plots.horizontal_bars(
                        result["importances"], "importance (PED-ANOVA)", "What mattered"
                    ),
                    "parameter importances",
                ),
            )
        )
    rows = result["rows"]
    if rows:
        columns = list(rows[0].keys())
        sections.append(
            html.section(
                "Trials",
                html.table(
                    columns,
                    [[row.get(c) for c in columns] for row in rows],
                    caption="also in trials.csv",
                ),
            )
        )
    failures = [t for t in result["trials"] if t["infeasible_reason"]]
    sections.append(
        html.section(
            "Failed configurations",
            html.table(
                ["trial", "server knobs", "reason"],
                [[t["number"], _knobs(t["knobs"]), t["infeasible_reason"]] for t in failures],
            )
            if failures
            else html.paragraph("Every configuration tried started and held up."),
        )
    )
    sections.append(
        html.section(
            "Study",
            html.definition_list(
                [
                    ("study", result["study"]),
                    (
                        "target",
                        f"{result['target']['kind']} {' '.join(result['target']['args'])}".strip(),
                    ),
                    ("storage", result["storage"]),
                    (
                        "trials",
                        f"{len(result['trials'])} finished ({result['trials_reused']} reused)",
                    ),
                    ("probe time", f"{result['probe_s_total']:.0f} s"),
                    ("autotune", result["machine"]["autotune"]),
                ]
            ),
        )
    )
    banner = None
    if result["simulated"]:
        banner = "SIMULATED — measured on autotune's simulated vLLM-like server, not real hardware"
    return html.page(
        f"autotune sweep: {result['study']}",
        sections,
        banner=banner,
        subtitle="Rebuilt from sweep.json; `autotune report DIR` renders it again.",
    )


def _knobs(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "(client only)"


def _recommendation_section(result: dict[str, Any]) -> str:
    recommendation = result["recommendation"]
    if recommendation is None:
        return html.section(
            "Recommendation",
            html.callout(
                "No configuration was feasible: see the failed configurations below.", "warning"
            ),
        )
    rec, peak = recommendation["recommended"], recommendation["peak"]
    text = (
        f"Recommended: parallelism {rec['parallelism']} with {_knobs(recommendation['server'])}"
        f" — predicted {rec['predicted_throughput']:.3g} {recommendation['metric']} "
        f"(peak {peak['throughput']:.3g} at parallelism {peak['parallelism']:.0f})."
    )
    snippets = recommendation["snippets"]
    return html.section(
        "Recommendation",
        html.callout(text, "verdict"),
        *(
            []
            if peak["inside_searched_range"]
            else [html.callout(recommendation["note"], "warning")]
        ),
        html.definition_list(
            [
                ("NeMo Gym", snippets["nemo_gym"]),
                ("vLLM", snippets["vllm"]),
                ("OpenRLHF", f"{snippets['openrlhf']} ({snippets['openrlhf_note']})"),
                ("knee", f"parallelism {recommendation['knee_parallelism']:.0f}"),
                (
                    "smallest parallelism at 80% of peak throughput",
                    str(recommendation["smallest_parallelism_at_80pct_of_peak_throughput"]),
                ),
            ]
        ),
    )


def write(result: dict[str, Any], directory: Path) -> Path:
    return html.write_report(directory, render(result))
