"""Drawing for the reports: computed numbers in, PNG bytes or inline SVG out.
Why: docs/design/report.md.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Timeline",
    "bar_chart_stacked",
    "curves_with_marks",
    "figure_png",
    "figure_svg",
    "horizontal_bars",
    "interval_against_thresholds",
    "lanes",
    "pareto",
    "probe_timelines",
    "throughput_with_bands",
    "time_series",
]

_SIZE = (9.0, 4.5)  # inches; at 110 dpi a plot fits the report's 1100 px column
_DPI = 110


def _new_figure(simulated: bool = False, size: tuple[float, float] = _SIZE) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    if simulated:  # faint, across the middle: no one mistakes it for a measured GPU
        fig.text(
            0.5,
            0.5,
            "SIMULATED",
            fontsize=min(48, 14 * size[1]),
            color="#9a3412",
            alpha=0.12,
            rotation=12,
            ha="center",
            va="center",
            zorder=0,
            gid="simulated-mark",
        )
    return fig


def figure_png(fig: Figure) -> bytes:
    """Render a figure to PNG bytes and close it (reports run many plots in one process)."""
    buffer = io.BytesIO()
    try:
        # No "Software" chunk: the same numbers give the same bytes on any matplotlib.
        fig.savefig(buffer, format="png", dpi=_DPI, metadata={"Software": None})
    finally:
        import sys

        if "matplotlib.pyplot" in sys.modules:  # only figures made through pyplot are kept
            sys.modules["matplotlib.pyplot"].close(fig)
        fig.clear()
    return buffer.getvalue()


def figure_svg(fig: Figure, key: str) -> str:
    """Render a figure to an inline <svg> element (no XML prolog, text kept as text) and
    close it. `key` salts matplotlib's own ids, so several figures share one page."""
    import matplotlib

    buffer = io.StringIO()
    try:
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": key}):
            fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    finally:
        fig.clear()
    text = buffer.getvalue()
    svg = text[text.index("<svg") :]
    # Sized by the page, not in points: it scales down to the column as an <img> would.
    return svg.replace("<svg ", f'<svg class="plot" id="{key}" ', 1)


def bar_chart_stacked(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    title: str,
    *,
    simulated: bool = False,
) -> bytes:
    """One stacked bar per category (e.g. per-stage latency per probe), one colour a series."""
    for name, values in series.items():
        if len(values) != len(categories):
            raise ValueError(
                f"series {name!r} has {len(values)} values for {len(categories)} categories"
            )
    fig = _new_figure(simulated)
    ax = fig.add_subplot()
    positions = list(range(len(categories)))
    bottom = [0.0] * len(categories)
    for name, values in series.items():
        heights = [float(v) for v in values]
        ax.bar(positions, heights, bottom=bottom, label=name, width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(positions, [str(c) for c in categories])
    if len(categories) > 6 or any(len(str(c)) > 12 for c in categories):
        ax.tick_params(axis="x", labelrotation=30)
    _finish(ax, ylabel, title, legend=bool(series), reverse=True)
    ax.grid(axis="x", visible=False)
    return figure_png(fig)


def time_series(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    ylabel: str,
    title: str,
    *,
    xlabel: str = "time (s)",
    marks: Mapping[str, float] | None = None,
    levels: Mapping[str, float] | None = None,
    simulated: bool = False,
    integer_x: bool = False,
) -> bytes:
    """One line per series of (x, y) points, e.g. telemetry sampled during a probe;
    `marks` are labelled vertical lines (an event's time), `levels` horizontal ones;
    `integer_x`: whole-number ticks only (trial numbers)."""
    fig = _new_figure(simulated)
    ax = fig.add_subplot()
    if integer_x:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r} has {len(xs)} x values and {len(ys)} y values")
        ax.plot(list(xs), list(ys), label=name, linewidth=1.5)
    for name, x in (marks or {}).items():
        ax.axvline(x, color="#b91c1c", linestyle="--", linewidth=1.2, label=name)
    for index, (name, y) in enumerate((levels or {}).items()):
        style = (":", "-.")[index % 2]
        ax.axhline(y, color="#6b7280", linestyle=style, linewidth=1.1, label=name)
    ax.set_xlabel(xlabel)
    _finish(ax, ylabel, title, legend=len(series) + len(marks or {}) + len(levels or {}) > 1)
    return figure_png(fig)


_LINE_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P")


def curves_with_marks(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]]],
    marks: Mapping[str, float],
    level: tuple[str, float] | None,
    xlabel: str,
    ylabel: str,
    title: str,
    *,
    key: str,
    simulated: bool = False,
    bands: Mapping[str, tuple[float, float]] | None = None,
) -> str:
    """Measured points and a fitted line per curve, on a log2 x axis, as inline SVG.

    `curves` maps a label to (point xs, point ys, line xs, line ys); each curve has its
    own colour, line style and marker, so curves that coincide stay visible (the later
    ones dashed over the first). `marks` are labelled vertical lines (peak, knee,
    recommended), `level` one labelled horizontal line; the legend sits below the plot,
    so long labels never squeeze it. `bands` are labelled vertical spans (the 95%
    intervals of the marks). Ids: `{key}-curve-{i}`, `{key}-mark-{i}`, `{key}-level`,
    `{key}-band-{i}`.
    """
    fig = _new_figure(simulated, (_SIZE[0], _SIZE[1] + 0.3 * (len(curves) + len(marks))))
    ax = fig.add_subplot()
    for index, (name, (low, high)) in enumerate((bands or {}).items()):
        ax.axvspan(
            low,
            max(high, low * 1.01),  # a zero-width interval still shows
            color=("#6b7280", "#1d4ed8", "#15803d")[index % 3],
            alpha=0.13,
            linewidth=0,
            label=name,
            gid=f"{key}-band-{index}",
        )
    for index, (name, (px, py, lx, ly)) in enumerate(curves.items()):
        colour, style = f"C{index}", _LINE_STYLES[index % len(_LINE_STYLES)]
        (line,) = ax.plot(
            list(lx), list(ly), color=colour, linestyle=style, linewidth=1.6, label=f"{name} (fit)"
        )
        line.set_gid(f"{key}-curve-{index}")
        ax.scatter(
            list(px),
            list(py),
            facecolors="none",
            edgecolors=colour,
            marker=_MARKERS[index % len(_MARKERS)],
            s=36,
            zorder=3,
            label=f"{name} (measured)",
        )
    for index, (name, x) in enumerate(marks.items()):
        ax.axvline(
            x,
            color="#374151",
            linestyle=_LINE_STYLES[1 + index % 3],
            linewidth=1.1,
            label=name,
            gid=f"{key}-mark-{index}",
        )
    if level is not None:
        ax.axhline(
            level[1],
            color="#b45309",
            linestyle="-",
            linewidth=1.0,
            label=level[0],
            gid=f"{key}-level",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    _finish(ax, ylabel, title, legend=True, below=True)
    return figure_svg(fig, key)


def pareto(
    points: Sequence[tuple[float, float]],
    front: Sequence[tuple[float, float]],
    xlabel: str,
    ylabel: str,
    title: str,
    *,
    key: str,
    simulated: bool = False,
) -> str:
    """Every measured point as (x, y) and, over them, the Pareto front (no other point
    has a lower x and a higher y) as a step line. Ids: `{key}-points`, `{key}-front`."""
    fig = _new_figure(simulated)
    ax = fig.add_subplot()
    ax.scatter(
        [x for x, _ in points],
        [y for _, y in points],
        s=22,
        color="#9ca3af",
        label="measured points",
        gid=f"{key}-points",
    )
    (line,) = ax.step(
        [x for x, _ in front],
        [y for _, y in front],
        where="post",
        color="#1d4ed8",
        marker="o",
        linewidth=1.6,
        label="Pareto front (nothing faster at a lower p95)",
    )
    line.set_gid(f"{key}-front")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    _finish(ax, ylabel, title, legend=True, below=True)
    return figure_svg(fig, key)


def horizontal_bars(
    values: Mapping[str, float], xlabel: str, title: str, *, simulated: bool = False
) -> bytes:
    """One bar per name, largest on top (e.g. parameter importances)."""
    fig = _new_figure(simulated)
    ax = fig.add_subplot()
    ordered = sorted(values.items(), key=lambda item: item[1])
    ax.barh([name for name, _ in ordered], [float(v) for _, v in ordered], color="C0")
    ax.set_xlabel(xlabel)
    _finish(ax, "", title, legend=False)
    return figure_png(fig)


LANE_COLOURS = {"generation": "#2563eb", "training": "#16a34a", "sync": "#dc2626"}


def lanes(
    spans: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    *,
    key: str,
    xlabel: str = "time since the loop began (s)",
    simulated: bool = False,
) -> str:
    """One horizontal lane a name (top to bottom in order), each (start, end) span a bar:
    what ran when. Ids: `{key}-{lane}-{n}` for the n-th span of a lane."""
    fig = _new_figure(simulated, (_SIZE[0], 1.2 + 0.7 * max(len(spans), 1)))
    ax = fig.add_subplot()
    names = list(spans)
    for row, name in enumerate(names):
        y = len(names) - 1 - row
        for n, (start, end) in enumerate(spans[name]):
            ax.broken_barh(
                [(start, max(end - start, 0.0))],
                (y - 0.35, 0.7),
                facecolors=LANE_COLOURS.get(name, "#6b7280"),
                gid=f"{key}-{name}-{n}",
            )
    ax.set_yticks(range(len(names)), names[::-1])
    ax.set_xlabel(xlabel)
    ax.set_xlim(left=0)
    _finish(ax, "", title, legend=False)
    return figure_svg(fig, key)


def _finish(
    ax: Axes,
    ylabel: str,
    title: str,
    *,
    legend: bool,
    reverse: bool = False,
    below: bool = False,
) -> None:
    """The styling every plot shares: light grid, no top/right spines, legend if useful
    (right of the plot, or `below` it in one column for long labels)."""
    ax.set_ylabel(ylabel)
    ax.set_title(title, loc="left", fontsize=12)
    ax.grid(True, color="#e5e7eb", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if legend:
        handles, labels = ax.get_legend_handles_labels()
        if reverse:  # a stack reads top-down, so its legend should too
            handles, labels = handles[::-1], labels[::-1]
        anchor = (0.0, -0.14) if below else (1.01, 1.0)
        ax.legend(
            handles, labels, frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=anchor
        )


@dataclass(frozen=True, slots=True)
class Timeline:
    """One probe's throughput over time: (t, rate) points, its phases as (name, start,
    end) spans, and the rate measured over its window with its 95% interval."""

    label: str
    points: Sequence[tuple[float, float]]
    phases: Sequence[tuple[str, float, float]]
    rate: tuple[float, float, float]  # rate, low, high


PHASE_COLOURS = {"warm-up": "#d1d5db", "measured": "#bbf7d0", "drain": "#fed7aa"}


def probe_timelines(
    timelines: Sequence[Timeline],
    ylabel: str,
    title: str,
    *,
    key: str,
    xlabel: str = "time since the probe began (s)",
    simulated: bool = False,
) -> str:
    """One panel a probe: its throughput over time on its warm-up, measured window and
    drain, shaded, and the measured rate's 95% interval as a band across the window.
    Ids: `{key}-{panel}-{phase}-{n}` for shaded spans, `{key}-{panel}-interval` for bands.
    """
    height = 1.0 + 2.2 * max(len(timelines), 1)
    fig = _new_figure(simulated, (_SIZE[0], height))
    axes = fig.subplots(max(len(timelines), 1), 1, squeeze=False)[:, 0]
    for panel, (ax, timeline) in enumerate(zip(axes, timelines, strict=False)):
        seen: set[str] = set()
        for n, (name, start, end) in enumerate(timeline.phases):
            ax.axvspan(
                start,
                end,
                color=PHASE_COLOURS.get(name, "#e5e7eb"),
                alpha=0.8,
                linewidth=0,
                label=name if name not in seen else None,
                gid=f"{key}-{panel}-{name}-{n}",
            )
            seen.add(name)
        xs = [t for t, _ in timeline.points]
        ys = [rate for _, rate in timeline.points]
        ax.plot(xs, ys, color="#1f2937", linewidth=1.3, label="throughput", drawstyle="steps-mid")
        rate, low, high = timeline.rate
        window = [(start, end) for name, start, end in timeline.phases if name == "measured"]
        for start, end in window:
            ax.fill_between(
                [start, end],
                low,
                high,
                color="#15803d",
                alpha=0.25,
                linewidth=0,
                gid=f"{key}-{panel}-interval",
            )
            ax.hlines(rate, start, end, color="#15803d", linewidth=1.4)
        ax.set_ylim(bottom=0)
        _finish(ax, ylabel, timeline.label, legend=panel == 0)
    axes[-1].set_xlabel(xlabel)
    fig.suptitle(title, x=0.01, ha="left", fontsize=12)
    return figure_svg(fig, key)


def throughput_with_bands(
    points: Sequence[tuple[int, float, float, float]],
    bands: Sequence[tuple[str, float, float]],
    ylabel: str,
    title: str,
    *,
    key: str,
    simulated: bool = False,
) -> str:
    """Throughput at each parallelism with its 95% interval (error bars), and labelled
    horizontal bands (a threshold known only within an interval). `points` are
    (parallelism, rate, low, high); `bands` (label, low, high). Ids:
    `{key}-interval-{parallelism}` and `{key}-band-{i}`."""
    fig = _new_figure(simulated)
    ax = fig.add_subplot()
    colours = ("#6b7280", "#1d4ed8", "#b45309")
    for index, (label, low, high) in enumerate(bands):
        ax.axhspan(
            low,
            high,
            color=colours[index % len(colours)],
            alpha=0.18,
            linewidth=0,
            label=label,
            gid=f"{key}-band-{index}",
        )
    xs = [float(n) for n, *_ in points]
    for n, rate, low, high in points:
        container = ax.errorbar(
            [n],
            [rate],
            yerr=[[rate - low], [high - rate]],
            fmt="o",
            color="#1f2937",
            capsize=6,
            markersize=6,
            linewidth=1.6,
        )
        container[2][0].set_gid(f"{key}-interval-{n}")
    ax.plot(xs, [rate for _, rate, _, _ in points], color="#1f2937", linewidth=0.8, alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(n) for n, *_ in points])
    ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("parallelism")
    _finish(ax, ylabel, title, legend=bool(bands), below=True)
    return figure_svg(fig, key)


def interval_against_thresholds(
    estimate: tuple[float, float, float],
    thresholds: Sequence[tuple[str, float]],
    xlabel: str,
    title: str,
    *,
    key: str,
    zone: tuple[str, float, float] | None = None,
    simulated: bool = False,
) -> str:
    """One estimate (point, low, high) as a bar on a line, against labelled vertical
    thresholds and a labelled `zone` (a threshold's margin): where the interval lies
    says how sure a decision is. Ids: `{key}-interval`, `{key}-threshold-{i}`, `{key}-zone`.
    """
    point, low, high = estimate
    fig = _new_figure(simulated, (_SIZE[0], 2.4))
    ax = fig.add_subplot()
    if zone is not None:
        ax.axvspan(
            zone[1],
            zone[2],
            color="#f59e0b",
            alpha=0.18,
            linewidth=0,
            label=zone[0],
            gid=f"{key}-zone",
        )
    finite_high = high if high != float("inf") else point * 3
    ax.fill_betweenx(
        [-0.25, 0.25],
        low,
        finite_high,
        color="#1d4ed8",
        alpha=0.3,
        linewidth=0,
        gid=f"{key}-interval",
        label="95% interval",
    )
    ax.plot([point], [0], "o", color="#1d4ed8", label="measured")
    for index, (label, x) in enumerate(thresholds):
        ax.axvline(
            x,
            color="#374151",
            linestyle=_LINE_STYLES[1 + index % 3],
            linewidth=1.2,
            label=label,
            gid=f"{key}-threshold-{index}",
        )
    values = [low, finite_high, *(x for _, x in thresholds)]
    ax.set_xlim(max(0.0, min(values) * 0.85), max(values) * 1.1)
    ax.set_ylim(-1, 1)
    ax.set_yticks([])
    ax.set_xlabel(xlabel)
    _finish(ax, "", title, legend=True)
    return figure_svg(fig, key)
