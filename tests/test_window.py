"""The steady-state window's rules (pure: no server): its length in measured rollout
latencies, and long rollouts timed in tokens."""

from __future__ import annotations

import random
from dataclasses import replace

from autotune.stats import RateEstimate
from autotune.window import (
    MIN_BATCHES,
    TOKENS_PER_SLOT,
    ProbeSettings,
    counted_in_rounds,
    in_rollouts,
    length_spread,
    long_rollouts,
    pooled_estimate,
    reconcile,
    steady_window,
    token_window,
)

SETTINGS = ProbeSettings(parallelism=4, warmup_s=1.0, min_s=3.0, max_s=20.0, target_halfwidth=0.1)


def counter(rate: float, until: float, *, start_at: float = 0.0, noise: float = 0.0, seed: int = 0):
    """A token count read every 0.25 s: nothing until `start_at` (prefill), then `rate`
    tokens a second, each reading's increase varied by ±`noise`."""
    rng = random.Random(seed)
    points, value, t = [(0.0, 0.0)], 0.0, 0.0
    while t < until:
        t += 0.25
        if t > start_at:
            value += rate * 0.25 * (1 + rng.uniform(-noise, noise))
        points.append((t, value))
    return points


def test_rollouts_are_long_when_a_window_of_completions_cannot_fit_the_cap() -> None:
    # a window needs warm-up and 8 batches of 2 latencies: 17 latencies within max_s 20
    assert not long_rollouts(SETTINGS, started=0.0, now=0.5, latency_s=1.0)
    assert long_rollouts(SETTINGS, started=0.0, now=0.5, latency_s=1.3)
    # before any completion, the time waited so far is the latency's lower bound
    assert not long_rollouts(SETTINGS, started=0.0, now=1.0, latency_s=0.0)
    assert long_rollouts(SETTINGS, started=0.0, now=1.5, latency_s=0.0)


def test_warm_up_in_tokens_waits_for_every_slot_and_warmup_s() -> None:
    # 4 slots need 16 tokens; at 2 tokens/s after 1 s of prefill that is t = 9
    slow = counter(2.0, 12.0, start_at=1.0)
    assert token_window(slow, SETTINGS, started=0.0, now=8.75) is None
    early = counter(1000.0, 0.75)  # thousands of tokens, but warmup_s has not passed
    assert token_window(early, SETTINGS, started=0.0, now=0.75) is None
    assert TOKENS_PER_SLOT * SETTINGS.parallelism == 16


def test_a_steady_token_rate_stops_on_precision_and_converts_to_rollouts() -> None:
    points = counter(400.0, 10.0, noise=0.2)
    window = token_window(points, SETTINGS, started=0.0, now=10.0)
    assert window is not None and window.reason == "precision (in tokens)"
    assert window.start == 1.0  # warmup_s, by which 400 tokens had come
    tokens = window.tokens
    assert tokens is not None and tokens.batches >= MIN_BATCHES
    assert tokens.relative_halfwidth <= 0.1
    rollouts = in_rollouts(tokens, 2000.0)  # rollouts of 2,000 tokens
    assert abs(rollouts.rate - tokens.rate / 2000) < 1e-12
    assert abs(rollouts.high / rollouts.rate - tokens.high / tokens.rate) < 1e-12
    assert in_rollouts(tokens, None).high == float("inf")  # none finished: no rollout rate


def test_a_mean_length_measured_from_few_varied_rollouts_widens_the_rollout_rate() -> None:
    """The rollouts/s a token rate gives is no surer than the mean length it is divided
    by: alike lengths add nothing, varied ones add their mean's 95% half-width."""
    tokens = RateEstimate(1000.0, 950.0, 1050.0, 4000, 4.0, 8)  # ±5%
    assert length_spread([32] * 50) == 0.0
    assert length_spread([500]) == 0.0  # one finished: its length is all there is
    lengths = [10, 30, 50, 70, 90] * 20  # mean 50, sd 28.4 over 100
    spread = length_spread(lengths)
    assert 0.10 < spread < 0.12  # 1.96 × 28.4 / √100 / 50 = 0.111
    alike, varied = in_rollouts(tokens, 50.0), in_rollouts(tokens, 50.0, spread)
    assert varied.rate == alike.rate == 20.0
    assert abs(alike.high / alike.rate - 1.05) < 1e-9
    assert abs(varied.high / varied.rate - 1 - (0.05**2 + spread**2) ** 0.5) < 1e-9
    assert abs(1 - varied.low / varied.rate - (0.05**2 + spread**2) ** 0.5) < 1e-9


def test_the_token_rate_interval_covers_the_true_rate() -> None:
    covered, trials = 0, 200
    for seed in range(trials):
        points = counter(400.0, 21.0, noise=0.5, seed=seed)
        now = next(t for t, _ in points if token_window(points, SETTINGS, started=0.0, now=t))
        window = token_window(points, SETTINGS, started=0.0, now=now)
        assert window is not None and window.tokens is not None
        covered += window.tokens.low <= 400.0 <= window.tokens.high
    assert 0.89 * trials <= covered < trials


def test_a_jumpy_token_rate_runs_to_the_cap_in_tokens() -> None:
    points = counter(400.0, 30.0, noise=1.0, seed=3)
    assert token_window(points, SETTINGS, started=0.0, now=15.0) is None
    window = token_window(points, SETTINGS, started=0.0, now=21.0)
    assert window is not None and window.reason == "time cap (in tokens)"


def test_a_window_counted_in_latencies_ends_after_that_many_measured_latencies() -> None:
    """A sweep's rung asks for 2.5 rollout latencies: the probe counts them in the latency
    it measures, so a rung whose rollouts are faster than guessed (max_s) ends sooner."""
    done_at = [0.5 * k for k in range(1, 200)]  # 4 slots, 2 s a rollout, staggered
    asked = ProbeSettings(4, warmup_s=0.0, min_s=1.0, max_s=60.0, target_halfwidth=1e-6)
    counted = replace(asked, window_latencies=2.5)
    # Warm at 2.0 s, when the fourth slot has finished a rollout: 2.5 latencies is 5 s.
    assert steady_window(done_at, counted, started=0.0, now=6.9, mean_latency_s=2.0) is None
    window = steady_window(done_at, counted, started=0.0, now=7.0, mean_latency_s=2.0)
    assert window is not None and window.reason == "time cap" and window.start == 2.0
    assert steady_window(done_at, asked, started=0.0, now=7.0, mean_latency_s=2.0) is None
    # max_s still bounds it, and min_s is its floor.
    assert counted.cap_s(100.0) == 60.0 and counted.cap_s(0.1) == 1.0
    assert asked.cap_s(2.0) == 60.0


def test_the_token_rate_and_counted_completions_reconcile() -> None:
    tokens = RateEstimate(10.0, 9.0, 11.0, 200, 10.0, 8)  # ±10%
    precise = RateEstimate(10.4, 10.2, 10.6, 104, 10.0, 6)  # ±2%, agreeing
    rate, check = reconcile(tokens, precise)
    assert rate is precise and check.used == "completions" and check.agree and check.why is None
    rate, check = reconcile(tokens, RateEstimate(10.5, 7.0, 14.0, 105, 10.0, 4))
    assert rate is tokens and check.used == "tokens"  # the narrower
    assert check.why is None  # 4.8% apart
    apart = RateEstimate(20.0, 19.0, 21.0, 200, 10.0, 6)  # e.g. four tokens a piece
    rate, check = reconcile(tokens, apart)
    assert check.used == "neither: they disagree" and not check.agree
    assert (rate.low, rate.high, rate.rate) == (9.0, 21.0, 20.0)  # spans both
    assert check.why is not None and "disagree beyond their intervals" in check.why
    few = RateEstimate(12.0, 6.0, 18.0, 12, 10.0, 3)  # 12 completions: too few to count
    rate, check = reconcile(tokens, few)
    assert rate is tokens and check.counted is None and "12 completions" in (check.why or "")


def test_completions_counted_in_whole_rounds_read_a_lock_step_server_exactly() -> None:
    """Eight slots finishing together every 0.6 s run 13.33 rollouts/s. A window timed in
    tokens begins anywhere between the waves; counted from that instant (`pooled_estimate`)
    the first batch takes a wave for part of a period, and the rate reads high or low by
    where the window began. Counted from its first completion in whole rounds, it reads
    the rate wherever it began."""
    period, slots = 0.6, 8
    done_at = sorted(wave * period + slot * 1e-4 for wave in range(1, 20) for slot in range(slots))
    true_rate = slots / period
    for start in (1.21, 1.5, 1.79, 2.4001):
        end = start + 4.0
        rounds = counted_in_rounds(done_at, start, end, slots, period)
        assert abs(rounds.rate / true_rate - 1) < 0.01, (start, rounds)
        assert rounds.low - 1e-9 <= true_rate <= rounds.high + 1e-9
    from_instant = [
        pooled_estimate(done_at, [(start, start + 4.0)], period)[0].rate / true_rate
        for start in (1.21, 1.5, 1.79)
    ]
    assert max(from_instant) - min(from_instant) > 0.05, from_instant  # the old count moved
