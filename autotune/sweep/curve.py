"""The curve algorithm: one configuration's throughput against parallelism, by doubling.

A server restart costs 30 s to minutes; a probe costs seconds. So each trial starts one
configuration once and doubles parallelism on it (the NeMo Gym guide's method) until
throughput plateaus or errors appear; the Universal Scalability Law fit of those points
places the peak and the knee (knee.py). Nothing here knows Optuna: a fake launcher and
probe test it on their own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.config import Study
from autotune.errors import ServerStartupError
from autotune.knee import summarise_curve
from autotune.probe import Probe
from autotune.results import CurvePoint, CurveSummary

MIN_USABLE_POINTS = 2  # a curve needs two; a start above a configuration's peak may leave one


class Launcher(Protocol):
    """Starts a server configuration and stops it when the block ends.

    A configuration the server refuses raises ServerStartupError, whose `reason` is the
    server's own error line.
    """

    def running(self, knobs: Mapping[str, Any]) -> AbstractAsyncContextManager[Probe]: ...


@dataclass(frozen=True, slots=True)
class TrialOutcome:
    """What one trial measured (stored in the trial's user attributes)."""

    knobs: dict[str, Any]
    points: list[CurvePoint]
    curve: CurveSummary | None
    value: float
    p95_latency_s: float | None
    error_rate: float
    infeasible_reason: str | None
    probe_s: float
    wall_s: float


async def measure_curve(
    probe: Probe, study: Study, start: int
) -> tuple[list[CurvePoint], str | None]:
    """Double parallelism from `start` until throughput plateaus, errors appear or the
    range ends; then, if that left fewer than two usable points (errors at `start`, or
    a start past this configuration's own plateau), halve below `start` for more.
    Returns the points, lowest parallelism first, and, if the server died, why."""
    space = study.search_space.parallelism
    limit = study.objective.max_error_rate
    metric = study.objective.metric
    points: list[CurvePoint] = []
    parallelism = start
    while parallelism <= space.high:
        point = CurvePoint.of(await probe.measure(parallelism))
        points.append(point)
        if point.stop_reason == "server died":
            return points, f"the server stopped answering at parallelism {parallelism}"
        if point.error_rate > limit:
            break
        plateau = points[-2].metric(metric) * (1 + space.plateau_gain) if len(points) > 1 else 0
        if point.metric(metric) < plateau:
            break
        parallelism *= 2
    parallelism = start
    while (
        parallelism > space.low and sum(p.error_rate <= limit for p in points) < MIN_USABLE_POINTS
    ):
        parallelism = max(space.low, parallelism // 2)
        point = CurvePoint.of(await probe.measure(parallelism))
        points.insert(0, point)
        if point.stop_reason == "server died":
            return points, f"the server stopped answering at parallelism {parallelism}"
    return points, None


def start_parallelism(study: Study, best_peak: float | None) -> int:
    """Doubling starts at `low`, or a quarter of the best peak so far on the same ladder."""
    low = study.search_space.parallelism.low
    if not best_peak:
        return low
    start = low
    while start * 2 <= best_peak / 4 and start * 2 <= study.search_space.parallelism.high:
        start *= 2
    return start


async def run_trial(
    launcher: Launcher, knobs: dict[str, Any], study: Study, start: int
) -> TrialOutcome:
    """Start the configuration, measure its curve, stop it; failures become outcomes."""
    started = time.perf_counter()
    points: list[CurvePoint] = []
    reason: str | None = None
    try:
        async with launcher.running(knobs) as probe:
            points, reason = await measure_curve(probe, study, start)
    except ServerStartupError as error:  # deterministic: the server refuses these knobs
        reason = error.reason
    metric = study.objective.metric
    usable = [p for p in points if p.error_rate <= study.objective.max_error_rate]
    best = max(usable, key=lambda p: p.metric(metric), default=None)
    curve = None
    if usable:
        curve = summarise_curve([p.parallelism for p in usable], [p.metric(metric) for p in usable])
    if best is None and reason is None:
        reason = f"every probe failed more than {study.objective.max_error_rate:.0%} of rollouts"
    return TrialOutcome(
        knobs=knobs,
        points=points,
        curve=curve,
        value=best.metric(metric) if best else 0.0,
        p95_latency_s=best.p95_latency_s if best else None,
        error_rate=best.error_rate if best else 1.0,
        infeasible_reason=reason if best is None else None,
        probe_s=sum(p.probe_s for p in points),
        wall_s=time.perf_counter() - started,
    )
