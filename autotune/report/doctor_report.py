"""`autotune doctor`'s outputs from its saved result: the terminal text, and a page with
the steps as stacked bars by phase, the verdict and its evidence, and the remedies."""

from __future__ import annotations

from pathlib import Path

from autotune.report import html, plots
from autotune.results.codec import save
from autotune.results.diagnosis import quantity
from autotune.results.doctor import DoctorResult, PhaseFigure, Remedy

RESULT_FILE = "doctor.json"
MAX_BARS = 60  # steps drawn one bar each; a longer run is drawn in as many groups


def _interval(figure: PhaseFigure) -> str:
    if figure.low_s is None or figure.high_s is None:
        return "(one step)"
    return f"({quantity(figure.low_s)}–{quantity(figure.high_s)})"


def _remedy_range(remedy: Remedy) -> str:
    return (
        f"{quantity(remedy.step_s)} s ({quantity(remedy.low_s)}–{quantity(remedy.high_s)}), "
        f"×{remedy.gain:.2f} (×{remedy.gain_low:.2f}–×{remedy.gain_high:.2f})"
    )


def doctor_text(result: DoctorResult) -> str:
    """The terminal summary: the phases at steady state, the bound, the remedies."""
    lines = [
        f"run        {result.source}",
        f"read as    {result.format}, {len(result.steps)} step(s)",
        f"warm-up    {result.warmup_rule}",
        f"step       {quantity(result.step.mean_s)} s {_interval(result.step)}",
        "",
        f"{'phase':<14}{'s a step':>12}  {'share':>7}  95% interval over the steps",
    ]
    for figure in result.phases:
        lines.append(
            f"{figure.phase:<14}{quantity(figure.mean_s):>12}  {figure.share:>7.1%}  "
            f"{_interval(figure)}"
        )
    tail = result.tail
    if tail.max_over_mean is not None or tail.slowest_over_mean is not None:
        parts = []
        if tail.max_over_mean is not None:
            parts.append(f"longest response ×{tail.max_over_mean:.2f} the mean")
        if tail.clip_ratio is not None:
            parts.append(f"{tail.clip_ratio:.1%} cut at the limit")
        if tail.slowest_over_mean is not None:
            parts.append(f"slowest sample's generation ×{tail.slowest_over_mean:.2f} the mean")
        lines += ["", "tail       " + ", ".join(parts)]
    lines += ["", f"verdict    {result.verdict} ({result.confidence})"]
    lines += [f"  {evidence.text()}" for evidence in result.evidence]
    if result.remedies:
        lines += ["", "remedies, best predicted first (step time, gain over today's):"]
        for remedy in result.remedies:
            lines.append(f"  {remedy.name}: {_remedy_range(remedy)}")
            lines.append(f"    predicted: {remedy.basis}")
            lines += [f"    {name:<9}{line}" for name, line in remedy.lines.items()]
    if result.notes:
        lines += ["", *[f"note: {note}" for note in result.notes]]
    return "\n".join(lines)


def render(result: DoctorResult) -> str:
    """The whole page."""
    phases = [figure.phase for figure in result.phases]
    steps = result.steps
    group = max(1, -(-len(steps) // MAX_BARS))
    bars = [steps[i : i + group] for i in range(0, len(steps), group)]
    labels = [
        str(chunk[0].index) if group == 1 else f"{chunk[0].index}–{chunk[-1].index}"
        for chunk in bars
    ]
    series = {
        phase: [
            sum(max(0.0, s.phases.get(phase, 0.0)) for s in chunk) / len(chunk) for chunk in bars
        ]
        for phase in phases
    }
    verdict = f"{result.verdict} ({result.confidence}): step {quantity(result.step.mean_s)} s"
    sections = [
        html.section(
            "Verdict",
            html.callout(verdict, "verdict"),
            html.table(
                ["check", "measured", "threshold", "met", "meaning"],
                [
                    [
                        e.name,
                        quantity(e.value, e.unit),
                        f"{e.comparison} {quantity(e.threshold, e.unit)}",
                        "yes" if e.met else "no",
                        e.meaning,
                    ]
                    for e in result.evidence
                ],
            ),
        ),
        html.section(
            "Where the step time goes",
            html.image(
                plots.bar_chart_stacked(labels, series, "seconds a step", "Steps by phase"),
                "each step's seconds, stacked by phase",
                caption=f"warm-up: {result.warmup_rule}",
            ),
            html.table(
                ["phase", "s a step", "share", "95% low", "95% high", "the run's metrics"],
                [
                    [f.phase, f.mean_s, f"{f.share:.1%}", f.low_s, f.high_s, ", ".join(f.names)]
                    for f in [*result.phases, result.step]
                ],
            ),
        ),
        html.section("Remedies, best predicted first", *_remedy_parts(result.remedies)),
        html.section(
            "The run",
            html.definition_list(
                [
                    ("file", result.source),
                    ("read as", result.format),
                    ("steps", str(len(result.steps))),
                    *[("note", n) for n in result.notes],
                ]
            ),
        ),
    ]
    return html.page("autotune doctor", sections, subtitle=result.source)


def _remedy_parts(remedies: list[Remedy]) -> list[str]:
    if not remedies:
        return [html.paragraph("No remedy applies with what the log and the flags say.")]
    table = html.table(
        ["remedy", "step s", "95% low", "95% high", "gain", "predicted from"],
        [[r.name, r.step_s, r.low_s, r.high_s, f"×{r.gain:.2f}", r.basis] for r in remedies],
    )
    details = [
        html.definition_list(
            [
                ("remedy", r.name),
                *[("assumes", a) for a in r.assumptions],
                *[(framework, line) for framework, line in r.lines.items()],
            ]
        )
        for r in remedies
    ]
    return [table, *details]


def write(result: DoctorResult, directory: Path) -> Path:
    return html.write_report(directory, render(result))


def write_outputs(result: DoctorResult, directory: Path) -> list[Path]:
    """doctor.json, then index.html rebuilt from it (also what `autotune report` calls)."""
    saved = save(result, directory / RESULT_FILE)
    return [saved, write(result, directory)]
