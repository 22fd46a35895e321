"""The curve algorithm (sweep/curve.py) on its own: a fake probe whose throughput follows
a known Universal Scalability Law curve, and fake launchers, so every stopping rule is
checked against numbers worked out by hand. No server, no Optuna."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from autotune.config.study import Study
from autotune.errors import ServerStartupError
from autotune.probe import ProbeSettings
from autotune.results.probes import CurvePoint, ProbeResult
from autotune.results.stages import StageLatency, no_latencies
from autotune.sweep.curve import (
    PEAK_LATENCIES,
    QUEUE_GAIN,
    SCREEN_LATENCIES,
    Incumbent,
    level_at,
    measure_curve,
    reachable,
    run_trial,
    start_parallelism,
)


def usl(n: int, lam: float = 1.0, sigma: float = 0.02, kappa: float = 0.0005) -> float:
    """Throughput at parallelism n; with these defaults it peaks near n = 44:
    4 → 3.77, 8 → 7.05, 16 → 12.03, 32 → 15.12, 64 → 14.97 (no 5% gain over 32)."""
    return lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1))


@dataclass
class FakeProbe:
    """Answers each parallelism from `throughput`, `error_rate` and `stop_reason`."""

    throughput: Callable[[int], float] = usl
    error_rate: Callable[[int], float] = lambda n: 0.0
    stop_reason: Callable[[int], str] = lambda n: "converged"
    tokens: Callable[[int], float] | None = None  # output tokens/s; default 100 a rollout
    p95: Callable[[int], float] | None = None  # p95 rollout latency, s; default none kept
    halfwidth: float = 0.01  # of the rate's 95% interval (ten batches: trusted), a share
    asked: list[int] = field(default_factory=list)
    timed: list[ProbeSettings | None] = field(default_factory=list)  # settings asked with

    async def measure(self, parallelism: int, settings: ProbeSettings | None = None) -> ProbeResult:
        self.asked.append(parallelism)
        self.timed.append(settings)
        rate = self.throughput(parallelism)
        latency = no_latencies()
        if self.p95 is not None:
            p95 = self.p95(parallelism)
            latency["total"] = StageLatency(100, p95 / 1.5, p95 / 1.5, p95, 1.5 * p95)
        half = self.halfwidth
        return ProbeResult(
            parallelism=parallelism,
            rollouts_per_s=rate,
            rollouts_per_s_ci=(rate * (1 - half), rate * (1 + half)),
            output_tokens_per_s=self.tokens(parallelism) if self.tokens else rate * 100,
            error_rate=self.error_rate(parallelism),
            completed=100,
            failed=0,
            measured_s=3.0,
            warmup_s=1.0,
            stop_reason=self.stop_reason(parallelism),
            latency_s=latency,
        )


@dataclass
class FakeLauncher:
    """Hands out `probe`, or refuses every configuration with `refusal` as the reason."""

    probe: FakeProbe = field(default_factory=FakeProbe)
    refusal: str | None = None
    started: list[dict[str, Any]] = field(default_factory=list)

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[FakeProbe]:
        if self.refusal is not None:
            raise ServerStartupError(f"the server exited ({self.refusal})", reason=self.refusal)
        self.started.append(dict(knobs))
        yield self.probe


def study(low: int = 4, high: int = 1024, max_error_rate: float = 0.05, **objective: Any) -> Study:
    return Study.model_validate(
        {
            "name": "curve",
            "target": {"kind": "sim"},
            "search_space": {"parallelism": {"low": low, "high": high, "plateau_gain": 0.05}},
            "objective": {"max_error_rate": max_error_rate, **objective},
        }
    )


def ladder(points: list[Any]) -> list[int]:
    return [p.parallelism for p in points]


async def curve(probe: FakeProbe, study: Study, start: int) -> tuple[list[CurvePoint], str | None]:
    """The ladder's points and why the server died (None: it did not)."""
    measured = await measure_curve(probe, study, start)
    return measured.points, measured.died


async def test_doubling_stops_at_the_first_point_without_a_plateau_gain() -> None:
    probe = FakeProbe()
    points, died = await curve(probe, study(), 4)
    assert ladder(points) == probe.asked == [4, 8, 16, 32, 64]
    assert died is None
    *rising, last = points
    for before, after in itertools.pairwise(rising):
        assert after.rollouts_per_s >= before.rollouts_per_s * 1.05
    assert last.rollouts_per_s < rising[-1].rollouts_per_s * 1.05
    assert points[-1].rollouts_per_s == pytest.approx(usl(64))


async def test_doubling_never_passes_the_top_of_the_range() -> None:
    probe = FakeProbe(throughput=lambda n: 2.0 * n)  # scales for ever
    points, _ = await curve(probe, study(high=40), 4)
    assert ladder(points) == [4, 8, 16, 32]


async def test_the_output_token_metric_decides_the_plateau_when_it_is_the_objective() -> None:
    # Rollouts/s keep doubling, but rollouts get shorter: tokens/s levels off at 16.
    probe = FakeProbe(throughput=float, tokens=lambda n: 100.0 * min(n, 16))
    points, _ = await curve(probe, study(metric="output_tokens_per_s"), 4)
    assert ladder(points) == [4, 8, 16, 32]
    points, _ = await curve(FakeProbe(throughput=float), study(high=64), 4)
    assert ladder(points) == [4, 8, 16, 32, 64]  # by rollouts/s it never levels off


async def test_doubling_stops_at_the_first_point_with_too_many_errors() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.5 if n >= 16 else 0.0)
    points, died = await curve(probe, study(), 4)
    assert ladder(points) == [4, 8, 16]  # 32 is never asked for
    assert died is None
    assert points[-1].error_rate == 0.5


async def test_an_error_rate_at_the_limit_is_still_usable() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.05)
    points, _ = await curve(probe, study(max_error_rate=0.05), 4)
    assert ladder(points) == [4, 8, 16, 32, 64]


async def test_errors_at_the_start_make_it_halve_below_start_for_two_usable_points() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.5 if n >= 32 else 0.0)
    points, died = await curve(probe, study(), 32)
    assert probe.asked == [32, 16, 8]
    assert ladder(points) == [8, 16, 32]  # lowest parallelism first
    assert died is None


async def test_one_usable_point_after_doubling_halves_once() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.5 if n >= 64 else 0.0)
    points, _ = await curve(probe, study(), 32)
    assert probe.asked == [32, 64, 16]
    assert ladder(points) == [16, 32, 64]


async def test_halving_stops_at_the_bottom_of_the_range() -> None:
    probe = FakeProbe(error_rate=lambda n: 1.0)
    points, died = await curve(probe, study(low=4), 16)
    assert probe.asked == [16, 8, 4]
    assert ladder(points) == [4, 8, 16]
    assert died is None


async def test_rungs_that_all_miss_the_slo_make_it_halve_until_one_meets_it() -> None:
    """A recommendation under an SLO is read off points that meet it: one from points
    that all miss it would be extrapolated below the curve."""
    probe = FakeProbe(p95=lambda n: 2.0 * n)  # 2 s a unit of parallelism
    points, _ = await curve(probe, study(p95_latency_slo_s=20.0), 32)
    # 16 (32 s) misses the SLO too; 8 (16 s) meets it; then the boundary, 97% of 20 s.
    assert probe.asked == [32, 64, 16, 8, 9]
    assert ladder(points) == [8, 9, 16, 32, 64]
    points, _ = await curve(FakeProbe(p95=lambda n: 2.0 * n), study(), 32)
    assert ladder(points) == [16, 32, 64]  # without an SLO: only for the 80% rule's sake
    probe = FakeProbe(p95=lambda n: 2.0 * n)  # p99 = 3 s a unit
    points, _ = await curve(probe, study(p99_latency_slo_s=30.0), 32)
    assert probe.asked == [32, 64, 16, 8, 9] and points[0].p99_latency_s == 24.0


async def test_an_slo_crossed_between_rungs_gets_a_rung_at_its_boundary() -> None:
    """p95 = 0.5 s a unit: 32 (16 s) meets a 30 s SLO, 64 (32 s) misses it. The latency
    reaches 97% of it at 58: a rung there reads the value at the SLO, not at 32."""
    probe = FakeProbe(throughput=float, p95=lambda n: 0.5 * n)
    points, _ = await curve(probe, study(high=64, p95_latency_slo_s=30.0), 16)
    assert probe.asked == [16, 32, 64, 58]
    assert ladder(points) == [16, 32, 58, 64]
    near = FakeProbe(throughput=float, p95=lambda n: 0.5 * n)  # 31 s at 62: barely past
    await curve(near, study(high=64, p95_latency_slo_s=31.5), 16)
    assert near.asked == [16, 32, 64, 61]
    close = FakeProbe(throughput=float, p95=lambda n: 0.5 * n)  # the boundary is at 32
    await curve(close, study(high=64, p95_latency_slo_s=16.6), 16)
    assert close.asked == [16, 32, 64]  # 32 is within 10% of it: no rung worth adding


async def test_no_halving_when_two_points_are_usable_and_cover_the_recommendation() -> None:
    probe = FakeProbe(throughput=lambda n: min(n, 12.0))  # level from 12 on
    points, _ = await curve(probe, study(), 8)
    assert ladder(points) == probe.asked == [8, 16, 32]  # 80% of 16 is 12: measured over


async def test_a_curve_level_from_its_first_rung_halves_under_80_percent_of_its_peak() -> None:
    """A start at or past the plateau puts 80% of the peak's parallelism under every rung:
    read there, the recommendation would be the fit extrapolated below the curve, and a
    validation run that fell short could not step down onto a measured point."""
    probe = FakeProbe(throughput=lambda n: min(n, 6.0))
    points, _ = await curve(probe, study(low=2), 8)
    assert probe.asked == [8, 16, 4]  # best at 8, 80% of it 6: under 8, over 4
    assert ladder(points) == [4, 8, 16]
    launcher = FakeLauncher()  # USL, its peak near 44: 256 and 512 are both past it
    fitted = (await run_trial(launcher, {}, study(), 256)).curve
    assert launcher.probe.asked == [256, 512, 128, 64, 32]
    assert fitted is not None and fitted.recommended_parallelism >= 32
    unwanted = FakeProbe(throughput=lambda n: min(n, 6.0))
    await measure_curve(unwanted, study(low=2), 8, wanted=lambda points: False)
    assert unwanted.asked == [8, 16]  # a trial that is not the best needs no fit


async def test_a_server_that_dies_ends_the_curve_with_the_reason() -> None:
    probe = FakeProbe(stop_reason=lambda n: "server died" if n == 16 else "converged")
    points, died = await curve(probe, study(), 4)
    assert ladder(points) == [4, 8, 16]
    assert died == "the server stopped answering at parallelism 16"


async def test_a_server_that_dies_while_halving_ends_the_curve_too() -> None:
    probe = FakeProbe(
        error_rate=lambda n: 1.0 if n >= 32 else 0.0,
        stop_reason=lambda n: "server died" if n == 16 else "converged",
    )
    points, died = await curve(probe, study(), 32)
    assert probe.asked == [32, 16]
    assert ladder(points) == [16, 32]
    assert died == "the server stopped answering at parallelism 16"


@pytest.mark.parametrize(
    ("best_peak", "expected"),
    [
        (None, 4),  # no trial yet: the bottom of the range
        (0.0, 4),
        (24.0, 4),  # an eighth (3) is below the bottom
        (128.0, 16),  # an eighth is exactly 16, on the ladder
        (200.0, 16),  # an eighth is 25: the ladder's 16, never above an eighth
        (2000.0, 128),  # an eighth is 250: 4, 8, ... 128
    ],
)
def test_start_is_the_ladder_step_at_or_below_an_eighth_of_the_best_parallelism(
    best_peak: float | None, expected: int
) -> None:
    assert start_parallelism(study(low=4, high=1024), best_peak) == expected


def test_start_stays_inside_the_range_and_under_the_servers_ceiling() -> None:
    assert start_parallelism(study(low=4, high=16), 1e6) == 16
    assert start_parallelism(study(low=3, high=1024), 200.0) == 24  # 3, 6, 12, 24 ≤ 25
    assert start_parallelism(study(low=4, high=1024), 1000.0, top=64) == 64


async def test_a_refused_configuration_is_an_infeasible_outcome_with_the_servers_reason() -> None:
    reason = "ValueError: No available memory for the cache blocks"
    launcher = FakeLauncher(refusal=reason)
    outcome = await run_trial(launcher, {"max_num_seqs": 64}, study(), 4)
    assert outcome.infeasible_reason == reason
    assert outcome.knobs == {"max_num_seqs": 64}
    assert outcome.points == [] and outcome.curve is None
    assert outcome.value == 0.0 and outcome.error_rate == 1.0 and outcome.probe_s == 0.0
    assert outcome.p95_latency_s is None
    assert launcher.probe.asked == []


async def test_a_measured_trial_is_feasible_with_its_best_point_and_fitted_curve() -> None:
    launcher = FakeLauncher()
    outcome = await run_trial(launcher, {"max_num_seqs": 64}, study(), 4)
    assert launcher.started == [{"max_num_seqs": 64}]
    assert outcome.infeasible_reason is None
    assert ladder(outcome.points) == [4, 8, 16, 32, 64]
    assert outcome.value == pytest.approx(usl(32))  # the best measured point
    assert outcome.error_rate == 0.0
    assert outcome.probe_s == pytest.approx(5 * 4.0)  # warm-up + measured, each probe
    assert outcome.curve is not None
    assert outcome.curve.best_measured_parallelism == 32
    assert 32 <= outcome.curve.peak_parallelism <= 64  # the fit puts it near 44


async def test_a_trial_whose_every_probe_fails_is_infeasible() -> None:
    launcher = FakeLauncher(FakeProbe(error_rate=lambda n: 0.5))
    outcome = await run_trial(launcher, {}, study(), 4)
    assert outcome.infeasible_reason == "every probe failed more than 5% of rollouts"
    assert outcome.curve is None and outcome.value == 0.0
    assert ladder(outcome.points) == [4]  # errors at low: nothing below it to try


async def test_a_trial_whose_server_dies_is_feasible_on_the_points_before() -> None:
    launcher = FakeLauncher(
        FakeProbe(stop_reason=lambda n: "server died" if n == 16 else "converged")
    )
    outcome = await run_trial(launcher, {}, study(), 4)
    assert ladder(outcome.points) == [4, 8, 16]
    assert outcome.infeasible_reason is None
    assert outcome.value == pytest.approx(usl(16))


# -- pruning: what a curve can still reach -------------------------------------------------


def point(n: int, rate: float, interval: tuple[float, float] | None = None) -> CurvePoint:
    """A rung; one with an interval measured it over ten batches."""
    batches = 10 if interval else None
    return CurvePoint(
        n, rate, 100 * rate, 0.0, None, 4.0, "time cap", rollouts_per_s_ci=interval, batches=batches
    )


def test_one_rung_bounds_the_curve_by_linear_scaling_to_the_top_of_the_range() -> None:
    # X(N)/N never grows: 10/s at 16 is at most 10·64/16 = 40/s at the range's top, 64.
    assert reachable([point(16, 10.0, (9.0, 11.0))], study(high=64)) == pytest.approx(44.0)


def test_two_rungs_bound_it_by_the_secant_of_n_over_x() -> None:
    # N/X: 16/10 = 1.6 and 32/16 = 2.0, a slope of 0.025 a unit: at 1024, 1024/25.6 = 40.
    rungs = [point(16, 10.0, (10.0, 10.0)), point(32, 16.0, (16.0, 16.0))]
    assert reachable(rungs, study()) == pytest.approx(1024 / (2.0 + 0.025 * (1024 - 32)))
    true = [usl(n) for n in (16, 32, 64, 128, 256, 512, 1024)]
    exact = [point(n, usl(n), (usl(n), usl(n))) for n in (16, 32)]
    assert reachable(exact, study()) >= max(true)  # a bound, for a curve that obeys the USL


def test_at_the_servers_ceiling_only_queueing_is_left() -> None:
    rungs = [point(32, 20.0, (19.0, 21.0)), point(64, 30.0, (29.0, 31.0))]
    assert reachable(rungs, study(), top=64) == pytest.approx(31.0 * (1 + QUEUE_GAIN))


def test_a_rung_without_a_trustworthy_interval_counts_as_known_to_five_percent() -> None:
    expected = 30.0 * 1.05 * (1 + QUEUE_GAIN)
    assert reachable([point(64, 30.0)], study(), top=64) == pytest.approx(expected)
    wide = (10.0, 50.0)
    two_batches = CurvePoint(64, 30.0, 3000.0, 0.0, None, 4.0, "time cap", rollouts_per_s_ci=wide)
    two_batches = replace(two_batches, batches=2)
    assert reachable([two_batches], study(), top=64) == pytest.approx(expected)


async def test_a_curve_that_cannot_reach_the_best_is_pruned_at_its_first_rung() -> None:
    launcher = FakeLauncher()
    rungs: list[tuple[int, float]] = []
    best = Incumbent(value=100.0, parallelism=64, points=[])
    outcome = await run_trial(
        launcher, {}, study(), 32, best=best, top=64, on_rung=lambda *r: rungs.append(r)
    )
    # usl(32) ≈ 15.1: even linear scaling to the ceiling (64) gives ~32, far from 100.
    assert ladder(outcome.points) == [32]  # no second rung, no halving below
    assert outcome.pruned_reason is not None
    assert "below the best so far (100)" in outcome.pruned_reason
    assert rungs == [(0, pytest.approx(usl(32)))]
    assert outcome.infeasible_reason is None and outcome.probe_s == pytest.approx(4.0)


async def test_a_curve_that_may_beat_the_best_is_measured_to_its_top() -> None:
    launcher = FakeLauncher()
    best = Incumbent(value=14.0, parallelism=64, points=[])
    outcome = await run_trial(launcher, {}, study(), 4, best=best)
    assert outcome.pruned_reason is None
    assert ladder(outcome.points) == [4, 8, 16, 32, 64]


async def test_rungs_are_timed_by_their_rollout_latency_and_the_top_is_measured_longer() -> None:
    probe = FakeProbe(throughput=lambda n: 0.5 * min(n, 64))  # saturates at 64 requests
    await run_trial(FakeLauncher(probe), {}, study(), 16, top=64)
    first, second, top = probe.timed
    assert first is not None and first.max_s == study().probe.max_s  # no latency to go on
    # Little's law: 32 requests at the 8/s of one rung (no growth seen yet) take 4 s;
    # 64 at the 16/s of 32 doubled again (the last step doubled) take 2 s.
    assert second is not None and second.max_s == pytest.approx(SCREEN_LATENCIES * 4.0)
    assert top is not None and top.max_s == pytest.approx(PEAK_LATENCIES * 2.0)
    assert probe.asked == [16, 32, 64]


def rung(n: int, rate: float, half: float | None) -> CurvePoint:
    """A rung measuring `rate` rollouts/s, ± `half` of it (95%; None: no interval)."""
    ci = (rate * (1 - half), rate * (1 + half)) if half is not None else None
    return CurvePoint(n, rate, 100 * rate, 0.0, None, 5.0, "converged", rollouts_per_s_ci=ci)


def test_a_curve_is_level_at_the_ceiling_unless_its_rung_there_is_clearly_below_the_best() -> None:
    """The ceiling rule (knee.landmarks) holds where the curve reached the server's
    ceiling without falling: a rung there a little under the best by noise is level, one
    whose interval lies wholly under the best's is a curve that turned down."""
    rising = [rung(32, 0.8, 0.1), rung(64, 1.0, 0.1), rung(128, 1.6, 0.07)]
    assert level_at(rising, 128, "rollouts_per_s")
    noisy = [rung(64, 1.0, 0.1), rung(125, 1.67, 0.11), rung(128, 1.48, 0.07)]  # seen in a bench
    assert level_at(noisy, 128, "rollouts_per_s")
    falling = [rung(64, 1.0, 0.02), rung(96, 1.6, 0.03), rung(128, 1.3, 0.03)]
    assert not level_at(falling, 128, "rollouts_per_s")
    assert not level_at(rising[:2], 128, "rollouts_per_s")  # the ceiling was not reached
    # Without intervals, within 5% of the best.
    assert level_at([rung(64, 1.0, None), rung(128, 0.96, None)], 128, "rollouts_per_s")
    assert not level_at([rung(64, 1.0, None), rung(128, 0.9, None)], 128, "rollouts_per_s")


async def test_a_rung_that_gained_little_only_by_its_noise_does_not_end_the_curve() -> None:
    """A plateau is a doubling that gained under plateau_gain (5%) even at the top of its
    rung's interval: a short rung read 20% low must not stop a curve still rising."""
    measured = {4: 4.0, 8: 8.0, 16: 16.0, 32: 16.3, 64: 64.0, 128: 64.5}  # 32 read low
    noisy = FakeProbe(throughput=measured.__getitem__, halfwidth=0.2)
    points, _ = await curve(noisy, study(high=128), 4)
    assert ladder(points) == [4, 8, 16, 32, 64, 128]
    precise = FakeProbe(throughput=measured.__getitem__, halfwidth=0.01)
    points, _ = await curve(precise, study(high=128), 4)
    assert ladder(points) == [4, 8, 16, 32]  # 1.9% gained, at most 3.9%: a plateau


def test_after_a_curve_level_at_its_ceiling_a_configuration_starts_at_its_own() -> None:
    assert start_parallelism(study(), 256.0, top=128, best_level=True) == 128
    assert start_parallelism(study(), 256.0, top=128) == 32  # an eighth of the best
    assert start_parallelism(study(high=64), 256.0, top=128, best_level=True) == 32
    assert start_parallelism(study(), None, top=128, best_level=True) == 32  # first: ÷ 4


async def test_from_its_ceiling_a_loser_takes_one_rung_and_a_new_best_halves_down() -> None:
    """After a best curve that rose level to its ceiling, a configuration is measured
    first where it can do the most, at its own ceiling: below the best there, it is
    pruned on that one rung; above it, it halves down to a quarter of it (the span of
    the first ladder, for its fit) and its best rung is measured again at length."""
    level_best = Incumbent(value=40.0, parallelism=128, points=[], level=True)
    loser = FakeProbe(throughput=lambda n: 0.5 * min(n, 64))  # 32/s at its ceiling, 64
    start = start_parallelism(study(), 128.0, top=64, best_level=True)
    outcome = await run_trial(FakeLauncher(loser), {}, study(), start, best=level_best, top=64)
    assert loser.asked == [64] and outcome.pruned_reason is not None
    winner = FakeProbe(throughput=lambda n: 0.5 * min(n, 256))  # 128/s at 256
    start = start_parallelism(study(), 128.0, top=256, best_level=True)
    outcome = await run_trial(FakeLauncher(winner), {}, study(), start, best=level_best, top=256)
    assert winner.asked == [256, 128, 64, 256] and outcome.pruned_reason is None
    assert ladder(outcome.points) == [64, 128, 256]
    assert outcome.value == pytest.approx(128.0)
    # Below the last rung its latency (256 ÷ 128/s = 2 s) caps the window, not Little's
    # law at the lower rate (1 s): a batching server's latency hardly shrinks. The probe
    # counts the 2.5 latencies in those it measures.
    below = winner.timed[1]
    assert below is not None and below.max_s == pytest.approx(SCREEN_LATENCIES * 2.0)
    assert below.window_latencies == SCREEN_LATENCIES
