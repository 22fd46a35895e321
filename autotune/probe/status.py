"""What a running probe tells a progress display: its phase and, while it measures, the
rate and interval it would stop on. A one-way hook: nothing flows back into the probe."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.stats import RateEstimate
from autotune.window import ProbeSettings, pooled_estimate, warm_until


@dataclass(frozen=True, slots=True)
class ProbeStatus:
    """One look at a probe. Rates are wall-clock rollouts/s (a diagnosis of the simulator
    converts its result to simulated time afterwards)."""

    phase: str  # warm-up | measuring | drain
    parallelism: int
    completed: int  # rollouts finished since the probe began
    phase_s: float  # seconds in this phase (measuring: this block's window so far)
    max_s: float  # the probe stops measuring by then, whatever its precision
    target_halfwidth: float  # ... or once its interval is this narrow (relative)
    rate: float | None = None  # measuring and drain: the pooled rate so far
    halfwidth: float | None = None  # its 95% interval's relative half-width


ProbeWatch = Callable[[ProbeStatus], None]


def probe_status(
    done_at: Sequence[float],
    settings: ProbeSettings,
    started: float,
    now: float,
    mean_latency_s: float,
) -> ProbeStatus:
    """The status at `now` of a run that began at `started`: warm-up until every slot has
    finished a rollout, then measuring, with the estimate `steady_window` stops on."""
    warm = warm_until(done_at, settings.parallelism, started, settings.warmup_s)
    if warm is None:
        return ProbeStatus(
            "warm-up",
            settings.parallelism,
            len(done_at),
            now - started,
            settings.max_s,
            settings.target_halfwidth,
        )
    estimate, _ = pooled_estimate(done_at, [(warm, now)], mean_latency_s)
    halfwidth = estimate.relative_halfwidth
    return ProbeStatus(
        "measuring",
        settings.parallelism,
        len(done_at),
        now - warm,
        settings.max_s,
        settings.target_halfwidth,
        rate=estimate.rate,
        halfwidth=halfwidth if math.isfinite(halfwidth) else None,
    )


def drain_status(
    settings: ProbeSettings,
    completed: int,
    windows: Sequence[tuple[float, float]],
    estimate: RateEstimate | None,
) -> ProbeStatus:
    """The status once measuring has stopped: what was measured over `windows`, while the
    rollouts still in flight finish (never counted)."""
    halfwidth = estimate.relative_halfwidth if estimate is not None else math.inf
    return ProbeStatus(
        "drain",
        settings.parallelism,
        completed,
        sum(end - start for start, end in windows),
        settings.max_s,
        settings.target_halfwidth,
        rate=estimate.rate if estimate is not None else None,
        halfwidth=halfwidth if math.isfinite(halfwidth) else None,
    )
