"""The sweep report, built only from a saved study result (sweep.json) and the
recommendation computed from it (passed in: this package never imports the jobs).

Numbers first (pure functions below), then drawing through report.plots.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from autotune.engines import ENGINES
from autotune.engines.description import OPTIONS_FILE
from autotune.knee import UslFit
from autotune.report import html, plots
from autotune.report.columns import Column, html_table
from autotune.results.diagnosis import quantity
from autotune.results.trials import (
    CEILING_RULE,
    HEADROOM_RULE,
    Recommendation,
    Recommended,
    SweepResult,
    TrialRecord,
    Validation,
)

TOP_CURVES = 3
CURVE_SAMPLES = 60


def _knob(name: str) -> Column[TrialRecord]:
    return Column(name, lambda t: t.knobs.get(name))


def trial_columns(result: SweepResult) -> tuple[Column[TrialRecord], ...]:
    """The trials table (the report's and trials.csv): trial, state, every knob any
    trial set, then what was measured."""
    knobs = dict.fromkeys(name for trial in result.trials for name in trial.knobs)
    steps = any(trial.batch for trial in result.trials)
    return (
        Column("trial", lambda t: t.number),
        Column("state", lambda t: t.state),
        Column("copy_of", lambda t: t.copied_from),
        *(_knob(name) for name in knobs),
        Column("value", lambda t: t.value, digits=3),
        Column("roofline_pct", lambda t: _percent(t.roofline_share), digits=3),
        Column("feasible", lambda t: t.feasible),
        Column(
            "peak_parallelism",
            lambda t: t.curve.peak_parallelism if t.curve else None,
            digits=3,
        ),
        Column(
            "recommended_parallelism",
            lambda t: t.curve.recommended_parallelism if t.curve else None,
        ),
        Column("p95_latency_s", lambda t: t.p95_latency_s, digits=3),
        *(STEP_COLUMNS if steps else ()),
        Column("probe_s", lambda t: t.probe_s, digits=3),
        Column("wall_s", lambda t: t.wall_s, digits=3),
        Column("infeasible_reason", lambda t: t.infeasible_reason),
        Column("pruned_reason", lambda t: t.pruned_reason),
    )


# A goodput study's trials: their training steps (the value is informative groups/s).
STEP_COLUMNS: tuple[Column[TrialRecord], ...] = (
    Column("step_p95_s", lambda t: t.batch.step_s.p95 if t.batch else None, digits=3),
    Column("busy_pct", lambda t: _percent(t.batch.busy_share if t.batch else None), digits=3),
    Column("tail_pct", lambda t: _percent(t.batch.tail_share if t.batch else None), digits=3),
    Column("cancelled_tokens", lambda t: t.batch.cancelled_tokens if t.batch else None),
    Column("staleness_mean", lambda t: t.batch.staleness_mean if t.batch else None, digits=3),
)


def _percent(share: float | None) -> float | None:
    return None if share is None else 100 * share


@dataclass(frozen=True, slots=True)
class SplitRow:
    """One way the GPU budget was split (engines × TP): its best trial, and its best
    with prefix caching on and off where both were tried. A split whose every trial was
    pruned shows the most it measured before being stopped (`whole`: False)."""

    split: str
    value: float
    trial: int
    whole: bool
    roofline_share: float | None
    caching_on: float | None
    caching_off: float | None


def split_rows(result: SweepResult) -> list[SplitRow]:
    """Each split a feasible trial ran, best first (empty unless a budget was split);
    a whole curve outranks one stopped early within a split."""
    best: dict[str, TrialRecord] = {}
    caching: dict[tuple[str, bool], float] = {}

    def rank(trial: TrialRecord) -> tuple[bool, float]:
        return trial.complete, trial.value or 0.0

    for trial in result.completed + result.pruned:
        split = trial.split
        if split is None or not trial.feasible:
            continue
        if split not in best or rank(trial) > rank(best[split]):
            best[split] = trial
        if "enable_prefix_caching" in trial.knobs and trial.complete:
            on, value = bool(trial.knobs["enable_prefix_caching"]), trial.value or 0.0
            caching[split, on] = max(caching.get((split, on), 0.0), value)
    rows = [
        SplitRow(
            split,
            trial.value or 0.0,
            trial.number,
            trial.complete,
            trial.roofline_share,
            caching.get((split, True)),
            caching.get((split, False)),
        )
        for split, trial in best.items()
    ]
    return sorted(rows, key=lambda row: (row.whole, row.value), reverse=True)


SPLIT_COLUMNS: tuple[Column[SplitRow], ...] = (
    Column("engines × TP", lambda r: r.split),
    Column("best", lambda r: r.value, digits=3),
    Column("trial", lambda r: r.trial),
    Column("curve", lambda r: "whole" if r.whole else "stopped early"),
    Column("roofline %", lambda r: _percent(r.roofline_share), digits=3),
    Column("caching on", lambda r: r.caching_on, digits=3),
    Column("caching off", lambda r: r.caching_off, digits=3),
)


def roofline_text(share: float | None) -> str | None:
    """`62% of the hardware's roofline`, or None when it is unknown."""
    return None if share is None else f"{share:.0%} of the hardware's roofline"


def gpu_rows(recommended: Recommendation) -> list[tuple[str, str]]:
    """The recommendation's GPU plan as definition rows: engines × TP with each engine's
    share of the parallelism, prefix caching and what it bought, the roofline share."""
    rows = []
    rec = recommended.recommended
    if recommended.engines > 1 or recommended.tensor_parallel_size is not None:
        rows.append(
            (
                "engines × TP",
                f"{recommended.engines} × TP {recommended.tensor_parallel_size or 1}: "
                f"parallelism {rec.parallelism} in all, {recommended.parallelism_per_engine} "
                "per engine",
            )
        )
    if recommended.enable_prefix_caching is not None:
        text = "on" if recommended.enable_prefix_caching else "off"
        gain = recommended.prefix_caching
        if gain is not None:
            text += (
                f" (measured at {gain.split}: {quantity(gain.on)} with it, "
                f"{quantity(gain.off)} without, ×{gain.gain:.2f})"
            )
        rows.append(("prefix caching", text))
    roofline = roofline_text(recommended.roofline_share)
    if roofline is not None:
        rows.append(("roofline", roofline))
    return rows


FAILURE_COLUMNS: tuple[Column[TrialRecord], ...] = (
    Column("trial", lambda t: t.number),
    Column("server knobs", lambda t: knobs_text(t.knobs)),
    Column("reason", lambda t: t.infeasible_reason),
)


def top_trials(result: SweepResult, count: int = TOP_CURVES) -> list[TrialRecord]:
    """The best feasible trials with a fitted curve, best first."""
    feasible = [t for t in result.completed if t.feasible and t.curve]
    return sorted(feasible, key=lambda t: t.value or 0.0, reverse=True)[:count]


def knee_curves(
    result: SweepResult,
) -> dict[str, tuple[list[float], list[float], list[float], list[float]]]:
    """Measured points and fitted USL lines of the best configurations, one curve a
    configuration (a configuration tried twice is drawn once, from its best trial)."""
    curves = {}
    seen: set[str] = set()
    for trial in top_trials(result, len(result.trials)):
        configuration = knobs_text(trial.knobs)
        if configuration in seen:
            continue
        seen.add(configuration)
        if len(seen) > TOP_CURVES:
            break
        points = [p for p in trial.points if p.error_rate <= result.max_error_rate]
        xs = [float(p.parallelism) for p in points]
        ys = [p.metric(result.metric) for p in points]
        fit = trial.curve.fit if trial.curve else None
        line_x: list[float] = []
        line_y: list[float] = []
        if fit:
            usl = UslFit(fit["lambda"], fit["sigma"], fit["kappa"], fit["r2"])
            low, high = min(xs) / 2, max(xs) * 1.5  # the measured range, not a guess below it
            line_x = [low * (high / low) ** (i / (CURVE_SAMPLES - 1)) for i in range(CURVE_SAMPLES)]
            line_y = [usl.throughput(x) for x in line_x]
        curves[f"trial {trial.number}: {configuration}"] = (xs, ys, line_x, line_y)
    return curves


def knee_marks(recommended: Recommendation) -> tuple[dict[str, float], tuple[str, float]]:
    """The knee plot's labelled lines: the peak, the knee and the recommended parallelism
    (80% of the peak *parallelism*) as vertical lines, and 80% of the peak *throughput*
    as a horizontal one, each saying which it is."""
    peak, rec = recommended.peak, recommended.recommended
    unit = recommended.metric.replace("_per_s", "/s").replace("_", " ")
    marks = {
        f"peak: parallelism {peak.parallelism:.0f}": peak.parallelism,
        f"knee: parallelism {recommended.knee_parallelism:.0f}": recommended.knee_parallelism,
        f"recommended: parallelism {rec.parallelism} = {_bound(rec)}": float(rec.parallelism),
    }
    if (other := recommended.alternative) is not None:
        marks[f"instead: parallelism {other.parallelism} = {_bound(other)}"] = float(
            other.parallelism
        )
    level = 0.8 * peak.throughput
    return marks, (f"80% of the peak throughput: {quantity(level)} {unit}", level)


def _bound(rec: Recommended) -> str:
    """Which rule set the recommended parallelism, in words."""
    if rec.bound_by == HEADROOM_RULE:
        return "80% of the peak parallelism"
    if rec.bound_by == CEILING_RULE:
        return "the server's ceiling (it runs no more at once)"
    if rec.bound_by == "validation":
        return "stepped down after a failed validation run"
    return f"the largest parallelism within the {rec.bound_by}"


def alternative_text(recommended: Recommendation, number: Callable[[float], str]) -> str | None:
    """The rule the study did not choose, its parallelism and predicted throughput against
    the recommendation's (`+9.8%`: what running full would gain); None without one."""
    other, rec = recommended.alternative, recommended.recommended
    if other is None:
        return None
    change = ""
    if rec.predicted_throughput > 0:
        gain = other.predicted_throughput / rec.predicted_throughput - 1
        change = f", {gain:+.1%} against the recommendation"
    return (
        f"parallelism {other.parallelism}, {_bound(other)} → "
        f"{number(other.predicted_throughput)} predicted{change}"
    )


AT_LEAST_BAND = 2.0  # an open interval's band: from its lower end to twice it (log axis)


def interval_bands(recommended: Recommendation) -> dict[str, tuple[float, float]]:
    """The knee plot's bands: the 95% intervals of the peak, the knee and the
    recommended parallelism (those the bootstrap gave)."""
    bands = {}
    for name, interval in (
        ("peak parallelism, 95% interval", recommended.peak.parallelism_interval),
        ("knee, 95% interval", recommended.knee_interval),
        ("recommended parallelism, 95% interval", recommended.recommended.parallelism_interval),
    ):
        if interval is None or interval[0] == interval[1]:  # none, or no width to draw
            continue
        low, high = interval
        if math.isinf(high):  # open above: the band runs to the plot's edge
            bands[f"{name}: at least {low:.0f}"] = (low, low * AT_LEAST_BAND)
        else:
            bands[f"{name}: {low:.0f}–{high:.0f}"] = interval
    return bands


def pareto_points(
    result: SweepResult,
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Every usable measured point of every trial as (p95 latency, throughput), and the
    Pareto front among them: the points no other point beats on both, by latency."""
    points = sorted(
        (p.p95_latency_s, p.metric(result.metric))
        for trial in result.trials
        for p in trial.points
        if p.error_rate <= result.max_error_rate and p.p95_latency_s
    )
    front: list[tuple[float, float]] = []
    for latency, throughput in points:
        if not front or throughput > front[-1][1]:
            front.append((latency, throughput))
    return points, front


VALIDATION_COLUMNS: tuple[Column[Validation], ...] = (
    Column("parallelism", lambda v: v.parallelism),
    Column("rollouts", lambda v: v.completed),
    Column("throughput", lambda v: v.throughput, digits=3),
    Column("predicted (95%)", lambda v: _predicted(v)),
    Column("error rate", lambda v: v.error_rate, digits=3),
    Column("p95 latency s", lambda v: v.p95_latency_s, digits=3),
    Column("p95 ÷ p50", lambda v: v.latency_dispersion, digits=3),
    Column("machine speed", lambda v: v.machine_speed, digits=3),
    Column("passed", lambda v: v.passed),
    Column("problems", lambda v: "; ".join(v.problems)),
)


def _predicted(run: Validation) -> str:
    """What the sweep predicted for a validation run, with its 95% interval."""
    if run.predicted_interval is None:
        return quantity(run.predicted_throughput)
    low, high = run.predicted_interval
    return f"{quantity(run.predicted_throughput)} ({quantity(low)}–{quantity(high)})"


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


def curve_sections(result: SweepResult, recommended: Recommendation | None) -> list[str]:
    """A curve study's recommendation, and its knee plot over the best curves."""
    metric = result.metric.replace("_per_s", "/s").replace("_", " ")
    simulated = result.simulated
    sections = [_recommendation_section(recommended)]
    curves = knee_curves(result)
    if curves and recommended is not None:
        marks, level = knee_marks(recommended)
        sections.append(
            html.section(
                "Throughput versus parallelism",
                html.svg(
                    plots.curves_with_marks(
                        curves,
                        marks,
                        level,
                        "client parallelism",
                        metric,
                        "Knee plot (best configurations)",
                        key="knee",
                        simulated=simulated,
                        bands=interval_bands(recommended),
                    ),
                    "throughput versus parallelism with fitted curves, peak, knee and 80% lines",
                ),
                html.paragraph(
                    f"The recommended parallelism is {_bound(recommended.recommended)}; "
                    "where a curve peaks and turns down, 80% of the peak parallelism (the "
                    "NeMo Gym guide's headroom). The horizontal line is 80% of the peak "
                    "throughput, a different figure: the smallest parallelism reaching it is "
                    f"{recommended.smallest_parallelism_at_80pct_of_peak_throughput}."
                ),
                html.paragraph(recommended.note),
            )
        )
    return sections


class Presenter(Protocol):
    """How a study's objective shows its recommendation (sweep/objectives)."""

    def report_sections(self, result: SweepResult, recommended: Any) -> list[str]: ...

    def validation_note(self, verdict: str) -> str: ...


def render(result: SweepResult, recommended: Any, presenter: Presenter) -> str:
    metric = result.metric.replace("_per_s", "/s").replace("_", " ")
    simulated = result.simulated
    sections = presenter.report_sections(result, recommended)
    splits = split_rows(result)
    if splits:
        sections.append(
            html.section(
                "GPU splits",
                html.paragraph(
                    "How the GPU budget was split into engines × tensor-parallel size: each "
                    "split's best trial, its share of the hardware's roofline (every engine's "
                    "batch at its fastest step), and its best with prefix caching on and off "
                    "(whole curves only). A split stopped early could not reach the best "
                    "one: its figure is the most it measured before it was stopped."
                ),
                html_table(SPLIT_COLUMNS, splits),
            )
        )
    sections += _latency_sections(result, recommended, metric, presenter)
    if result.completed:
        sections.append(
            html.section(
                "Optimisation history",
                html.image(
                    plots.time_series(
                        history(result),
                        metric,
                        "Objective by trial",
                        xlabel="trial",
                        simulated=simulated,
                        integer_x=True,
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
                        result.importances,
                        "importance (PED-ANOVA)",
                        "What mattered",
                        simulated=simulated,
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
                        f"{len(result.completed)} finished, {len(result.pruned)} pruned "
                        f"({result.trials_reused} reused)",
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


def knobs_text(knobs: dict[str, Any]) -> str:
    """A configuration's knobs as `name=value` pairs."""
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "(client only)"


def figure_text(value: float | None) -> str:
    """A figure as the report shows quantities, "-" for none."""
    return "-" if value is None else quantity(value)


def share_text(share: float | None) -> str:
    """A share as a whole percentage, "-" for none."""
    return "-" if share is None else f"{share:.0%}"


def _latency_sections(
    result: SweepResult, recommended: Any, metric: str, presenter: Presenter
) -> list[str]:
    """The Pareto plot of throughput against p95 latency, and the validation runs."""
    sections = []
    points, front = pareto_points(result)
    if points:
        slo = f" (SLO: {result.p95_latency_slo_s:g} s)" if result.p95_latency_slo_s else ""
        sections.append(
            html.section(
                "Throughput against p95 latency",
                html.svg(
                    plots.pareto(
                        points,
                        front,
                        "p95 rollout latency (s)",
                        metric,
                        f"Every measured point, the Pareto front marked{slo}",
                        key="pareto",
                        simulated=result.simulated,
                    ),
                    "throughput against p95 latency of every measured point, front marked",
                ),
            )
        )
    if recommended is not None and recommended.validations:
        verdict = "passed" if recommended.validated else "failed"
        sections.append(
            html.section(
                "Validation",
                html.paragraph(presenter.validation_note(verdict)),
                html_table(VALIDATION_COLUMNS, recommended.validations),
            )
        )
    return sections


def no_recommendation_section() -> str:
    """The report's first section when no configuration was feasible."""
    return html.section(
        "Recommendation",
        html.callout(
            "No configuration was feasible: see the failed configurations below.", "warning"
        ),
    )


def _recommendation_section(recommended: Recommendation | None) -> str:
    if recommended is None:
        return no_recommendation_section()
    rec, peak, snippets = recommended.recommended, recommended.peak, recommended.snippets
    unit = recommended.metric.replace("_per_s", "/s").replace("_", " ")
    roofline = roofline_text(recommended.roofline_share)
    text = (
        f"Recommended: parallelism {rec.parallelism} ({_bound(rec)}) with "
        f"{knobs_text(recommended.server)} — predicted {quantity(rec.predicted_throughput)} {unit} "
        f"(peak {quantity(peak.throughput)} {unit} at parallelism {peak.parallelism:.0f}"
        f"{f'; {roofline}' if roofline else ''})."
    )
    return html.section(
        "Recommendation",
        html.callout(text, "verdict"),
        *([] if peak.inside_searched_range else [html.callout(recommended.note, "warning")]),
        html.definition_list(
            [
                *gpu_rows(recommended),
                ("NeMo Gym", snippets.nemo_gym),
                (ENGINES[snippets.engine].title, snippets.serve),
                *snippets.frameworks.items(),
                *([(OPTIONS_FILE, snippets.options)] if snippets.options else []),
                *(
                    [("OpenRLHF", f"{snippets.openrlhf} ({snippets.openrlhf_note})")]
                    if snippets.engine == "vllm"
                    else []
                ),
                ("rule that set it", f"{rec.bound_by}: {rec.rule}"),
                *(
                    [("instead", alternative)]
                    if (alternative := alternative_text(recommended, quantity))
                    else []
                ),
                *_intervals(recommended),
                ("validated", validated_text(recommended, REPORT_VALIDATION)),
                ("knee", f"parallelism {recommended.knee_parallelism:.0f}"),
                (
                    "smallest parallelism at 80% of peak throughput",
                    str(recommended.smallest_parallelism_at_80pct_of_peak_throughput),
                ),
            ]
        ),
    )


def _intervals(recommended: Recommendation) -> list[tuple[str, str]]:
    """The 95% intervals the bootstrap of the fit gave, as definition rows."""
    rows = []
    for name, interval in (
        ("peak parallelism (95%)", recommended.peak.parallelism_interval),
        ("peak throughput (95%)", recommended.peak.throughput_interval),
        ("knee (95%)", recommended.knee_interval),
        ("recommended parallelism (95%)", recommended.recommended.parallelism_interval),
        ("predicted throughput there (95%)", recommended.recommended.throughput_interval),
    ):
        if interval is not None:
            rows.append((name, interval_text(interval)))
    return rows


def interval_text(interval: tuple[float, float]) -> str:
    """`12 – 30`, or `at least 256` for an interval with no upper end (a peak past the
    range measured), never a zero-width `256 – 256`: a rule every bootstrap draw gives
    the same number (the server's ceiling) says so."""
    low, high = interval
    if math.isinf(high):
        return f"at least {quantity(low)}"
    if low == high:
        return f"{quantity(low)} in every bootstrap draw"
    return f"{quantity(low)} – {quantity(high)}"


@dataclass(frozen=True, slots=True)
class ValidationWording:
    """How one output words the validation line: the report's page and the terminal's
    summary say the same thing, each in its own style (`validated_text` fills them in)."""

    not_run: str
    number: Callable[[float], str]  # the measured throughput
    held: str  # "{figures}" is replaced
    failed: str  # "{figures}" and "{problems}" are replaced


REPORT_VALIDATION = ValidationWording(
    not_run="not validated (budget.validate_rollouts: 0)",
    number=quantity,
    held="yes — {figures}",
    failed="no — {figures}; {problems}",
)


def validated_text(recommended: Recommendation, wording: ValidationWording) -> str:
    """Whether the last validation run held, with its figures and what failed: one
    reading of the runs for every output, so they cannot tell different stories."""
    if recommended.validated is None:
        return wording.not_run
    last = recommended.validations[-1]
    figures = (
        f"{last.completed} rollouts at parallelism {last.parallelism}: "
        f"{wording.number(last.throughput)}, error rate {last.error_rate:.1%}"
    )
    if last.machine_speed is not None and last.machine_speed != 1.0:
        figures += (
            f", judged against the prediction ×{last.machine_speed:.2f}: the sweep's nearest "
            "point measured again was that much slower (a busier machine)"
        )
    line = wording.held if recommended.validated else wording.failed
    return line.format(figures=figures, problems="; ".join(last.problems))


def write(result: SweepResult, recommended: Any, directory: Path, presenter: Presenter) -> Path:
    return html.write_report(directory, render(result, recommended, presenter))
