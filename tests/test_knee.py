"""USL fit and the 80% rule on curves with a known peak, with and without noise, and
on a curve with no peak in range."""

from __future__ import annotations

import math
import random

import pytest

from autotune.knee import HEADROOM, UslFit, bootstrap_curve, fit_usl, summarise_curve

TRUE = UslFit(lam=10.0, sigma=0.02, kappa=0.0004, r2=1.0)  # N* = √(0.98/0.0004) ≈ 49.5
DOUBLING = [1, 2, 4, 8, 16, 32, 64, 128]


def test_exact_points_recover_the_parameters() -> None:
    fit = fit_usl(DOUBLING, [TRUE.throughput(n) for n in DOUBLING])
    assert fit.lam == pytest.approx(10.0, rel=1e-6)
    assert fit.sigma == pytest.approx(0.02, rel=1e-4)
    assert fit.kappa == pytest.approx(0.0004, rel=1e-4)
    assert fit.peak_parallelism == pytest.approx(math.sqrt(0.98 / 0.0004), rel=1e-4)


def test_known_peak_and_the_80_percent_rule() -> None:
    summary = summarise_curve(DOUBLING, [TRUE.throughput(n) for n in DOUBLING])
    assert summary.peak_inside_range
    assert summary.peak_parallelism == pytest.approx(49.5, abs=0.1)
    assert summary.recommended_parallelism == math.floor(HEADROOM * summary.peak_parallelism) == 39
    assert summary.recommended_throughput == pytest.approx(TRUE.throughput(39), rel=1e-4)
    # The smallest N reaching 80% of the peak throughput, checked by brute force.
    peak_x = TRUE.throughput(summary.peak_parallelism)
    expected = next(n for n in range(1, 100) if TRUE.throughput(n) >= 0.8 * peak_x)
    assert summary.smallest_parallelism_at_80pct == expected
    # The knee: where linear scaling λN reaches the peak throughput.
    assert summary.knee_parallelism == pytest.approx(peak_x / 10.0, rel=1e-4)
    assert summary.knee_parallelism < summary.peak_parallelism


@pytest.mark.parametrize("seed", range(5))
def test_noisy_points_keep_the_peak_close(seed: int) -> None:
    rng = random.Random(seed)
    noisy = [TRUE.throughput(n) * rng.gauss(1.0, 0.05) for n in DOUBLING]
    summary = summarise_curve(DOUBLING, noisy)
    assert summary.peak_inside_range
    assert 35 <= summary.peak_parallelism <= 70
    assert summary.recommended_parallelism == math.floor(0.8 * summary.peak_parallelism)


def test_no_peak_in_range_is_said_not_extrapolated() -> None:
    rising = UslFit(lam=5.0, sigma=0.05, kappa=0.0, r2=1.0)
    points = [1, 2, 4, 8, 16, 32]
    summary = summarise_curve(points, [rising.throughput(n) for n in points])
    assert not summary.peak_inside_range
    assert "no peak inside the searched range" in summary.note
    assert summary.peak_parallelism == 32  # the best measured point, not a made-up one
    assert summary.recommended_parallelism == math.floor(0.8 * 32)


def test_peak_far_beyond_the_range_counts_as_no_peak() -> None:
    slow = UslFit(lam=5.0, sigma=0.0, kappa=1e-6, r2=1.0)  # N* = 1000
    points = [1, 2, 4, 8, 16]
    summary = summarise_curve(points, [slow.throughput(n) for n in points])
    assert not summary.peak_inside_range


def test_a_single_point_cannot_be_fitted() -> None:
    with pytest.raises(ValueError):
        fit_usl([4], [10.0])
    summary = summarise_curve([4], [10.0])
    assert summary.fit is None and summary.recommended_parallelism == 3


def test_three_points_never_claim_a_peak() -> None:
    points = [16, 32, 64]  # a ladder that stopped at its first plateau
    summary = summarise_curve(points, [TRUE.throughput(n) for n in points])
    assert not summary.peak_inside_range
    assert summary.peak_parallelism == max(points, key=TRUE.throughput)


def test_a_curve_level_from_its_first_point_has_its_knee_there_and_says_so() -> None:
    """A client that caps the rate below the server's: level from the lowest parallelism
    measured on. The fit's knee lies below the data (it read 0 before); it is that point."""
    parallelism = [8, 16, 32, 64, 128, 256]
    throughput = [1480.0, 1510.0, 1530.0, 1525.0, 1530.0, 1490.0]
    summary = summarise_curve(parallelism, throughput)
    assert summary.knee_parallelism == 8
    assert summary.smallest_parallelism_at_80pct == 8
    assert "already at 97% of the best at the lowest parallelism measured (8)" in summary.note
    rising = summarise_curve([8, 16, 32, 64], [100.0, 195.0, 370.0, 600.0])
    assert rising.knee_parallelism > 8 and "lowest parallelism measured" not in rising.note


# A batching server admitting at most 64 requests: linear below, level past the limit.
CAPPED = [8, 16, 32, 64]


def _capped(n: int) -> float:
    return 12.0 * min(n, 64)


def test_a_curve_level_at_the_servers_ceiling_peaks_there_and_keeps_the_headroom() -> None:
    """The ceiling is the peak, known inside the range (past it requests only queue), and
    the parallelism to run at is 80% of it, as anywhere else."""
    summary = summarise_curve(CAPPED, [_capped(n) for n in CAPPED], ceiling=64)
    assert summary.server_ceiling == 64 and summary.peak_parallelism == 64
    assert summary.peak_inside_range
    assert summary.recommended_parallelism == math.floor(HEADROOM * 64)
    assert "server's ceiling (64 requests at once)" in summary.note
    # Without the ceiling known, the same points are a curve that never turned down.
    unknown = summarise_curve(CAPPED, [_capped(n) for n in CAPPED])
    assert not unknown.peak_inside_range and unknown.server_ceiling is None


def test_the_ceilings_bootstrap_interval_is_closed_above() -> None:
    """Every draw puts the peak at the known ceiling, so 80% of it has no open end; with
    no ceiling known a curve still rising at its top one does."""
    throughput = [_capped(n) for n in CAPPED]
    errors = [0.02 * x for x in throughput]
    boot = bootstrap_curve(CAPPED, throughput, errors, seed=1, ceiling=64)
    assert boot is not None
    assert boot.recommended_parallelism == (51, 51)
    open_ended = bootstrap_curve(CAPPED, throughput, errors, seed=1)
    assert open_ended is not None and math.isinf(open_ended.recommended_parallelism[1])
