"""The steady-state window every probe measures in: after warm-up, before the drain. Pure:
given when rollouts finished, it says when warm-up ended and whether the window so far is
long and precise enough to stop. Why: docs/design/probes.md.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.config.collection import PROBE_DEFAULTS, ProbeSpec
from autotune.results.probes import ProbeBlock, RateCheck
from autotune.stats import (
    RateEstimate,
    completion_batches_rate,
    counter_rate,
    mean_interval,
    t95,
)

MIN_EVENTS = 20  # completions a window at its precision target holds at least
TOKENS_PER_SLOT = 4  # warm-up in tokens: every slot's request has started generating
TOKEN_BATCH_S = 0.5  # a token-rate batch spans at least this (two looks of the probe)
MIN_BATCHES = 8  # batches a window at its precision target holds at least
MAX_BATCHES = 30  # past this, batches grow instead (long-range drifts stay in the spread)
BATCH_LATENCIES = 2.0  # mean rollout latencies one batch spans at least


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """How long and how precisely to measure one parallelism (defaults: config.ProbeSpec)."""

    parallelism: int
    warmup_s: float = PROBE_DEFAULTS.warmup_s
    min_s: float = PROBE_DEFAULTS.min_s
    max_s: float = PROBE_DEFAULTS.max_s
    target_halfwidth: float = PROBE_DEFAULTS.target_halfwidth
    telemetry_interval_s: float = 0.5
    group_size: int = 1  # above 1: the tasks come in GRPO groups, counted as such
    # Rollouts too long for a window of completions are timed in output tokens (diagnose);
    # off, a window of completions runs to its cap (a sweep's and a suite's fixed windows).
    in_tokens: bool = False
    # Above 0: the window ends after this many rollout latencies as measured so far (never
    # under min_s), if before max_s; max_s then bounds a latency guessed too short.
    window_latencies: float = 0.0

    def cap_s(self, mean_latency_s: float) -> float:
        """The window's time cap, given the mean rollout latency measured so far."""
        if self.window_latencies <= 0 or mean_latency_s <= 0:
            return self.max_s
        return min(self.max_s, max(self.min_s, self.window_latencies * mean_latency_s))

    @classmethod
    def of(cls, spec: ProbeSpec, parallelism: int) -> ProbeSettings:
        """The settings a study's or a suite's `probe:` mapping gives, at `parallelism`."""
        return cls(
            parallelism,
            warmup_s=spec.warmup_s,
            min_s=spec.min_s,
            max_s=spec.max_s,
            target_halfwidth=spec.target_halfwidth,
        )


@dataclass(frozen=True, slots=True)
class Window:
    """The measured span [start, end], why it ended there, and the rate measured over it
    (and over the probe's earlier windows)."""

    start: float
    end: float
    reason: str  # precision | time cap (either "in tokens") | rows timed | whole run timed
    estimate: RateEstimate | None = None  # None: the caller times a finished run itself
    tokens: RateEstimate | None = None  # output tokens/s, where the window was timed in them


def warm_until(
    done_at: Sequence[float], parallelism: int, started: float, warmup_s: float
) -> float | None:
    """When warm-up ended: the completion by which every slot had finished one rollout
    since `started` and `warmup_s` had passed; None while it has not (`done_at` is in
    time order)."""
    first = bisect_left(done_at, started)
    index = max(first + parallelism - 1, bisect_left(done_at, started + warmup_s))
    return done_at[index] if index < len(done_at) else None


def long_rollouts(settings: ProbeSettings, started: float, now: float, latency_s: float) -> bool:
    """Whether rollouts take too long for a window of completions within `max_s`: its
    warm-up and MIN_BATCHES batches of BATCH_LATENCIES latencies (before the first
    completion, its latency is at least the time waited so far)."""
    latency = latency_s if latency_s > 0 else now - started
    return latency * (MIN_BATCHES * BATCH_LATENCIES + 1) > settings.max_s


def token_window(
    tokens: Sequence[tuple[float, float]],
    settings: ProbeSettings,
    *,
    started: float,
    now: float,
) -> Window | None:
    """The window timed in tokens (`tokens`: the cumulative count read over time), or
    None while it should go on: warm once TOKENS_PER_SLOT a slot have been generated
    since `started` (and `warmup_s` has passed), stopped by the same precision and time
    rules as completions. Its rollouts/s waits for the tokens of finished rollouts
    (`in_rollouts`): the first of a minute-long rollout may come after the window."""
    counted = [(t, v) for t, v in tokens if t >= started]
    if not counted:
        return None
    first = counted[0][1]
    warm = next(
        (
            t
            for t, v in counted
            if t >= started + settings.warmup_s
            and v - first >= TOKENS_PER_SLOT * settings.parallelism
        ),
        None,
    )
    if warm is None:
        return None
    capped = min(now, warm + settings.max_s)  # a reading past the cap is not measured
    rate = counter_rate(counted, warm, capped, TOKEN_BATCH_S, MAX_BATCHES)
    reason = None
    if now - warm >= settings.max_s:
        reason = "time cap (in tokens)"
    elif (
        now - warm >= settings.min_s
        and rate.batches >= MIN_BATCHES
        and rate.relative_halfwidth <= settings.target_halfwidth
    ):
        reason = "precision (in tokens)"
    if reason is None:
        return None
    return Window(warm, warm + rate.window_s, reason, tokens=rate)


def in_rollouts(
    tokens: RateEstimate, tokens_per_rollout: float | None, spread: float = 0.0
) -> RateEstimate:
    """A rate of output tokens as rollouts/s, by the tokens a finished rollout had (none
    finished: 0, with no upper bound). Any unit converts so: pieces as tokens, by the
    pieces a token took. `spread`: the relative 95% half-width of `tokens_per_rollout`
    (`length_spread`), which widens the interval: a mean length is measured too."""
    if not tokens_per_rollout:
        return RateEstimate(0.0, 0.0, math.inf, 0, tokens.window_s, tokens.batches)
    rate = tokens.rate / tokens_per_rollout
    low, high = tokens.low / tokens_per_rollout, tokens.high / tokens_per_rollout
    if spread > 0 and rate > 0:
        low = rate * max(0.0, 1 - math.hypot(1 - low / rate, spread))
        high = rate * (1 + math.hypot(high / rate - 1, spread))
    events = round(tokens.events / tokens_per_rollout)
    return RateEstimate(rate, low, high, events, tokens.window_s, tokens.batches)


def length_spread(lengths: Sequence[int]) -> float:
    """The relative 95% half-width of the mean of `lengths` (finished rollouts' tokens):
    0 where they are all alike, or only one has finished (its length is all there is)."""
    interval = mean_interval(lengths)
    if interval is None:
        return 0.0
    low, high = interval
    centre = (low + high) / 2
    return (high - centre) / centre if centre > 0 else 0.0


def reconcile(from_tokens: RateEstimate, counted: RateEstimate) -> tuple[RateEstimate, RateCheck]:
    """A window timed in tokens, as rollouts/s: its token rate converted (`from_tokens`)
    beside the completions counted over the same window. Where they agree (their
    intervals meet), the narrower; where they do not, the counted rate with an interval
    spanning both, which no verdict can be surer than. Too few completions to count
    (fewer than MIN_EVENTS, or one batch): the token rate."""
    usable = counted.events >= MIN_EVENTS and counted.batches > 1 and math.isfinite(counted.high)
    check = RateCheck(
        (from_tokens.rate, from_tokens.low, from_tokens.high),
        (counted.rate, counted.low, counted.high) if usable else None,
        counted.events,
        "tokens",
    )
    if check.counted is None:
        return from_tokens, check
    if not check.agree:
        both = RateEstimate(
            counted.rate,
            min(counted.low, from_tokens.low),
            max(counted.high, from_tokens.high),
            counted.events,
            counted.window_s,
            min(counted.batches, from_tokens.batches),
        )
        return both, replace(check, used="neither: they disagree")
    if counted.relative_halfwidth <= from_tokens.relative_halfwidth:
        return counted, replace(check, used="completions")
    return from_tokens, check


def batch_events(events: int, span_s: float, latency_s: float) -> int:
    """Completions per batch: as many as finish in BATCH_LATENCIES mean latencies at the
    rate seen so far (a closed loop's slots finish together, so a batch must hold several
    rounds), and enough that there are at most MAX_BATCHES batches."""
    if events <= 0 or span_s <= 0:
        return 1
    per_latency = events / span_s * latency_s
    return max(1, math.ceil(BATCH_LATENCIES * per_latency), math.ceil(events / MAX_BATCHES))


def pooled_estimate(
    done_at: Sequence[float],
    windows: Sequence[tuple[float, float]],
    latency_s: float,
) -> tuple[RateEstimate, float]:
    """The rate over every window, in batches sized from the latency, and where the last
    window's last whole batch ended (its measured end)."""
    first = [bisect_right(done_at, start) for start, _ in windows]
    last = [bisect_right(done_at, end) for _, end in windows]
    events = sum(b - a for a, b in zip(first, last, strict=True))
    span = sum(end - start for start, end in windows)
    k = batch_events(events, span, latency_s)
    estimate = completion_batches_rate(done_at, windows, k)
    counted = (last[-1] - first[-1]) // k * k
    end = done_at[first[-1] + counted - 1] if counted else windows[-1][0]
    return estimate, end


def counted_in_rounds(
    done_at: Sequence[float], start: float, end: float, parallelism: int, latency_s: float
) -> RateEstimate:
    """The completions over a window that began between two (one timed in tokens), from
    its first completion in batches of whole rounds of `parallelism`, so that each batch
    ends where it began among a closed loop's waves. Begun between two waves, or ended
    within one, a count of slots that finish together read 13.7 rollouts/s where 13.0 ran."""
    first = bisect_left(done_at, start)
    if first < len(done_at) and done_at[first] <= end:
        start = done_at[first]
    events = bisect_right(done_at, end) - bisect_right(done_at, start)
    k = batch_events(events, end - start, latency_s)
    slots = max(1, parallelism)
    return completion_batches_rate(done_at, [(start, end)], slots * max(1, round(k / slots)))


def steady_window(
    done_at: Sequence[float],
    settings: ProbeSettings,
    *,
    started: float,
    now: float,
    mean_latency_s: float,
    finished: bool = False,
) -> Window | None:
    """The window to measure, or None while the probe should go on.

    `finished`: the collector already ran to its end (a user's command), so the window
    is cut before the drain: it ends at the completion that left the last `parallelism`
    rollouts in flight. Too few completions for that: the whole run is the window.
    """
    parallelism = settings.parallelism
    warm = warm_until(done_at, parallelism, started, settings.warmup_s)
    if finished:
        if warm is not None and len(done_at) > 2 * parallelism:
            drain = done_at[-parallelism]
            if drain > warm:
                return Window(warm, drain, "rows timed")
        return Window(started, now, "whole run timed")
    if warm is None:
        if now - started > settings.max_s:
            estimate, _ = pooled_estimate(done_at, [(started, now)], mean_latency_s)
            return Window(started, now, "time cap", estimate)
        return None
    elapsed = now - warm
    estimate, end = pooled_estimate(done_at, [(warm, now)], mean_latency_s)
    if elapsed >= settings.cap_s(mean_latency_s):
        return Window(warm, end if end > warm else now, "time cap", estimate)
    if (
        elapsed >= settings.min_s
        and estimate.batches >= MIN_BATCHES
        and estimate.events >= MIN_EVENTS
        and estimate.relative_halfwidth <= settings.target_halfwidth
    ):
        return Window(warm, end, "precision", estimate)
    return None


def pooled_blocks(blocks: Sequence[ProbeBlock]) -> RateEstimate:
    """The rollouts/s of blocks timed on their own (some in tokens), weighted by their
    windows' lengths, with the interval of that weighted mean."""
    span = sum(block.measured_s for block in blocks) or 1e-9
    rate = sum(block.rollouts_per_s * block.measured_s for block in blocks) / span
    variance, dof = 0.0, 0
    for block in blocks:
        halfwidth = block.rollouts_per_s_ci[1] - block.rollouts_per_s
        se = halfwidth / t95(block.batches - 1) if block.batches > 1 else math.inf
        variance += (block.measured_s / span * se) ** 2
        dof += max(block.batches - 1, 0)
    events = round(rate * span)
    if not math.isfinite(variance) or dof < 1:
        return RateEstimate(rate, 0.0, math.inf, events, span, dof)
    halfwidth = t95(dof) * math.sqrt(variance)
    return RateEstimate(rate, max(0.0, rate - halfwidth), rate + halfwidth, events, span, dof + 1)
