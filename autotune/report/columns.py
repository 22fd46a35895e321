"""Tables as named columns: one definition serves the terminal text, the HTML page and CSV.

A column is a header and a function of one record (a ProbeResult, a TrialRecord, ...),
so a table shown in two places cannot drift apart: both read the same definition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from autotune.report import html
from autotune.results.stages import ReplicaStats

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Column(Generic[T]):
    """One column: its header, its cell for a record, whether the terminal shows it, and
    the significant digits a page shows of a measured number (CSV keeps every digit)."""

    header: str
    value: Callable[[T], object]
    terminal: bool = True
    digits: int | None = None


def headers(columns: Sequence[Column[T]]) -> list[str]:
    return [column.header for column in columns]


def rows(columns: Sequence[Column[T]], records: Iterable[T]) -> list[list[object]]:
    """One row a record, one cell a column (raw values: each output formats its own)."""
    return [[column.value(record) for column in columns] for record in records]


def html_table(
    columns: Sequence[Column[T]], records: Iterable[T], *, caption: str | None = None
) -> str:
    """The table on a page: numbers rounded to each column's digits."""
    shown = [
        [_rounded(value, column.digits) for value, column in zip(row, columns, strict=True)]
        for row in rows(columns, records)
    ]
    return html.table(headers(columns), shown, caption=caption)


def _rounded(value: object, digits: int | None) -> object:
    if digits is None or not isinstance(value, float) or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


def _terminal_cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        # one decimal, or three significant digits for what one decimal would show as 0
        return f"{value:,.1f}" if value == 0 or abs(value) >= 0.1 else f"{value:.3g}"
    return str(value)


def terminal_table(columns: Sequence[Column[T]], records: Iterable[T]) -> list[str]:
    """The columns marked `terminal`, right-aligned, at least 10 characters wide."""
    shown = [column for column in columns if column.terminal]
    widths = [max(len(column.header), 10) for column in shown]
    lines = ["  ".join(c.header.rjust(w) for c, w in zip(shown, widths, strict=True))]
    for row in rows(shown, records):
        lines.append(
            "  ".join(_terminal_cell(v).rjust(w) for v, w in zip(row, widths, strict=True))
        )
    return lines


def _state(replica: ReplicaStats) -> str:
    if not replica.up:
        return "out of rotation"
    return f"back after {replica.times_down} outage(s)" if replica.times_down else "up"


def _share(value: float | None) -> float | None:
    return None if value is None else 100 * value


REPLICA_COLUMNS: tuple[Column[ReplicaStats], ...] = (
    Column("replica", lambda r: r.url),
    Column("calls/s", lambda r: r.calls_per_s, digits=3),
    Column("done", lambda r: r.completed),
    Column("failed", lambda r: r.failed),
    Column(
        "mean call ms",
        lambda r: None if r.mean_latency_s is None else 1000 * r.mean_latency_s,
        digits=3,
    ),
    Column("output tok/s", lambda r: r.output_tokens_per_s, digits=3),
    Column("waiting", lambda r: r.server.get("waiting"), digits=3),
    Column("KV use %", lambda r: _share(r.server.get("kv_cache_usage")), digits=3),
    Column("prefix hits %", lambda r: _share(r.prefix_cache_hit_share), digits=3),
    Column("GPUs", lambda r: ",".join(map(str, r.gpus)) or None, terminal=False),
    Column("GPU util %", lambda r: r.gpu.get("util_pct"), digits=3),
    Column("GPU W", lambda r: r.gpu.get("power_w"), digits=3, terminal=False),
    Column("state", _state),
)
"""Each replica of a run or a probe (several --base-url): the client's view, then its
/metrics, then NVML over its GPUs."""
