"""Drawing for the reports: computed numbers in, PNG bytes out.

This is the thin second step of a plot (the numbers are computed and tested elsewhere).
matplotlib is imported inside the functions, because importing it costs about a second and
most commands never draw. Figures are built on the Agg canvas directly, not through pyplot,
so no GUI backend is ever chosen and no global figure registry grows.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["bar_chart_stacked", "curves_with_marks", "figure_png", "horizontal_bars", "time_series"]

_SIZE = (9.0, 4.5)  # inches; at 110 dpi a plot fits the report's 1100 px column
_DPI = 110


def _new_figure() -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
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


def bar_chart_stacked(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    title: str,
) -> bytes:
    """One stacked bar per category (e.g. per-stage latency per probe), one colour a series."""
    for name, values in series.items():
        if len(values) != len(categories):
            raise ValueError(
                f"series {name!r} has {len(values)} values for {len(categories)} categories"
            )
    fig = _new_figure()
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
) -> bytes:
    """One line per series of (x, y) points, e.g. telemetry sampled during a probe."""
    fig = _new_figure()
    ax = fig.add_subplot()
    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r} has {len(xs)} x values and {len(ys)} y values")
        ax.plot(list(xs), list(ys), label=name, linewidth=1.5)
    ax.set_xlabel(xlabel)
    _finish(ax, ylabel, title, legend=len(series) > 1)
    return figure_png(fig)


def curves_with_marks(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]]],
    marks: Mapping[str, float],
    level: tuple[str, float] | None,
    xlabel: str,
    ylabel: str,
    title: str,
) -> bytes:
    """Measured points (dots) and a fitted line per curve, on a log2 x axis.

    `curves` maps a label to (point xs, point ys, line xs, line ys); `marks` are labelled
    vertical lines (peak, knee, recommended); `level` one labelled horizontal line.
    """
    fig = _new_figure()
    ax = fig.add_subplot()
    for index, (name, (px, py, lx, ly)) in enumerate(curves.items()):
        colour = f"C{index}"
        ax.plot(list(lx), list(ly), color=colour, linewidth=1.5, label=f"{name} (fit)")
        ax.scatter(list(px), list(py), color=colour, s=28, zorder=3, label=f"{name} (measured)")
    styles = ("--", ":", "-.")
    for index, (name, x) in enumerate(marks.items()):
        ax.axvline(
            x, color="#374151", linestyle=styles[index % 3], linewidth=1.1, label=f"{name}: {x:.0f}"
        )
    if level is not None:
        ax.axhline(level[1], color="#9ca3af", linestyle="-", linewidth=0.9, label=level[0])
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    _finish(ax, ylabel, title, legend=True)
    return figure_png(fig)


def horizontal_bars(values: Mapping[str, float], xlabel: str, title: str) -> bytes:
    """One bar per name, largest on top (e.g. parameter importances)."""
    fig = _new_figure()
    ax = fig.add_subplot()
    ordered = sorted(values.items(), key=lambda item: item[1])
    ax.barh([name for name, _ in ordered], [float(v) for _, v in ordered], color="C0")
    ax.set_xlabel(xlabel)
    _finish(ax, "", title, legend=False)
    return figure_png(fig)


def _finish(ax: Axes, ylabel: str, title: str, *, legend: bool, reverse: bool = False) -> None:
    """The styling both plots share: light grid, no top/right spines, legend if useful."""
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
        ax.legend(
            handles, labels, frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0)
        )
