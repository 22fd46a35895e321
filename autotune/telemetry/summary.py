"""Reduce recorded samples to per-metric statistics over a time window (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from statistics import fmean

from autotune.telemetry.recorder import Sample

COUNTER_SUFFIXES = ("_total", "_sum", "_count")
"""Metrics with these suffixes only grow (Prometheus counters, histogram sums and counts)."""


def summarise(samples: Iterable[Sample], start: float, end: float) -> dict[str, dict[str, float]]:
    """`{"source/metric": {"mean", "max", "samples"[, "delta"]}}` over samples with
    start <= t <= end; `samples` is how many readings the figures come from.

    Counters also get `delta`, their increase from the window's first sample to its last;
    a drop (the server restarted) counts as a reset to zero, as Prometheus's `increase`
    does, so a restart never shows as negative work.
    """
    series: dict[str, list[float]] = {}
    for sample in sorted(samples, key=lambda s: s.t):
        if start <= sample.t <= end:
            for metric, value in sample.values.items():
                series.setdefault(f"{sample.source}/{metric}", []).append(value)
    summary: dict[str, dict[str, float]] = {}
    for key, values in series.items():
        stats = {"mean": fmean(values), "max": max(values), "samples": float(len(values))}
        if key.endswith(COUNTER_SUFFIXES):
            stats["delta"] = _increase(values)
        summary[key] = stats
    return summary


def _increase(values: list[float]) -> float:
    total = 0.0
    for before, after in pairwise(values):
        total += after - before if after >= before else after
    return total
