"""Pure statistics for steady-state throughput: no I/O, unit-tested on their own."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
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
    batches: int = 10

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
    return RateEstimate(mean, max(0.0, mean - halfwidth), mean + halfwidth, events, window, batches)


def mean_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95% t-interval of the mean of `values` (None for fewer than two)."""
    if len(values) < 2:
        return None
    centre = sum(values) / len(values)
    variance = sum((v - centre) ** 2 for v in values) / (len(values) - 1)
    halfwidth = t95(len(values) - 1) * math.sqrt(variance / len(values))
    return centre - halfwidth, centre + halfwidth


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def completion_batches_rate(
    event_times: Sequence[float], windows: Sequence[tuple[float, float]], batch_events: int
) -> RateEstimate:
    """Rate of events over one or more windows, with a 95% batch-means interval whose
    batches hold `batch_events` events each.

    `event_times` is in time order. Each window starts at an event instant (the end of
    warm-up is a completion); a batch is the time its next `batch_events` events took.
    Batches of equal counts, timed between events, carry none of the noise of counting
    waves of completions into fixed time bins (a closed loop whose slots finish together
    completes in waves). The rate is every counted event over every batch's time; its
    interval comes from the spread of the batches' mean gaps between events. Events
    after a window's last whole batch are not counted: `window_s` ends there.
    """
    k = max(1, batch_events)
    gaps: list[float] = []  # one batch's time ÷ its events
    for start, end in windows:
        times = event_times[bisect_right(event_times, start) : bisect_right(event_times, end)]
        previous = start
        for index in range(k - 1, len(times) - len(times) % k, k):
            gaps.append((times[index] - previous) / k)
            previous = times[index]
    batches = len(gaps)
    total = sum(gaps) * k
    if batches == 0 or total <= 0:  # too few events for one batch: a rate, no interval
        events = sum(
            bisect_right(event_times, end) - bisect_right(event_times, start)
            for start, end in windows
        )
        span = sum(end - start for start, end in windows)
        rate = events / span if span > 0 else 0.0
        return RateEstimate(rate, 0.0, math.inf, events, span, 0)
    rate = batches * k / total
    if batches < 2:
        return RateEstimate(rate, 0.0, math.inf, batches * k, total, batches)
    mean_gap = total / k / batches
    spread = math.sqrt(sum((g - mean_gap) ** 2 for g in gaps) / (batches - 1))
    halfwidth = rate * t95(batches - 1) * spread / math.sqrt(batches) / mean_gap
    return RateEstimate(
        rate, max(0.0, rate - halfwidth), rate + halfwidth, batches * k, total, batches
    )


@dataclass(frozen=True, slots=True)
class RatioInterval:
    """A ratio of two rates and its 95% interval."""

    ratio: float
    low: float
    high: float


def ratio_interval(
    numerator: tuple[float, float, int], denominator: tuple[float, float, int]
) -> RatioInterval:
    """`numerator ÷ denominator` with a 95% interval, each given as (rate, halfwidth of
    its 95% interval, batches).

    Delta method on the log scale: the log of a ratio is a difference, whose variance
    is the sum of the two relative variances; Welch–Satterthwaite gives its degrees of
    freedom. The interval is asymmetric around the ratio, as a ratio's should be.
    """
    return paired_ratio_interval([(numerator, denominator)])


Rate = tuple[float, float, int]  # (rate, halfwidth of its 95% interval, batches)


def paired_ratio_interval(pairs: Sequence[tuple[Rate, Rate]]) -> RatioInterval:
    """The geometric mean of several `numerator ÷ denominator` pairs with its 95% interval.

    Each pair was measured side by side (a low and a high parallelism block in turn), so
    a change of conditions between pairs moves both of a pair's rates and cancels in its
    ratio. The mean of the pairs' log ratios has the variance of their sum ÷ n², and
    Welch–Satterthwaite degrees of freedom over every rate's own.
    """
    if any(top[0] <= 0 or bottom[0] <= 0 for top, bottom in pairs):
        stopped = any(bottom[0] <= 0 for _, bottom in pairs)
        return RatioInterval(math.inf if stopped else 0.0, 0.0, math.inf)
    n = len(pairs)
    centre = sum(math.log(top[0] / bottom[0]) for top, bottom in pairs) / n
    parts = []  # (variance of the log mean it adds, its degrees of freedom)
    for rate, halfwidth, batches in (rate for pair in pairs for rate in pair):
        relative_se = halfwidth / rate / t95(batches - 1) if batches > 1 else math.inf
        parts.append((relative_se**2 / n**2, max(batches - 1, 1)))
    variance = sum(v for v, _ in parts)
    ratio = math.exp(centre)
    if not math.isfinite(variance):
        return RatioInterval(ratio, 0.0, math.inf)
    if variance == 0:
        return RatioInterval(ratio, ratio, ratio)
    df = variance**2 / sum(v**2 / dof for v, dof in parts)
    spread = t95(math.floor(df)) * math.sqrt(variance)
    return RatioInterval(ratio, ratio * math.exp(-spread), ratio * math.exp(spread))


def counter_rate(
    points: Sequence[tuple[float, float]], start: float, end: float, batch_s: float, batches: int
) -> RateEstimate:
    """The rate of a cumulative counter read at `points` (time, value; in time order)
    over [start, end], with a 95% batch-means interval: the readings inside the window
    are cut into about `batches` batches of at least `batch_s` each, and each batch's
    increase over its time is one observation of the rate.

    For a count that moves in small steps all the time (tokens generated), where
    completions are too few to time: a rollout of a minute gives one completion a
    minute a slot, but hundreds of tokens a second.
    """
    inside = [(t, v) for t, v in points if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return RateEstimate(0.0, 0.0, math.inf, 0, 0.0, 0)
    span = inside[-1][0] - inside[0][0]
    width = max(batch_s, span / max(batches, 1))
    edges = [inside[0]]
    for t, v in inside[1:]:
        if t - edges[-1][0] >= width:
            edges.append((t, v))
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(edges)]
    counted_s = edges[-1][0] - edges[0][0]
    total = edges[-1][1] - edges[0][1]
    rate = total / counted_s if counted_s > 0 else 0.0
    if len(rates) < 2:
        return RateEstimate(rate, 0.0, math.inf, int(total), counted_s, len(rates))
    spread = math.sqrt(sum((r - rate) ** 2 for r in rates) / (len(rates) - 1))
    halfwidth = t95(len(rates) - 1) * spread / math.sqrt(len(rates))
    return RateEstimate(
        rate, max(0.0, rate - halfwidth), rate + halfwidth, int(total), counted_s, len(rates)
    )
