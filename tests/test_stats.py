"""Steady-state rate estimation (pure)."""

from __future__ import annotations

import random

from autotune.stats import batch_means_rate, t95


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
