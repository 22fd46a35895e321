"""Steady-state rate estimation (pure)."""

from __future__ import annotations

import math
import random

from autotune.stats import (
    batch_means_rate,
    completion_batches_rate,
    paired_ratio_interval,
    ratio_interval,
    t95,
)


def test_regular_arrivals_give_a_tight_interval() -> None:
    times = [i * 0.01 for i in range(1000)]  # 100 events/s for 10 s
    estimate = batch_means_rate(times, 0.0, 10.0)
    assert abs(estimate.rate - 100) < 0.5
    assert estimate.relative_halfwidth < 0.01


def test_window_excludes_warmup_and_drain() -> None:
    times = [0.1] * 500 + [1 + i * 0.1 for i in range(90)] + [10.5] * 500
    estimate = batch_means_rate(times, 1.0, 10.0)
    assert estimate.events == 90 and abs(estimate.rate - 10) < 0.01


def test_poisson_interval_covers_the_true_rate() -> None:
    covered = 0
    for seed in range(40):
        rng = random.Random(seed)
        t, times = 0.0, []
        while t < 20:
            t += rng.expovariate(50)
            times.append(t)
        estimate = batch_means_rate(times, 0.0, 20.0)
        covered += estimate.low <= 50 <= estimate.high
    assert covered >= 34  # ~95% nominal; generous for 40 trials


def test_bursts_widen_the_interval() -> None:
    steady = batch_means_rate([i * 0.1 for i in range(100)], 0.0, 10.0)
    bursty = batch_means_rate([float(i // 20) * 2 for i in range(100)], 0.0, 10.0)
    assert bursty.relative_halfwidth > 10 * steady.relative_halfwidth


def test_t_quantiles() -> None:
    assert t95(9) == 2.262 and t95(1000) == 1.96


def test_completion_batches_ignore_waves_that_time_bins_would_count() -> None:
    """A closed loop of 8 slots finishing together every second: 8/s, exactly. Time bins
    that cut the waves unevenly see noise; batches timed between completions do not."""
    waves = [wave + 0.001 * slot for wave in range(1, 41) for slot in range(8)]
    binned = batch_means_rate(waves, 0.0, 37.5)
    batched = completion_batches_rate(waves, [(waves[7], waves[-1])], 16)
    assert abs(batched.rate - 8) < 0.05
    assert batched.relative_halfwidth < 0.01 < binned.relative_halfwidth
    assert batched.batches == 19 and batched.events == 19 * 16


def test_completion_batches_pool_several_windows() -> None:
    """An extended probe: two windows of the same 10/s process, minutes apart, pool into
    one rate over their measured time only (the gap between them is not measured)."""
    first = [i * 0.1 for i in range(1, 101)]  # (0, 10]
    second = [100 + i * 0.1 for i in range(1, 101)]  # (100, 110]
    estimate = completion_batches_rate(first + second, [(0.0, 10.0), (100.0, 110.0)], 10)
    assert estimate.batches == 20 and abs(estimate.rate - 10) < 1e-6
    assert abs(estimate.window_s - 20) < 1e-6


def test_too_few_events_give_an_unbounded_interval() -> None:
    estimate = completion_batches_rate([1.0, 2.0, 3.0], [(0.0, 3.0)], 3)
    assert estimate.batches == 1 and estimate.high == math.inf


def test_ratio_interval_covers_the_true_ratio() -> None:
    """Two Poisson processes at 20/s and 50/s, measured as a probe would: their ratio's
    95% interval (delta method on the log scale) covers 2.5 about 95% of the time."""
    covered = 0
    trials = 200
    for seed in range(trials):
        rng = random.Random(seed)
        estimates = []
        for rate in (20.0, 50.0):
            t, times = 0.0, []
            while t < 20:
                t += rng.expovariate(rate)
                times.append(t)
            estimate = completion_batches_rate(times, [(0.0, 20.0)], max(1, round(rate)))
            estimates.append((estimate.rate, estimate.high - estimate.rate, estimate.batches))
        ratio = ratio_interval(estimates[1], estimates[0])
        assert ratio.low < ratio.ratio < ratio.high
        covered += ratio.low <= 2.5 <= ratio.high
    assert 0.89 * trials <= covered <= trials


def test_paired_ratios_cover_the_true_ratio_when_conditions_change_between_pairs() -> None:
    """Two pairs of Poisson blocks, the second pair at half the first's rates (a busier
    machine): each pair's ratio is still 2.5, and the paired interval covers it about 95%
    of the time; one pair alone gives the ratio_interval."""
    covered = 0
    trials = 200
    for seed in range(trials):
        rng = random.Random(seed)
        pairs = []
        for slow in (1.0, 0.5):
            rates = []
            for rate in (20.0 * slow, 50.0 * slow):
                t, times = 0.0, []
                while t < 10:
                    t += rng.expovariate(rate)
                    times.append(t)
                estimate = completion_batches_rate(times, [(0.0, 10.0)], max(1, round(rate / 2)))
                rates.append((estimate.rate, estimate.high - estimate.rate, estimate.batches))
            pairs.append((rates[1], rates[0]))
        ratio = paired_ratio_interval(pairs)
        covered += ratio.low <= 2.5 <= ratio.high
        assert paired_ratio_interval(pairs[:1]) == ratio_interval(*pairs[0])
    assert 0.89 * trials <= covered <= trials


def test_a_ratio_with_an_unmeasured_side_is_unbounded() -> None:
    assert ratio_interval((10.0, math.inf, 10), (5.0, 0.5, 10)).high == math.inf
    assert ratio_interval((10.0, 1.0, 10), (0.0, 0.0, 10)).ratio == math.inf


def test_too_few_events_for_one_batch_still_give_their_rate_without_an_interval() -> None:
    # 4 completions in a 10 s window, batches of 8: no batch, but 0 rollouts/s would be
    # wrong; the rate is 4 / 10 s, and nothing narrower than 0–inf can be said of it.
    estimate = completion_batches_rate([2.0, 4.0, 6.0, 8.0], [(0.0, 10.0)], 8)
    assert estimate.rate == 0.4 and (estimate.low, estimate.high) == (0.0, math.inf)
    assert estimate.batches == 0 and estimate.events == 4
