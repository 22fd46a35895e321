"""What `autotune bench compare` writes: JUnit XML, a Markdown table, an HTML report, each
drawn from one Comparison of saved results. Why: docs/design/bench.md.
"""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from autotune.bench.compare import (
    COULD_NOT_RUN,
    NOT_COMPARABLE,
    REGRESSION,
    UNCHANGED,
    AbRecord,
    Comparison,
    Verdict,
)
from autotune.bench.records import BenchResults
from autotune.report import html

_NEEDS_ACTION = (REGRESSION, COULD_NOT_RUN, NOT_COMPARABLE)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _figure(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return f"{text} {unit}".strip()


def _percent(share: float) -> str:
    """99% as "99%", an A/B's corrected 99.875% as "99.88%"."""
    return f"{share * 100:.4g}%"


def _columns(c: Comparison) -> list[str]:
    interval = f"{_percent(c.confidence)} interval"
    return ["case", "metric", "baseline", "now", "ratio", interval, "p-value", "verdict"]


def _cells(v: Verdict) -> list[str]:
    """One row of the verdict table, as text: the same in Markdown and HTML."""
    interval = f"{v.interval[0]:.3f}–{v.interval[1]:.3f}" if v.interval else "—"
    return [
        v.case,
        v.metric,
        _figure(v.baseline_median, v.unit),
        _figure(v.median, v.unit),
        "—" if v.ratio is None else f"{v.ratio:.3f}",
        interval,
        "—" if v.p_value is None else f"{v.p_value:.2g}",
        v.verdict,
    ]


def run_summary(results: BenchResults) -> str:
    """What `bench run` prints: each case's medians, or why it could not run."""
    from autotune.bench.significance import median

    lines = []
    for case in results.cases:
        if case.error is not None:
            lines.append(f"{case.name}: could not run: {case.error}")
        for name, metric in case.metrics.items():
            low, high = min(metric.samples), max(metric.samples)
            lines.append(
                f"{case.name} / {name}: median {_figure(median(metric.samples), metric.unit)} "
                f"(range {low:.4g}–{high:.4g}, {len(metric.samples)} repetitions, "
                f"{case.wall_s:.0f} s)"
            )
    return "\n".join(lines)


def headline(c: Comparison) -> str:
    return f"autotune bench: {c.summary} (exit {c.exit_code})"


def _verdict_sentence(c: Comparison) -> str:
    """The callout: what needs a look, by name, or that nothing does."""
    for kind in _NEEDS_ACTION:
        named = [f"{v.case} / {v.metric}" for v in c.verdicts if v.verdict == kind]
        if named:
            return f"{kind.capitalize()}: {', '.join(named)}."
    return (
        "No regression: every case and metric is within its threshold or not significantly changed."
    )


def _rule(c: Comparison) -> str:
    if c.ab is not None:
        return (
            f"A regression is a fall of the pairs' ratio (the geometric mean of candidate ÷ "
            f"baseline, pair by pair) by more than the case's threshold with "
            f"p < {c.level:.2g} (paired two-sided t test on the log ratios); "
            f"the interval is the ratio's {_percent(c.confidence)} t interval."
        )
    return (
        f"A regression is a fall of the median by more than the case's threshold with "
        f"p < {c.alpha:g} (exact two-sided Mann-Whitney U); the interval is a "
        f"{1 - c.alpha:.0%} bootstrap interval of the ratio now ÷ baseline."
    )


def _notes(c: Comparison) -> list[str]:
    """Why each verdict that needs a word has it, and the settings that changed."""
    notes = [
        f"{v.case} / {v.metric}: {v.reason}"
        for v in c.verdicts
        if v.verdict != UNCHANGED or (v.ratio is not None and abs(v.ratio - 1) > v.threshold)
    ]
    seen: set[str] = set()
    for v in c.verdicts:
        if v.settings_changed and v.case not in seen:
            seen.add(v.case)
            notes.append(
                f"{v.case}: settings differ from the baseline's (compared all the same): "
                + "; ".join(v.settings_changed)
            )
    return notes


def _measured(c: Comparison) -> str:
    """What was compared with what: two saved files, or two sides measured in one run."""
    if c.ab is None:
        return (
            f"`{c.results}` ({_when(c.created_at)}) against the baseline `{c.baseline}` "
            f"({_when(c.baseline_created_at)})."
        )
    return (
        f"A/B in one run on this machine: the candidate `{c.ab.candidate}` beside the "
        f"baseline `{c.ab.baseline}`, interleaved, {c.ab.pairs} pairs in "
        f"{c.ab.wall_s:.0f} s ({c.ab.stopped}); it could stop at {c.ab.looks} points, so "
        f"each tests at p < {c.level:.2g} (alpha ÷ {c.ab.looks})."
    )


def _faster(c: Comparison) -> list[str]:
    """Which side is faster on each metric (an interval clear of 1 and p < alpha), by how
    much, with the interval that says so."""
    lines = []
    for v in c.verdicts:
        if v.ratio is None or v.interval is None:
            continue
        low, high = v.interval
        shown = (
            f"candidate ÷ baseline {v.ratio:.3f}, {_percent(c.confidence)} interval "
            f"{low:.3f}–{high:.3f}"
        )
        significant = v.p_value is not None and v.p_value < c.level
        if low > 1 and significant:
            lines.append(
                f"{v.case} / {v.metric}: the candidate is faster by {v.ratio - 1:.1%} ({shown})."
            )
        elif high < 1 and significant:
            lines.append(
                f"{v.case} / {v.metric}: the baseline is faster by {1 / v.ratio - 1:.1%} ({shown})."
            )
        else:
            lines.append(f"{v.case} / {v.metric}: neither side is clearly faster ({shown}).")
    return lines


def _pair_lines(ab: AbRecord) -> list[str]:
    """Each metric's candidate ÷ baseline, pair by pair."""
    return [
        f"{name}, candidate ÷ baseline by pair: " + ", ".join(f"{r:.3f}" for r in ratios)
        for name, ratios in ab.pair_ratios.items()
    ]


def markdown(c: Comparison) -> str:
    """A table with the ratio and p-value of each case and metric, then the notes."""

    def row(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    lines = [f"## {headline(c)}", "", _measured(c) + " " + _rule(c), ""]
    lines += [
        row(_columns(c)),
        "| --- | --- | ---: | ---: | ---: | --- | ---: | --- |",
        *(row(_marked(_cells(v))) for v in c.verdicts),
    ]
    if c.ab is not None:
        lines += ["", *(f"- {line}" for line in [*_faster(c), *_pair_lines(c.ab)])]
    notes = _notes(c)
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def _marked(cells: list[str]) -> list[str]:
    """Markdown: a verdict that needs action in bold, so it stands out in a long table."""
    verdict = cells[-1]
    return [*cells[:-1], f"**{verdict}**" if verdict in _NEEDS_ACTION else verdict]


def append_step_summary(text: str) -> Path | None:
    """Append to GitHub Actions' job summary when running there ($GITHUB_STEP_SUMMARY)."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as out:
        out.write(text + "\n")
    return path


def junit_xml(c: Comparison) -> str:
    """A testsuite with a testcase per case and metric: a regression is a failure, a case
    that could not run or cannot be compared is an error, anything else passes."""
    failures = c.count(REGRESSION)
    errors = c.count(NOT_COMPARABLE) + c.count(COULD_NOT_RUN)
    counts = {
        "tests": str(len(c.verdicts)),
        "failures": str(failures),
        "errors": str(errors),
        "skipped": "0",
    }
    root = ET.Element("testsuites", {"name": "autotune bench", **counts})
    host = c.history[-1].host if c.history else ""
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": f"autotune bench {c.results}",
            **counts,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(c.created_at)),
            "hostname": host,
        },
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (("baseline", c.baseline), ("alpha", f"{c.alpha:g}"),
                        ("exit_code", str(c.exit_code))):  # fmt: skip
        ET.SubElement(properties, "property", {"name": name, "value": value})
    for v in c.verdicts:
        case = ET.SubElement(suite, "testcase", {"classname": f"bench.{v.case}", "name": v.metric})
        message = f"{v.verdict}: {v.reason}"
        if v.verdict == REGRESSION:
            ET.SubElement(
                case, "failure", {"message": message, "type": "regression"}
            ).text = _samples_text(v)
        elif v.verdict in (NOT_COMPARABLE, COULD_NOT_RUN):
            ET.SubElement(case, "error", {"message": message, "type": v.verdict.replace(" ", "-")})
        ET.SubElement(case, "system-out").text = f"{message}\n{_samples_text(v)}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _samples_text(v: Verdict) -> str:
    def listed(values: tuple[float, ...]) -> str:
        return ", ".join(f"{x:.4g}" for x in values) or "none"

    ratio = "—" if v.ratio is None else f"{v.ratio:.3f}"
    p_value = "—" if v.p_value is None else f"{v.p_value:.2g}"
    return (
        f"ratio {ratio}, p-value {p_value}, threshold {v.threshold:.0%}\n"
        f"baseline samples ({v.unit}): {listed(v.baseline_samples)}\n"
        f"samples now ({v.unit}): {listed(v.samples)}"
    )


def html_report(c: Comparison) -> str:
    """The self-contained page: verdicts, notes, samples, the history of runs, environment."""
    sections = [
        html.callout(_verdict_sentence(c), "verdict" if c.exit_code == 0 else "warning"),
        html.section(
            "Verdicts",
            html.paragraph(_rule(c)),
            html.table(_columns(c), [_cells(v) for v in c.verdicts]),
            *(html.paragraph(note) for note in _notes(c)),
        ),
    ]
    compared = [v for v in c.verdicts if v.samples and v.baseline_samples]
    if compared:
        sections.append(
            html.section(
                "Samples",
                html.paragraph("Every measured repetition, baseline beside now."),
                *(_samples_plot(v) for v in compared),
            )
        )
    if len(c.history) > 1:
        sections.append(_history(c))
    sections.append(_environment(c))
    simulated = any(fp.get("server") == "simulated" for fp in c.fingerprints.values())
    return html.page(
        headline(c),
        sections,
        banner="SIMULATED — some cases ran on autotune's simulated server, not real hardware"
        if simulated
        else None,
        subtitle=f"{c.results} against the baseline {c.baseline}",
    )


def _samples_plot(v: Verdict) -> str:
    from autotune.report import plots

    series = {
        "baseline": (range(1, len(v.baseline_samples) + 1), v.baseline_samples),
        "now": (range(1, len(v.samples) + 1), v.samples),
    }
    png = plots.time_series(series, v.unit, f"{v.case} / {v.metric}", xlabel="repetition")
    return html.image(png, alt=f"samples of {v.case} {v.metric}, baseline and now")


def _history(c: Comparison) -> str:
    from autotune.report import plots

    keys = sorted({key for run in c.history for key in run.medians})
    rows = [
        [_when(run.created_at), run.host, *(run.medians.get(key) for key in keys)]
        for run in c.history
    ]
    rows.append(["baseline", "", *(c.baseline_medians.get(key) for key in keys)])
    images = []
    for key in keys:
        points = [(i, run.medians[key]) for i, run in enumerate(c.history, 1) if key in run.medians]
        series = {"median": ([i for i, _ in points], [m for _, m in points])}
        if key in c.baseline_medians:
            series["baseline"] = ([1, len(c.history)], [c.baseline_medians[key]] * 2)
        images.append(
            html.image(
                plots.time_series(series, "median", key, xlabel="run (oldest first)"),
                alt=f"history of {key}",
            )
        )
    return html.section(
        "History",
        html.paragraph(f"The medians of the {len(c.history)} runs given, oldest first."),
        html.table(["run", "host", *keys], rows),
        *images,
    )


def _environment(c: Comparison) -> str:
    items = [
        ("results", f"{c.results} ({_when(c.created_at)})"),
        ("baseline", f"{c.baseline} ({_when(c.baseline_created_at)})"),
        ("baseline made because", c.baseline_reason or "—"),
        ("fingerprint fields ignored", ", ".join(c.ignored) or "none"),
    ]
    for case, fp in c.fingerprints.items():
        items.append((case, "; ".join(f"{key} {value}" for key, value in fp.items())))
    return html.section("Environment", html.definition_list(items))


def write_html(c: Comparison, directory: Path) -> Path:
    return html.write_report(directory, html_report(c))
