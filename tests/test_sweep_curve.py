"""The curve algorithm (sweep/curve.py) on its own: a fake probe whose throughput follows
a known Universal Scalability Law curve, and fake launchers, so every stopping rule is
checked against numbers worked out by hand. No server, no Optuna."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from autotune.config import Study
from autotune.errors import ServerStartupError
from autotune.results import ProbeResult
from autotune.sweep.curve import measure_curve, run_trial, start_parallelism


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
    asked: list[int] = field(default_factory=list)

    async def measure(self, parallelism: int) -> ProbeResult:
        self.asked.append(parallelism)
        rate = self.throughput(parallelism)
        return ProbeResult(
            parallelism=parallelism,
            rollouts_per_s=rate,
            rollouts_per_s_ci=(rate * 0.99, rate * 1.01),
            output_tokens_per_s=self.tokens(parallelism) if self.tokens else rate * 100,
            error_rate=self.error_rate(parallelism),
            completed=100,
            failed=0,
            measured_s=3.0,
            warmup_s=1.0,
            stop_reason=self.stop_reason(parallelism),
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


async def test_doubling_stops_at_the_first_point_without_a_plateau_gain() -> None:
    probe = FakeProbe()
    points, died = await measure_curve(probe, study(), 4)
    assert ladder(points) == probe.asked == [4, 8, 16, 32, 64]
    assert died is None
    *rising, last = points
    for before, after in itertools.pairwise(rising):
        assert after.rollouts_per_s >= before.rollouts_per_s * 1.05
    assert last.rollouts_per_s < rising[-1].rollouts_per_s * 1.05
    assert points[-1].rollouts_per_s == pytest.approx(usl(64))


async def test_doubling_never_passes_the_top_of_the_range() -> None:
    probe = FakeProbe(throughput=lambda n: 2.0 * n)  # scales for ever
    points, _ = await measure_curve(probe, study(high=40), 4)
    assert ladder(points) == [4, 8, 16, 32]


async def test_the_output_token_metric_decides_the_plateau_when_it_is_the_objective() -> None:
    # Rollouts/s keep doubling, but rollouts get shorter: tokens/s levels off at 16.
    probe = FakeProbe(throughput=float, tokens=lambda n: 100.0 * min(n, 16))
    points, _ = await measure_curve(probe, study(metric="output_tokens_per_s"), 4)
    assert ladder(points) == [4, 8, 16, 32]
    points, _ = await measure_curve(FakeProbe(throughput=float), study(high=64), 4)
    assert ladder(points) == [4, 8, 16, 32, 64]  # by rollouts/s it never levels off


async def test_doubling_stops_at_the_first_point_with_too_many_errors() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.5 if n >= 16 else 0.0)
    points, died = await measure_curve(probe, study(), 4)
    assert ladder(points) == [4, 8, 16]  # 32 is never asked for
    assert died is None
    assert points[-1].error_rate == 0.5


async def test_an_error_rate_at_the_limit_is_still_usable() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.05)
    points, _ = await measure_curve(probe, study(max_error_rate=0.05), 4)
    assert ladder(points) == [4, 8, 16, 32, 64]


async def test_errors_at_the_start_make_it_halve_below_start_for_two_usable_points() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.5 if n >= 32 else 0.0)
    points, died = await measure_curve(probe, study(), 32)
    assert probe.asked == [32, 16, 8]
    assert ladder(points) == [8, 16, 32]  # lowest parallelism first
    assert died is None


async def test_one_usable_point_after_doubling_halves_once() -> None:
    probe = FakeProbe(error_rate=lambda n: 0.5 if n >= 64 else 0.0)
    points, _ = await measure_curve(probe, study(), 32)
    assert probe.asked == [32, 64, 16]
    assert ladder(points) == [16, 32, 64]


async def test_halving_stops_at_the_bottom_of_the_range() -> None:
    probe = FakeProbe(error_rate=lambda n: 1.0)
    points, died = await measure_curve(probe, study(low=4), 16)
    assert probe.asked == [16, 8, 4]
    assert ladder(points) == [4, 8, 16]
    assert died is None


async def test_no_halving_when_two_points_are_usable() -> None:
    probe = FakeProbe()
    points, _ = await measure_curve(probe, study(), 256)  # past the peak: 512 is lower
    assert ladder(points) == probe.asked == [256, 512]


async def test_a_server_that_dies_ends_the_curve_with_the_reason() -> None:
    probe = FakeProbe(stop_reason=lambda n: "server died" if n == 16 else "converged")
    points, died = await measure_curve(probe, study(), 4)
    assert ladder(points) == [4, 8, 16]
    assert died == "the server stopped answering at parallelism 16"


async def test_a_server_that_dies_while_halving_ends_the_curve_too() -> None:
    probe = FakeProbe(
        error_rate=lambda n: 1.0 if n >= 32 else 0.0,
        stop_reason=lambda n: "server died" if n == 16 else "converged",
    )
    points, died = await measure_curve(probe, study(), 32)
    assert probe.asked == [32, 16]
    assert ladder(points) == [16, 32]
    assert died == "the server stopped answering at parallelism 16"


@pytest.mark.parametrize(
    ("best_peak", "expected"),
    [
        (None, 4),  # no trial yet: the bottom of the range
        (0.0, 4),
        (10.0, 4),  # a quarter (2.5) is below the bottom
        (64.0, 16),  # a quarter is exactly 16, on the ladder
        (100.0, 16),  # a quarter is 25: the ladder's 16, never above a quarter
        (1000.0, 128),  # a quarter is 250: 4, 8, ... 128
    ],
)
def test_start_is_the_ladder_step_at_or_below_a_quarter_of_the_best_peak(
    best_peak: float | None, expected: int
) -> None:
    assert start_parallelism(study(low=4, high=1024), best_peak) == expected


def test_start_stays_inside_the_range() -> None:
    assert start_parallelism(study(low=4, high=16), 1e6) == 16
    assert start_parallelism(study(low=3, high=1024), 100.0) == 24  # 3, 6, 12, 24 ≤ 25


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
