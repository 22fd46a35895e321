"""Pure statistics for steady-state throughput: no I/O, unit-tested on their own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); beyond, the normal's.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(degrees_of_freedom: int) -> float:
    if degrees_of_freedom < 1:
        return math.inf
    if degrees_of_freedom <= len(_T95):
        return _T95[degrees_of_freedom - 1]
    return 1.96


@dataclass(frozen=True, slots=True)
class RateEstimate:
    """Events per second over a window, with a 95% batch-means interval."""

    rate: float
    low: float
    high: float
    events: int
    window_s: float

    @property
    def relative_halfwidth(self) -> float:
        if self.rate <= 0:
            return math.inf
        return (self.high - self.low) / 2 / self.rate


def batch_means_rate(
    event_times: Sequence[float], start: float, end: float, batches: int = 10
) -> RateEstimate:
    """Rate of events in [start, end) with a batch-means 95% interval.

    Splitting the window into equal batches and treating each batch's rate as one
    observation absorbs short-range correlation (completions arrive in bursts when a
    batch of sequences finishes together), which a naive Poisson interval would not.
    """
    window = end - start
    if window <= 0:
        return RateEstimate(0.0, 0.0, math.inf, 0, 0.0)
    width = window / batches
    counts = [0] * batches
    events = 0
    for t in event_times:
        if start <= t < end:
            counts[min(batches - 1, int((t - start) / width))] += 1
            events += 1
    rates = [c / width for c in counts]
    mean = events / window
    variance = sum((r - mean) ** 2 for r in rates) / (batches - 1)
    halfwidth = t95(batches - 1) * math.sqrt(variance / batches)
    return RateEstimate(mean, max(0.0, mean - halfwidth), mean + halfwidth, events, window)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
