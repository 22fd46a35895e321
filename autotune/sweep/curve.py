"""The curve algorithm: one configuration's throughput against parallelism, by doubling
parallelism on one running configuration until it plateaus, with probe time spent where
it decides (short screening rungs, pruning, longer windows at the top).
Why: docs/design/sweep.md.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autotune.config.study import Study
from autotune.errors import ServerStartupError
from autotune.knee import TRUSTED_BATCHES, UNKNOWN_SPREAD, summarise_curve
from autotune.probe import Launcher, Probe, ProbeSettings
from autotune.results.probes import CurvePoint
from autotune.results.stages import LATENCY_SLOS
from autotune.results.trials import CurveSummary, TrialOutcome

MIN_USABLE_POINTS = 2  # a curve needs two; a start above a configuration's peak may leave one
SCREEN_LATENCIES = 2.5  # a screening rung's window: one batch (two rollout latencies) and room
PEAK_LATENCIES = 4.0  # a rung at the top of a curve: two batches, enough for an interval
BENDING = 1.5  # a doubling that gained less than this: the next rung is near the top
FIRST_RUNG_SHARE = 4  # with no best yet, a ladder starts at ceiling ÷ 4 (or low)
SLOWER_GUESS = 2.0  # a new configuration's first rung is timed as if half as fast as the best
QUEUE_GAIN = 0.05  # past max_num_seqs, queued requests gain at most this (none seen: ~1%)
OutOfReach = Callable[[Sequence[CurvePoint]], str | None]  # after each rung: why to stop
Timing = Callable[[Sequence[CurvePoint], int], ProbeSettings | None]  # a rung's probe length


@dataclass(frozen=True, slots=True)
class Ladder:
    """A configuration's measured rungs, lowest parallelism first, and why they ended
    early: the server died, or the curve could not reach the best one (pruned)."""

    points: list[CurvePoint]
    died: str | None = None
    pruned: str | None = None
    probe_s: float = 0.0  # every probe's, a rung measured again included


@dataclass(frozen=True, slots=True)
class Incumbent:
    """The best trial so far: its value, where it was measured, and its points (whose
    latencies time a new configuration's first rung)."""

    value: float
    parallelism: int
    points: list[CurvePoint]
    level: bool = False  # its curve ran level up to its server's ceiling (knee.landmarks)


def expected_latency_s(points: Sequence[CurvePoint], parallelism: int) -> float | None:
    """A rollout's latency at `parallelism`, from the last rung by Little's law (latency =
    parallelism ÷ throughput), the throughput growing as it did over the last step; below
    the last rung, its latency (a batching server's hardly shrinks: a guess on the long
    side)."""
    measured = [p for p in points if p.rollouts_per_s > 0]
    if not measured:
        return None
    last = measured[-1]
    if parallelism < last.parallelism:
        return last.parallelism / last.rollouts_per_s
    growth = 1.0
    if len(measured) > 1 and parallelism > last.parallelism:
        before = measured[-2]
        step = last.parallelism / before.parallelism
        gain = min(max(last.rollouts_per_s / before.rollouts_per_s, 1.0), step)
        growth = gain ** (math.log(parallelism / last.parallelism) / math.log(step))
    return parallelism / (last.rollouts_per_s * growth)


def _guessed_latency_s(reference: Sequence[CurvePoint], parallelism: int) -> float | None:
    """A first rung's latency from the best curve's nearest rung: the same below it (a
    batching server's latency hardly grows while it scales), in proportion above, and
    SLOWER_GUESS times that (the best is the fastest configuration known; a rung too
    short to count anything must be measured again)."""
    measured = [p for p in reference if p.rollouts_per_s > 0]
    if not measured:
        return None
    near = min(measured, key=lambda p: abs(math.log(p.parallelism / parallelism)))
    latency = near.parallelism / near.rollouts_per_s * max(1.0, parallelism / near.parallelism)
    return SLOWER_GUESS * latency


def rung_timing(
    study: Study,
    latencies: float,
    points: Sequence[CurvePoint],
    parallelism: int,
    reference: Sequence[CurvePoint] = (),
) -> ProbeSettings:
    """A rung's probe: a window of `latencies` rollout latencies (so it counts whole
    batches of completions however long rollouts are), never shorter than the study's
    min_s. The probe counts them in the latencies it measures; the latency expected here
    caps the window (a first rung's is guessed from `reference`, the best curve's rungs,
    on the slow side). Without either, the study's settings."""
    spec = study.probe
    settings = ProbeSettings.of(spec, parallelism)
    if points:
        latency = expected_latency_s(points, parallelism)
    else:
        latency = _guessed_latency_s(reference, parallelism)
    if latency is None:
        return settings
    window = max(spec.min_s, latencies * latency)
    return replace(
        settings, min_s=min(spec.min_s, window), max_s=window, window_latencies=latencies
    )


async def measure_curve(
    probe: Probe,
    study: Study,
    start: int,
    *,
    top: int | None = None,
    timing: Timing | None = None,
    out_of_reach: OutOfReach | None = None,
    wanted: Callable[[Sequence[CurvePoint]], bool] | None = None,
    down_to: int | None = None,
) -> Ladder:
    """Double parallelism from `start` until throughput clearly plateaus, errors appear,
    the rung reaches `top` (the server's ceiling) or the range ends, or `out_of_reach` says
    the curve cannot beat the best; then, if that left fewer than two usable points
    (errors at `start`, or a start past this configuration's own plateau) or none within
    the study's SLOs, or to reach `down_to` (a curve started at its ceiling), or while 80%
    of its peak's parallelism lies under its lowest rung, halve below `start`, if the
    curve is `wanted` (a trial that is not the best needs no fit).
    `timing` sets each rung's probe length (None: the probe's own)."""
    space = study.search_space.parallelism
    limit = study.objective.max_error_rate
    metric = study.objective.metric
    points: list[CurvePoint] = []
    spent = 0.0  # every probe's time, a rung measured again included

    async def measure(parallelism: int) -> CurvePoint:
        """A rung; one that counted nothing in time (rollouts far slower than expected)
        is measured again over a window of its observed latency."""
        nonlocal spent
        settings = timing(points, parallelism) if timing else None
        point = CurvePoint.of(await probe.measure(parallelism, settings))
        spent += point.probe_s
        if settings is not None and point.rollouts_per_s <= 0 and point.error_rate == 0:
            latency = point.p50_latency_s or 0.0
            longer = replace(settings, max_s=max(2 * settings.max_s, SCREEN_LATENCIES * latency))
            point = CurvePoint.of(await probe.measure(parallelism, longer))
            spent += point.probe_s
        return point

    def usable(points: Sequence[CurvePoint]) -> list[CurvePoint]:
        return [p for p in points if p.error_rate <= limit]

    def died(parallelism: int) -> Ladder:
        why = f"the server stopped answering at parallelism {parallelism}"
        return Ladder(points, why, probe_s=spent)

    parallelism = start
    while parallelism <= space.high:
        point = await measure(parallelism)
        points.append(point)
        if point.stop_reason == "server died":
            return died(parallelism)
        why = out_of_reach(points) if out_of_reach else None
        if why is not None and (
            point.error_rate > limit or len(usable(points)) < MIN_USABLE_POINTS
        ):
            return Ladder(points, pruned=why, probe_s=spent)  # no halving: out of reach
        if point.error_rate > limit:
            break
        # A plateau is a doubling that gained under plateau_gain even at the top of its
        # rung's 95% interval: a short rung's noise alone must not end the curve early.
        plateau = points[-2].metric(metric) * (1 + space.plateau_gain) if len(points) > 1 else 0
        if _spread(point, metric)[1] < plateau or (top is not None and parallelism >= top):
            break  # the curve is whole
        if why is not None:
            return Ladder(points, pruned=why, probe_s=spent)
        parallelism *= 2

    def too_few(points: Sequence[CurvePoint]) -> bool:
        """Fewer than two usable points, or none within the SLOs (a recommendation read
        off points that all miss them would be extrapolated below the curve)."""
        kept = usable(points)
        return len(kept) < MIN_USABLE_POINTS or not any(_within_slos(p, study) for p in kept)

    def below_rungs(points: Sequence[CurvePoint]) -> bool:
        """80% of the peak's parallelism lies under the lowest rung (a curve level from its
        start): the recommendation would be read off the fit extrapolated below it, and a
        validation there could not step down onto a measured point."""
        kept = usable(points)
        if len(kept) < MIN_USABLE_POINTS:
            return False
        lowest = min(p.parallelism for p in kept)
        return _summary(kept, metric, top).recommended_parallelism < lowest

    parallelism = start
    floor = start if down_to is None else down_to
    while (
        parallelism > space.low
        and (too_few(points) or parallelism > floor or below_rungs(points))
        and (wanted is None or wanted(points))
    ):
        parallelism = max(space.low, parallelism // 2)
        point = await measure(parallelism)
        points.insert(0, point)
        if point.stop_reason == "server died":
            return died(parallelism)
    boundary = slo_boundary(usable(points), study)
    if boundary is not None and (wanted is None or wanted(points)):
        point = await measure(boundary)
        points = sorted([*points, point], key=lambda p: p.parallelism)
        if point.stop_reason == "server died":
            return died(boundary)
    return Ladder(points, probe_s=spent)


def start_parallelism(
    study: Study,
    best_parallelism: float | None,
    top: int | None = None,
    *,
    best_level: bool = False,
) -> int:
    """Doubling starts at `low`, or on the same ladder at the last step at or under an
    eighth of the best configuration's best parallelism and under this one's ceiling
    `top`: two cheap rungs (short rollouts, far below the best's scale) bound the curve,
    and a loser is pruned there. Where the best curve ran level up to its own server's
    ceiling (`best_level`: curves here rise until their servers queue), a configuration
    whose ceiling is known starts there instead: its one rung that can beat the best, so
    a loser is pruned on it and a new best halves down from it."""
    space = study.search_space.parallelism
    if best_level and best_parallelism and top is not None and top <= space.high:
        return max(top, space.low)
    if not best_parallelism:  # far below its ceiling a batching server scales ~linearly
        return _on_ladder(space.low, min(top // FIRST_RUNG_SHARE, space.high)) if top else space.low
    cap = min(best_parallelism / 8, top if top is not None else space.high, space.high)
    return _on_ladder(space.low, cap)


def _on_ladder(low: int, cap: float) -> int:
    """The last step of the doubling ladder from `low` at or under `cap` (`low` at least)."""
    start = low
    while start * 2 <= cap:
        start *= 2
    return start


def _spread(point: CurvePoint, metric: str) -> tuple[float, float]:
    """A point's 95% interval if trusted (knee.TRUSTED_BATCHES), else ±UNKNOWN_SPREAD."""
    interval = point.metric_interval(metric)
    if interval is not None and (point.batches or 0) >= TRUSTED_BATCHES:
        return interval
    value = point.metric(metric)
    return value * (1 - UNKNOWN_SPREAD), value * (1 + UNKNOWN_SPREAD)


def reachable(points: Sequence[CurvePoint], study: Study, top: int | None = None) -> float:
    """The most this configuration's curve could reach at any parallelism of the range.

    Under the Universal Scalability Law throughput per unit of parallelism, X(N)/N, never
    grows (σ, κ ≥ 0), so X(N) ≤ X(n)·N/n beyond the last rung n; and N/X(N) is convex
    in N, so the line through the last two rungs' N/X lies below it beyond them, which
    bounds X tighter. Each rung's figure is taken at the optimistic end of its 95%
    interval. Past the server's ceiling `top` (max_num_seqs) more parallelism only
    queues: the curve is flat there but for QUEUE_GAIN.
    """
    metric = study.objective.metric
    usable = sorted(
        (p for p in points if p.error_rate <= study.objective.max_error_rate),
        key=lambda p: p.parallelism,
    )
    if not usable:
        return math.inf
    best = max(_spread(p, metric)[1] for p in usable)
    last = usable[-1]
    queue = 1 + QUEUE_GAIN if top is not None else 1.0
    far = min(study.search_space.parallelism.high, top if top is not None else math.inf)
    if far <= last.parallelism:
        return best * queue
    x1 = _spread(last, metric)[1]
    bound = x1 * far / last.parallelism  # linear scaling from the last rung
    if len(usable) > 1:
        before = usable[-2]
        n0, n1 = before.parallelism, last.parallelism
        x0 = _spread(before, metric)[0]
        slope = (n1 / x1 - n0 / x0) / (n1 - n0) if x0 > 0 and x1 > 0 else 0.0
        if slope > 0:  # the secant of N/X: tighter once scaling bends
            bound = min(bound, far / (n1 / x1 + slope * (far - n1)))
    return max(best, bound) * queue


def _value(points: Sequence[CurvePoint], study: Study) -> float:
    """The best usable figure among `points`."""
    usable = [p for p in points if p.error_rate <= study.objective.max_error_rate]
    return max((p.metric(study.objective.metric) for p in usable), default=0.0)


SLO_AIM = 0.97  # a rung at an SLO's boundary aims this far inside it (noise moves a p95)
NEW_RUNG_GAIN = 1.1  # a boundary rung is worth measuring this far past the last that met it


def _slos(study: Study) -> list[tuple[str, float]]:
    """The study's latency SLOs: (a curve point's figure, its limit), those set."""
    limits = [(slo.figure, getattr(study.objective, slo.field)) for slo in LATENCY_SLOS]
    return [(figure, limit) for figure, limit in limits if limit is not None]


def slo_boundary(points: Sequence[CurvePoint], study: Study) -> int | None:
    """Where an SLO is crossed between two rungs (one meets it, the next misses), the
    parallelism at which the latency, interpolated on log-log axes, reaches it: a rung
    there reads the configuration's value at the SLO itself, not at the rung below (a
    doubling ladder can leave it far under). None when no SLO is crossed that way."""
    found = []
    for figure, slo in _slos(study):
        target = SLO_AIM * slo
        known = sorted((p for p in points if getattr(p, figure)), key=lambda p: p.parallelism)
        for below, above in itertools.pairwise(known):
            low, high = getattr(below, figure), getattr(above, figure)
            if not low <= target < high:
                continue
            exponent = math.log(above.parallelism / below.parallelism) / math.log(high / low)
            n = math.floor(below.parallelism * (target / low) ** exponent)
            if NEW_RUNG_GAIN * below.parallelism <= n < above.parallelism:
                found.append(n)
            break
    return min(found, default=None)


def _within_slos(point: CurvePoint, study: Study) -> bool:
    return all(
        (figure := getattr(point, name)) is not None and figure <= slo for name, slo in _slos(study)
    )


async def run_trial(
    launcher: Launcher,
    knobs: dict[str, Any],
    study: Study,
    start: int,
    *,
    best: Incumbent | None = None,
    top: int | None = None,
    on_rung: Callable[[int, float], None] | None = None,
) -> TrialOutcome:
    """Start the configuration, measure its curve, stop it; failures become outcomes.

    `best`: the best trial so far; a curve that cannot reach its value is pruned. `top`:
    the most requests the server can run at once (fit.ceiling), where the curve ends.
    `on_rung` gets each rung's number and the best value measured so far (Optuna's
    intermediate value).
    """
    started = time.perf_counter()
    metric = study.objective.metric
    ladder = Ladder([])
    probe_s = 0.0
    reference = best.points if best else []

    def timing(points: Sequence[CurvePoint], parallelism: int) -> ProbeSettings:
        """Short, but long at the top of the study's first curve (the server's ceiling,
        or once a doubling gained less than BENDING): it sets the bar every later trial
        is pruned against."""
        near_top = top is not None and parallelism >= top
        if len(points) > 1 and points[-2].rollouts_per_s > 0:
            near_top |= points[-1].rollouts_per_s < BENDING * points[-2].rollouts_per_s
        latencies = PEAK_LATENCIES if near_top and best is None else SCREEN_LATENCIES
        return rung_timing(study, latencies, points, parallelism, reference)

    def out_of_reach(points: Sequence[CurvePoint]) -> str | None:
        if on_rung is not None:
            on_rung(len(points) - 1, _value(points, study))
        if best is None:
            return None
        bound = reachable(points, study, top)
        if bound >= best.value:
            return None
        return (
            f"its curve could reach at most {bound:.3g} {metric} (the upper bound through "
            f"its last rungs), below the best so far ({best.value:.3g})"
        )

    try:
        async with launcher.running(knobs) as probe:
            ladder = await measure_curve(
                probe,
                study,
                start,
                top=top,
                timing=timing,
                out_of_reach=out_of_reach,
                wanted=lambda points: best is None or _value(points, study) >= best.value,
                # Started at its ceiling: down to the first ladder's span for its fit.
                down_to=top // FIRST_RUNG_SHARE if top is not None and start >= top else None,
            )
            probe_s = ladder.probe_s
            if best is not None and _value(ladder.points, study) > best.value:
                ladder, again_s = await _confirm(probe, study, ladder)
                probe_s += again_s
    except ServerStartupError as error:  # deterministic: the server refuses these knobs
        ladder = Ladder([], error.reason)
    return _outcome(study, knobs, ladder, probe_s, time.perf_counter() - started, top)


async def _confirm(probe: Probe, study: Study, ladder: Ladder) -> tuple[Ladder, float]:
    """A new best: its best point measured again at length, in its place (a screening
    rung is too rough to crown it, and the bar every later trial is pruned against
    should be known well); returns the ladder and the probe time spent."""
    if ladder.died or ladder.pruned:
        return ladder, 0.0
    metric = study.objective.metric
    usable = [p for p in ladder.points if p.error_rate <= study.objective.max_error_rate]
    top = max(usable, key=lambda p: p.metric(metric))
    settings = rung_timing(study, PEAK_LATENCIES, [top], top.parallelism)
    again = CurvePoint.of(await probe.measure(top.parallelism, settings))
    died = None
    if again.stop_reason == "server died":
        died = f"the server stopped answering at parallelism {top.parallelism}"
    points = [again if p is top else p for p in ladder.points]
    return Ladder(points, died, probe_s=ladder.probe_s + again.probe_s), again.probe_s


def level_at(points: Sequence[CurvePoint], top: int, metric: str) -> bool:
    """Whether the curve reached the server's ceiling `top` without falling: its rung
    there is not clearly below its best point (their 95% intervals overlap; without
    intervals, within UNKNOWN_SPREAD). A rung a little under the best by noise is level;
    one clearly under it is a curve that turned down (preemption), which keeps the
    headroom."""
    last = max(points, key=lambda p: p.parallelism)
    if last.parallelism < top:
        return False
    best = max(points, key=lambda p: p.metric(metric))
    if best is last:
        return True
    low, high = last.metric_interval(metric), best.metric_interval(metric)
    if low is None or high is None:
        return last.metric(metric) >= (1 - UNKNOWN_SPREAD) * best.metric(metric)
    return low[1] >= high[0]


def _summary(usable: Sequence[CurvePoint], metric: str, top: int | None) -> CurveSummary:
    """The curve through the usable points, its ceiling `top` where it ran level to it."""
    parallelism = [p.parallelism for p in usable]
    level = top if top is not None and level_at(usable, top, metric) else None
    return summarise_curve(parallelism, [p.metric(metric) for p in usable], level)


def _outcome(
    study: Study,
    knobs: dict[str, Any],
    ladder: Ladder,
    probe_s: float,
    wall_s: float,
    top: int | None = None,
) -> TrialOutcome:
    objective = study.objective
    metric = objective.metric
    usable = [p for p in ladder.points if p.error_rate <= objective.max_error_rate]
    meeting = [p for p in usable if _within_slos(p, study)] or usable
    best = max(meeting, key=lambda p: p.metric(metric), default=None)
    curve = _summary(usable, metric, top) if usable else None
    reason = ladder.died
    if best is None and reason is None:
        reason = f"every probe failed more than {objective.max_error_rate:.0%} of rollouts"
    latencies = [p.p95_latency_s for p in usable if p.p95_latency_s is not None]
    ttfts = [p.p95_ttft_s for p in usable if p.p95_ttft_s is not None]
    tails = [p.p99_latency_s for p in usable if p.p99_latency_s is not None]
    return TrialOutcome(
        knobs=knobs,
        points=ladder.points,
        curve=curve,
        value=best.metric(metric) if best else 0.0,
        p95_latency_s=best.p95_latency_s if best else None,
        error_rate=best.error_rate if best else 1.0,
        infeasible_reason=reason if best is None else None,
        probe_s=probe_s,
        wall_s=wall_s,
        pruned_reason=ladder.pruned,
        min_p95_latency_s=min(latencies, default=None),
        min_p95_ttft_s=min(ttfts, default=None),
        min_p99_latency_s=min(tails, default=None),
    )
