"""The steady-state window every probe measures in: after warm-up, before the drain.

Pure: given when rollouts finished, it says when warm-up ended and whether the window so
far is long and precise enough to stop. The engine probe and the virtual-time probe ask
while they run; the command probe asks once its collector has finished. A closed loop
of `parallelism` slots is warm once every slot has finished a rollout (and `warmup_s`
has passed). The window is cut into batches of equal numbers of completions, each
spanning about BATCH_LATENCIES mean rollout latencies (so neighbouring batches share few
rollouts and a batch never counts a wave of completions twice), at least MIN_BATCHES of
them: the window's length follows the measured latency. It stops once the rate's 95%
interval is within ±`target_halfwidth` ("precision") over a window at least `min_s`
long, or at `max_s` ("time cap"). A probe that is extended measures more windows at the
same parallelism later (`earlier`): its estimate pools every window's batches, and
`max_s` caps their total. Completions after the stop (the drain, slots idling as the
last rollouts finish) are never counted.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.config import PROBE_DEFAULTS, ProbeSpec
from autotune.stats import RateEstimate, completion_batches_rate

MIN_EVENTS = 20  # completions a window at its precision target holds at least
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
    reason: str  # precision | time cap | rows timed | whole run timed
    estimate: RateEstimate | None = None  # None: the caller times a finished run itself


def warm_until(
    done_at: Sequence[float], parallelism: int, started: float, warmup_s: float
) -> float | None:
    """When warm-up ended: the completion by which every slot had finished one rollout
    since `started` and `warmup_s` had passed; None while it has not (`done_at` is in
    time order)."""
    first = bisect_left(done_at, started)
    index = max(first + parallelism - 1, bisect_left(done_at, started + warmup_s))
    return done_at[index] if index < len(done_at) else None


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


def steady_window(
    done_at: Sequence[float],
    settings: ProbeSettings,
    *,
    started: float,
    now: float,
    mean_latency_s: float,
    finished: bool = False,
    earlier: Sequence[tuple[float, float]] = (),
    enough: Callable[[RateEstimate], bool] | None = None,
) -> Window | None:
    """The window to measure, or None while the probe should go on.

    `finished`: the collector already ran to its end (a user's command), so the window
    is cut before the drain: it ends at the completion that left the last `parallelism`
    rollouts in flight. Too few completions for that: the whole run is the window.
    `earlier`: this probe's windows measured before `started`, pooled with this one.
    `enough`: when the estimate is precise enough, instead of ±`target_halfwidth` (a
    diagnosis stops a probe as soon as its verdict is decided).
    """
    parallelism = settings.parallelism
    warm = warm_until(done_at, parallelism, started, settings.warmup_s)
    if finished:
        if warm is not None and len(done_at) > 2 * parallelism:
            drain = done_at[-parallelism]
            if drain > warm:
                return Window(warm, drain, "rows timed")
        return Window(started, now, "whole run timed")
    measured_before = sum(end - start for start, end in earlier)
    if warm is None:
        if now - started > settings.max_s:
            estimate, _ = pooled_estimate(done_at, [*earlier, (started, now)], mean_latency_s)
            return Window(started, now, "time cap", estimate)
        return None
    elapsed = now - warm
    estimate, end = pooled_estimate(done_at, [*earlier, (warm, now)], mean_latency_s)
    if measured_before + elapsed >= settings.max_s:
        return Window(warm, end if end > warm else now, "time cap", estimate)
    if (
        elapsed >= settings.min_s
        and estimate.batches >= MIN_BATCHES
        and estimate.events >= MIN_EVENTS
        and (
            enough(estimate)
            if enough is not None
            else estimate.relative_halfwidth <= settings.target_halfwidth
        )
    ):
        return Window(warm, end, "precision", estimate)
    return None
