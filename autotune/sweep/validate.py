"""Validate before recommending: hold the recommended configuration at the recommended
parallelism for `budget.validate_rollouts` rollouts, compare with what the sweep
predicted, and step down when a run fails. The rules: docs/design/sweep.md.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import replace

from autotune.config.study import Study
from autotune.errors import ServerStartupError
from autotune.knee import HEADROOM, Interval
from autotune.probe import Launcher, Probe, ProbeSettings
from autotune.results.probes import CurvePoint
from autotune.results.stages import LATENCY_SLOS
from autotune.results.trials import SweepResult, TrialRecord, Validation
from autotune.sweep.recommend import curve_bootstrap, predicted_at, recommendation, usable_points

MAX_STEP_DOWNS = 3
DISPERSION_GROWTH = 1.5  # p95 ÷ p50 may grow this much over the sweep's worst point
SERVER_GONE = "the server"  # how a problem that ends the validation begins
BELOW_PREDICTION = "throughput"  # how the problem of a run below its prediction begins
Prediction = tuple[float, Interval | None]  # throughput, its 95% interval


async def validate(study: Study, launcher: Launcher, result: SweepResult) -> list[Validation]:
    """The validation runs of the study's recommendation, in order (none when
    `budget.validate_rollouts` is 0 or nothing can be recommended)."""
    rollouts = study.budget.rollouts_to_validate(study.target.kind)
    planned = recommendation(result)
    best = result.best()
    if rollouts == 0 or planned is None or best is None:
        return []
    parallelism = planned.recommended.parallelism
    runs: list[Validation] = []
    speed: float | None = None  # the machine's now ÷ during the sweep, once measured
    boot = curve_bootstrap(result, best)  # the curve's fit, bootstrapped once for every run
    # A step down stays within the measured points: below them the fit is unfounded (a
    # curve through 2..16 let a bootstrap draw put 35 rollouts/s or more at 1, where 3 had 6).
    lowest = min((p.parallelism for p in usable_points(result, best)), default=1)

    def predict(at: int) -> Prediction:
        return predicted_at(result, best, boot, at)

    try:
        async with launcher.running(best.knobs) as probe:

            async def measure(at: int) -> CurvePoint:
                return await _measure_at(study, probe, result, best, predict(at)[0], at, rollouts)

            for _ in range(MAX_STEP_DOWNS + 1):
                measured = await measure(parallelism)
                run = _judged(result, best, rollouts, measured, predict, speed)
                if speed is None and _below_prediction(run):
                    speed = await _machine_speed(result, best, parallelism, measure, predict)
                    run = _judged(result, best, rollouts, measured, predict, speed)
                runs.append(run)
                lower = max(min(lowest, parallelism), math.floor(parallelism * HEADROOM))
                gone = any(problem.startswith(SERVER_GONE) for problem in run.problems)
                if run.passed or gone or lower == parallelism:
                    break
                parallelism = lower
    except ServerStartupError as error:
        runs.append(_not_started(result, best, parallelism, rollouts, predict, error.reason))
    return runs


async def _measure_at(
    study: Study,
    probe: Probe,
    result: SweepResult,
    best: TrialRecord,
    predicted: float,
    parallelism: int,
    rollouts: int,
) -> CurvePoint:
    """The validation run itself: at least `rollouts` rollouts at `parallelism`, sized by
    the throughput `predicted` there."""
    points = usable_points(result, best)
    settings = _settings(study, points, parallelism, predicted, result.metric, rollouts)
    return CurvePoint.of(await probe.measure(parallelism, settings))


def _below_prediction(run: Validation) -> bool:
    return any(problem.startswith(BELOW_PREDICTION) for problem in run.problems)


async def _machine_speed(
    result: SweepResult,
    best: TrialRecord,
    parallelism: int,
    measure: Callable[[int], Awaitable[CurvePoint]],
    predict: Callable[[int], Prediction],
) -> float:
    """The sweep's nearest point of this configuration below `parallelism`, run again as
    long as a validation run and held to its own prediction: measured ÷ predicted where it
    is clearly below (its interval under the prediction's), else 1 (the machine is as it
    was, within the noise). A point below, because a server that fails above some load
    must not excuse itself."""
    below = [p for p in usable_points(result, best) if p.parallelism < parallelism]
    if not below:
        return 1.0
    reference = max(below, key=lambda p: p.parallelism).parallelism
    measured = await measure(reference)
    predicted, interval = predict(reference)
    ci = measured.metric_interval(result.metric)
    reach = ci[1] if ci else measured.metric(result.metric)
    if interval is None or reach >= interval[0]:
        return 1.0
    return measured.metric(result.metric) / predicted


def _judged(
    result: SweepResult,
    best: TrialRecord,
    rollouts: int,
    measured: CurvePoint,
    predict: Callable[[int], Prediction],
    speed: float | None,
) -> Validation:
    """A validation run against the prediction at its parallelism, scaled by the machine's
    speed where that was measured."""
    parallelism = measured.parallelism
    predicted, interval = predict(parallelism)
    scaled = ""
    if speed is not None and speed != 1.0:
        predicted *= speed
        interval = (interval[0] * speed, interval[1] * speed) if interval else None
        scaled = f" (scaled ×{speed:.2f}: the machine is slower than during the sweep)"
    points = usable_points(result, best)
    throughput = measured.metric(result.metric)
    ci = measured.metric_interval(result.metric)
    dispersion = _dispersion(measured)
    limit = _dispersion_limit(points)
    problems = []
    if measured.stop_reason == "server died":
        problems.append(f"{SERVER_GONE} stopped answering at parallelism {parallelism}")
    if measured.error_rate > result.max_error_rate:
        problems.append(
            f"error rate {measured.error_rate:.1%} above the {result.max_error_rate:.0%} allowed"
        )
    reach = ci[1] if ci else throughput
    if interval is not None and reach < interval[0]:
        problems.append(
            f"{BELOW_PREDICTION} {throughput:.3g} below the predicted 95% interval "
            f"{interval[0]:.3g}–{interval[1]:.3g}{scaled}"
        )
    if dispersion is not None and limit is not None and dispersion > limit:
        problems.append(f"latency dispersion (p95 ÷ p50) {dispersion:.2f} above {limit:.2f}")
    for latency in LATENCY_SLOS:
        figure, slo = getattr(measured, latency.figure), getattr(result, latency.field)
        if slo is not None and figure is not None and figure > slo:
            problems.append(f"{latency.label} {figure:.3g} s over the {slo:g} s SLO")
    return Validation(
        trial=best.number,
        knobs=best.knobs,
        parallelism=parallelism,
        rollouts=rollouts,
        completed=measured.completed or 0,
        throughput=throughput,
        throughput_ci=ci,
        predicted_throughput=predicted,
        predicted_interval=interval,
        error_rate=measured.error_rate,
        max_error_rate=result.max_error_rate,
        p50_latency_s=measured.p50_latency_s,
        p95_latency_s=measured.p95_latency_s,
        latency_dispersion=dispersion,
        dispersion_limit=limit,
        probe_s=measured.probe_s,
        passed=not problems,
        problems=problems,
        machine_speed=speed,
    )


def _settings(
    study: Study,
    points: list[CurvePoint],
    parallelism: int,
    predicted: float,
    metric: str,
    rollouts: int,
) -> ProbeSettings:
    """A window of at least `rollouts` rollouts at the predicted rate (the probe's window
    ends at its last whole batch, so it may run to twice that)."""
    rate = predicted
    if metric != "rollouts_per_s" and points:  # tokens/s → rollouts/s at the nearest point
        near = min(points, key=lambda p: abs(p.parallelism - parallelism))
        rate = predicted * near.rollouts_per_s / max(near.metric(metric), 1e-12)
    window = max(study.probe.min_s, rollouts / max(rate, 1e-9))
    return replace(ProbeSettings.of(study.probe, parallelism), min_s=window, max_s=2 * window)


def _dispersion(point: CurvePoint) -> float | None:
    if point.p95_latency_s is None or not point.p50_latency_s:
        return None
    return point.p95_latency_s / point.p50_latency_s


def _dispersion_limit(points: list[CurvePoint]) -> float | None:
    """DISPERSION_GROWTH × the worst p95 ÷ p50 among the sweep's points (None: unknown)."""
    seen = [d for d in map(_dispersion, points) if d is not None]
    return DISPERSION_GROWTH * max(seen) if seen else None


def _not_started(
    result: SweepResult,
    best: TrialRecord,
    parallelism: int,
    rollouts: int,
    predict: Callable[[int], Prediction],
    reason: str,
) -> Validation:
    predicted, interval = predict(parallelism)
    return Validation(
        trial=best.number,
        knobs=best.knobs,
        parallelism=parallelism,
        rollouts=rollouts,
        completed=0,
        throughput=0.0,
        throughput_ci=None,
        predicted_throughput=predicted,
        predicted_interval=interval,
        error_rate=1.0,
        max_error_rate=result.max_error_rate,
        p50_latency_s=None,
        p95_latency_s=None,
        latency_dispersion=None,
        dispersion_limit=None,
        probe_s=0.0,
        passed=False,
        problems=[f"{SERVER_GONE} did not start ({reason})"],
    )
