"""The regression gate's statistics, on cases worked out by hand.

Mann-Whitney U with 5 against 5: C(10, 5) = 252 equally likely rank splits under the null.
U = 0 (every x below every y) happens in 1 split, U = 1 in 1, U = 2 in 2; so the
two-sided p of U = 0 is 2/252, of U = 1 is 2·2/252 and of U = 2 is 2·4/252.
"""

from __future__ import annotations

import itertools
import math

import pytest

from autotune.bench.significance import (
    MAX_EXACT_SAMPLES,
    bootstrap_ratio_interval,
    mann_whitney_u,
    median,
    paired_ratio,
)


def test_complete_separation_of_five_against_five_is_the_floor_2_over_252() -> None:
    test = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert test.u == 0
    assert test.p_value == pytest.approx(2 / 252)
    assert test.p_value < 0.01  # so R = 5 can flag a regression at p < 0.01 ...


def test_one_swapped_pair_is_no_longer_significant_at_one_percent() -> None:
    one = mann_whitney_u([1, 2, 3, 4, 6], [5, 7, 8, 9, 10])
    two = mann_whitney_u([1, 2, 3, 5, 6], [4, 7, 8, 9, 10])
    assert (one.u, one.p_value) == (1, pytest.approx(4 / 252))
    assert (two.u, two.p_value) == (2, pytest.approx(8 / 252))
    assert one.p_value > 0.01  # ... but only when every new sample is below every old one


def test_the_test_is_symmetric_and_u_counts_pairs() -> None:
    x, y = [3.1, 0.5, 2.2], [1.0, 4.0]
    forward, backward = mann_whitney_u(x, y), mann_whitney_u(y, x)
    assert forward.u == 2  # the pairs with x > y: (3.1, 1.0) and (2.2, 1.0)
    assert forward.u + backward.u == len(x) * len(y)
    assert forward.p_value == pytest.approx(backward.p_value)


def test_identical_samples_give_p_one() -> None:
    test = mann_whitney_u([5.0] * 5, [5.0] * 5)
    assert test.u == 12.5
    assert test.p_value == 1.0


def _brute_force(x: list[float], y: list[float]) -> float:
    """Two-sided permutation p of U by listing every split: the definition itself."""

    def u(a: list[float], b: list[float]) -> float:
        return sum((i > j) + 0.5 * (i == j) for i in a for j in b)

    pooled, n = [*x, *y], len(x)
    observed = u(x, y)
    splits = [
        u([pooled[i] for i in chosen], [pooled[i] for i in range(len(pooled)) if i not in chosen])
        for chosen in itertools.combinations(range(len(pooled)), n)
    ]
    low = sum(s <= observed for s in splits) / len(splits)
    high = sum(s >= observed for s in splits) / len(splits)
    return min(1.0, 2 * min(low, high))


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([1, 2, 2, 3], [2, 3, 4]),
        ([1, 1, 1], [1, 2, 2, 2]),
        ([0.9, 1.0, 1.0, 1.1, 1.2], [1.0, 1.1, 1.1, 1.3, 1.4]),
        ([7], [7, 8]),
    ],
)
def test_ties_match_the_permutation_distribution(x: list[float], y: list[float]) -> None:
    assert mann_whitney_u(x, y).p_value == pytest.approx(_brute_force(x, y))


def test_sample_size_limits() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match=f"at most {MAX_EXACT_SAMPLES}"):
        mann_whitney_u([1.0] * 21, [2.0] * 20)
    assert mann_whitney_u(list(range(20)), [v + 100 for v in range(20)]).p_value < 1e-10


def test_median() -> None:
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_bootstrap_interval_brackets_the_ratio_and_is_reproducible() -> None:
    new = [80.0, 81.0, 79.0, 80.5, 82.0]
    old = [100.0, 101.0, 99.0, 100.5, 102.0]
    low, high = bootstrap_ratio_interval(new, old, confidence=0.99)
    assert low <= median(new) / median(old) <= high
    # The most extreme resamples: every new value at its min/max over the old's max/min.
    assert low >= 79 / 102 and high <= 82 / 99
    assert (low, high) == bootstrap_ratio_interval(new, old, confidence=0.99)


def test_bootstrap_interval_of_identical_constant_samples_is_one_point() -> None:
    assert bootstrap_ratio_interval([2.0] * 5, [2.0] * 5) == (1.0, 1.0)


def test_a_wider_confidence_gives_a_wider_interval() -> None:
    new = [0.9, 1.1, 1.0, 0.95, 1.05, 0.98]
    old = [1.0, 1.2, 0.9, 1.1, 1.0, 1.02]
    narrow = bootstrap_ratio_interval(new, old, confidence=0.5)
    wide = bootstrap_ratio_interval(new, old, confidence=0.99)
    assert wide[0] <= narrow[0] and narrow[1] <= wide[1]
    assert not math.isclose(wide[1] - wide[0], narrow[1] - narrow[0])


def test_the_paired_interval_is_the_textbook_t_interval_of_the_log_ratios() -> None:
    """Log ratios 0, 0.1, 0.2, 0.3, 0.4: mean 0.2, s = √0.025, df 4, t(0.975, 4) = 2.7764."""
    new = [math.exp(x) for x in (0.0, 0.1, 0.2, 0.3, 0.4)]
    test = paired_ratio(new, [1.0] * 5, confidence=0.95)
    half = 2.7764 * math.sqrt(0.025 / 5)
    assert test.ratio == pytest.approx(math.exp(0.2))
    assert test.interval == pytest.approx((math.exp(0.2 - half), math.exp(0.2 + half)), rel=1e-4)
    # t = 0.2 ÷ √(0.025 ÷ 5) = 2.828 on 4 degrees of freedom, just past 2.776: p just below 5%
    assert test.p_value == pytest.approx(0.0474, abs=5e-4)


def test_pairing_cancels_the_drift_a_pair_shares() -> None:
    """A machine slowing ×2 over the run moves both sides of each pair alike: the pairs
    see a steady 10% fall that the unpaired samples, spread over the drift, hide."""
    drift = [1.0, 0.8, 0.65, 0.55, 0.5, 0.6, 0.9]
    baseline = [100 * d for d in drift]
    candidate = [90 * d * (1 + 0.002 * (-1) ** i) for i, d in enumerate(drift)]
    paired = paired_ratio(candidate, baseline, confidence=1 - 0.01 / 8)
    assert paired.p_value < 0.01 / 8
    assert 0.88 < paired.interval[0] < paired.ratio < paired.interval[1] < 0.92
    assert mann_whitney_u(candidate, baseline).p_value > 0.3


def test_a_side_against_itself_is_ratio_one_with_p_one() -> None:
    same = paired_ratio([5.0, 7.0, 6.0], [5.0, 7.0, 6.0], confidence=0.99)
    assert (same.ratio, same.interval, same.p_value) == (1.0, (1.0, 1.0), 1.0)
    one = paired_ratio([5.0], [4.0], confidence=0.99)  # one pair: no spread, nothing known
    assert one.interval == (0.0, math.inf) and one.p_value == 1.0
    with pytest.raises(ValueError, match="same number"):
        paired_ratio([1.0, 2.0], [1.0], confidence=0.99)


def test_a_stricter_level_widens_the_paired_interval() -> None:
    new, old = [9.0, 9.5, 8.8, 9.2, 9.1], [10.0, 10.1, 9.9, 10.0, 10.2]
    loose, strict = paired_ratio(new, old, 0.99), paired_ratio(new, old, 1 - 0.01 / 8)
    assert strict.interval[0] < loose.interval[0] < loose.interval[1] < strict.interval[1]
    assert strict.p_value == loose.p_value
