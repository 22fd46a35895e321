"""The steady-state window every probe measures in: after warm-up, before the drain.

Pure: given when rollouts finished, it says when warm-up ended and whether the window so
far is long and precise enough to stop. The engine probe and the virtual-time probe ask
while they run; the command probe asks once its collector has finished. A closed loop
of `parallelism` slots is warm once every slot has finished a rollout (and `warmup_s`
has passed); it stops once the rate's 95% interval is within ±`target_halfwidth` over a
window at least `min_s` and one mean rollout latency long (a shorter window samples one
phase of the completion waves), or at `max_s`. Completions after the stop (the drain,
slots idling as the last rollouts finish) are never counted.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.config import PROBE_DEFAULTS, ProbeSpec
from autotune.stats import batch_means_rate

MIN_EVENTS = 20  # completions a converged window needs at least


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """How long and how precisely to measure one parallelism (defaults: config.ProbeSpec)."""

    parallelism: int
    warmup_s: float = PROBE_DEFAULTS.warmup_s
    min_s: float = PROBE_DEFAULTS.min_s
    max_s: float = PROBE_DEFAULTS.max_s
    target_halfwidth: float = PROBE_DEFAULTS.target_halfwidth
    telemetry_interval_s: float = 0.5

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
    """The measured span [start, end) and why it ended there."""

    start: float
    end: float
    reason: str  # converged | time cap | rows timed | whole run timed


def warm_until(
    done_at: Sequence[float], parallelism: int, started: float, warmup_s: float
) -> float | None:
    """When warm-up ended: the completion by which every slot had finished one rollout
    and `warmup_s` had passed; None while it has not (`done_at` is in time order)."""
    if len(done_at) < parallelism:
        return None
    index = max(parallelism - 1, bisect_left(done_at, started + warmup_s))
    return done_at[index] if index < len(done_at) else None


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
        return Window(started, now, "time cap") if now - started > settings.max_s else None
    elapsed = now - warm
    if elapsed >= settings.max_s:
        return Window(warm, now, "time cap")
    if elapsed >= max(settings.min_s, mean_latency_s):
        estimate = batch_means_rate(done_at, warm, now)
        if (
            estimate.events >= MIN_EVENTS
            and estimate.relative_halfwidth <= settings.target_halfwidth
        ):
            return Window(warm, now, "converged")
    return None
