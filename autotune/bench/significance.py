"""Pure statistics for the regression gate: an exact Mann-Whitney U test, a bootstrap
interval and a paired ratio test; no I/O, unit-tested on their own.
Why: docs/design/bench.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.special import stdtr, stdtrit

MAX_EXACT_SAMPLES = 40
"""Beyond this many samples in all the exact distribution costs too much (O(N⁴))."""


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True, slots=True)
class RankTest:
    """Mann-Whitney U of the first sample against the second, with its two-sided p."""

    u: float  # pairs (x, y) with x > y, ties counting one half
    p_value: float


def _midranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, tied values sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> RankTest:
    """Exact two-sided Mann-Whitney U test (a permutation test on ranks, ties included).

    The null distribution of the first sample's rank sum is counted over every way of
    choosing len(x) of the pooled ranks, by dynamic programming on doubled midranks
    (integers even with ties), so it is exact for any tie pattern.
    """
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        raise ValueError("the Mann-Whitney test needs at least one value in each sample")
    if n + m > MAX_EXACT_SAMPLES:
        raise ValueError(f"at most {MAX_EXACT_SAMPLES} values in all for the exact test")
    doubled = [round(2 * r) for r in _midranks([*x, *y])]
    observed = sum(doubled[:n])
    top = sum(sorted(doubled)[-n:])
    # ways[k][s]: subsets of k of the ranks seen so far whose doubled ranks sum to s.
    ways = [[0] * (top + 1) for _ in range(n + 1)]
    ways[0][0] = 1
    for seen, rank in enumerate(doubled, start=1):
        for k in range(min(seen, n), 0, -1):
            below, row = ways[k - 1], ways[k]
            for s in range(top, rank - 1, -1):
                if below[s - rank]:
                    row[s] += below[s - rank]
    counts = ways[n]
    total = math.comb(n + m, n)
    at_most = sum(counts[: observed + 1]) / total
    at_least = sum(counts[observed:]) / total
    u = observed / 2 - n * (n + 1) / 2
    return RankTest(u=u, p_value=min(1.0, 2 * min(at_most, at_least)))


def bootstrap_ratio_interval(
    new: Sequence[float],
    baseline: Sequence[float],
    confidence: float = 0.99,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(new) / median(baseline).

    Each sample is resampled on its own (the runs are independent). The seed is fixed
    so the interval is the same every time it is rebuilt from saved results.
    """
    if not new or not baseline:
        raise ValueError("the bootstrap needs at least one value in each sample")
    rng = random.Random(seed)
    ratios = sorted(
        median(rng.choices(new, k=len(new))) / median(rng.choices(baseline, k=len(baseline)))
        for _ in range(resamples)
    )
    tail = (1 - confidence) / 2
    low = ratios[math.floor(tail * (resamples - 1))]
    high = ratios[math.ceil((1 - tail) * (resamples - 1))]
    return low, high


@dataclass(frozen=True, slots=True)
class PairedRatio:
    """New ÷ baseline over paired measurements: the geometric mean of the pair ratios,
    its interval, and the two-sided p of a paired t test on their logarithms."""

    ratio: float
    interval: tuple[float, float]
    p_value: float


def paired_ratio(new: Sequence[float], baseline: Sequence[float], confidence: float) -> PairedRatio:
    """The pairs (new[i], baseline[i]) judged on log(new ÷ baseline): a ratio of speeds is
    symmetric in logarithms (×0.8 and ×1.25 are the same distance from ×1)."""
    if len(new) != len(baseline) or not new:
        raise ValueError("a paired test needs the same number (at least one) of each")
    logs = [math.log(n / b) for n, b in zip(new, baseline, strict=True)]
    center = sum(logs) / len(logs)
    ratio = math.exp(center)
    if len(logs) < 2:
        return PairedRatio(ratio, (0.0, math.inf), 1.0)
    dof = len(logs) - 1
    spread = math.sqrt(sum((x - center) ** 2 for x in logs) / dof / len(logs))
    if spread == 0:
        return PairedRatio(ratio, (ratio, ratio), 1.0 if center == 0 else 0.0)
    p_value = float(2 * stdtr(dof, -abs(center) / spread))
    half = float(stdtrit(dof, 1 - (1 - confidence) / 2)) * spread
    return PairedRatio(ratio, (math.exp(center - half), math.exp(center + half)), p_value)
