"""The sweep's recommendation on the simulator, in virtual time (probe.virtual): its
interval covers the true peak, a latency SLO binds it, and a validation run that fails
steps it down. Every study runs through `run_sweep`, as `autotune sweep` does."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from autotune.config.study import Study, load_study
from autotune.probe import ProbeSettings
from autotune.probe.virtual import VirtualProbe, VirtualSimLauncher
from autotune.results.probes import ProbeResult
from autotune.results.trials import CEILING_RULE, HEADROOM_RULE, Recommendation, SweepResult
from autotune.sweep.recommend import recommendation
from autotune.sweep.sweep_job import run_sweep, write_outputs
from tests.helpers import REPO

ARGS = ["--gpu", "h100-80gb", "--model", "llama-3.1-8b", "--max-num-seqs", "128"]
PROMPT, OUTPUT = (256, 64), (128, 32)


def study(seed: int = 0, validate_rollouts: int = 400, **objective: Any) -> Study:
    return Study.model_validate(
        {
            "name": "virtual",
            "target": {"kind": "sim", "args": ARGS},
            "search_space": {"parallelism": {"low": 4, "high": 1024}},
            "objective": objective,
            "budget": {"trials": 1, "validate_rollouts": validate_rollouts},
            "seed": seed,
        }
    )


async def sweep(
    tmp_path: Path, spec: Study, launcher: Any = None
) -> tuple[SweepResult, Recommendation]:
    launcher = launcher or VirtualSimLauncher(ARGS, ProbeSettings(1), PROMPT, OUTPUT, spec.seed)
    storage = f"sqlite:///{tmp_path / f'{spec.name}-{spec.seed}.db'}"
    result = await run_sweep(spec, storage=storage, launcher=launcher)
    found = recommendation(result)
    assert found is not None
    return result, found


async def true_peak() -> float:
    """The noiseless curve's peak: long, precise probes over a fine ladder (a quarter of
    a doubling apart) up to twice the server's ceiling, where throughput has levelled."""
    precise = ProbeSettings(1, min_s=60.0, max_s=2000.0, target_halfwidth=0.005)
    launcher = VirtualSimLauncher(ARGS, precise, PROMPT, OUTPUT, seed=1000)
    ladder = sorted({round(16 * 2 ** (k / 4)) for k in range(0, 17)})
    async with launcher.running({}) as probe:
        return max([(await probe.measure(n)).rollouts_per_s for n in ladder])


@pytest.mark.measures
async def test_the_peak_interval_covers_the_true_peak_in_nine_of_ten_runs(tmp_path: Path) -> None:
    peak = await true_peak()
    covered = []
    for seed in range(10):
        _, found = await sweep(tmp_path, study(seed))
        interval = found.peak.throughput_interval
        assert interval is not None
        covered.append(interval[0] <= peak <= interval[1])
        # An interval is a statement about the peak, not a blanket: it stays narrow.
        assert interval[1] / interval[0] < 1.5, interval
    assert sum(covered) >= 9, (peak, covered)


async def test_a_tighter_p95_slo_lowers_the_parallelism_and_is_named_as_the_rule(
    tmp_path: Path,
) -> None:
    free_result, free = await sweep(tmp_path, study())
    assert free.recommended.bound_by in (HEADROOM_RULE, CEILING_RULE)
    unbound = free.recommended.p95_latency_s
    assert unbound is not None
    lowest = min(p.p95_latency_s for p in free_result.trials[0].points if p.p95_latency_s)
    slo = round((lowest + unbound) / 2, 3)  # between the lowest rung's and the free plan's
    spec = study(p95_latency_slo_s=slo).model_copy(update={"name": "slo"})
    result, found = await sweep(tmp_path, spec)
    assert found.recommended.parallelism < free.recommended.parallelism
    assert found.recommended.bound_by == "p95 latency SLO"
    assert found.recommended.p95_latency_s is not None and found.recommended.p95_latency_s < slo
    assert found.validated is True and found.validations[-1].p95_latency_s is not None
    assert found.validations[-1].p95_latency_s <= slo
    write_outputs(result, tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "the largest parallelism within the p95 latency SLO" in page
    assert re.search(rf"p95 rollout latency stays \d+% within {slo:g} s \(what the", page)


async def test_the_demo_study_recommends_80_percent_of_a_peak_inside_its_range(
    tmp_path: Path,
) -> None:
    """`make demo`'s study (studies/demo.yaml, its fixed seed), in virtual time: the best
    curve runs level to its server's ceiling, so the peak is there, inside the searched
    range; the recommendation is 80% of it, and the ceiling stands beside it with what
    running full would gain, in recommendation.json and the report."""
    spec = load_study(REPO / "studies" / "demo.yaml")
    synthetic = spec.workload.synthetic
    launcher = VirtualSimLauncher(
        spec.target.args,
        ProbeSettings.of(spec.probe, 1),
        synthetic.prompt_tokens,
        synthetic.output_tokens,
        spec.seed,
    )
    result, found = await sweep(tmp_path, spec, launcher)
    peak, rec, instead = found.peak, found.recommended, found.alternative
    space = spec.search_space.parallelism
    assert peak.inside_searched_range and space.low < peak.parallelism < space.high
    assert rec.bound_by == HEADROOM_RULE and rec.parallelism == int(0.8 * peak.parallelism)
    assert space.low < found.knee_parallelism <= peak.parallelism
    assert instead is not None and instead.bound_by == CEILING_RULE
    assert instead.parallelism == found.server["max_num_seqs"] == peak.parallelism
    assert instead.predicted_throughput > rec.predicted_throughput
    write_outputs(result, tmp_path / "report")
    saved = json.loads((tmp_path / "report" / "recommendation.json").read_text())
    assert saved["alternative"]["predicted_throughput"] == instead.predicted_throughput
    page = (tmp_path / "report" / "index.html").read_text()
    assert f"parallelism {instead.parallelism}, the server&#x27;s ceiling" in page


@dataclasses.dataclass
class FailsUnderSustainedLoad:
    """A planted server: above `above` requests in flight it holds for `holds` rollouts
    of a run (longer than any probe of the sweep), then fails half of them."""

    inner: VirtualProbe
    above: int
    holds: int

    async def measure(self, parallelism: int, settings: ProbeSettings | None = None) -> ProbeResult:
        result = await self.inner.measure(parallelism, settings)
        if parallelism <= self.above or result.completed <= self.holds:
            return result
        return dataclasses.replace(result, error_rate=0.5, failed=result.completed)


@dataclasses.dataclass
class PlantedLauncher:
    inner: VirtualSimLauncher
    above: int = 0
    holds: int = 0

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[FailsUnderSustainedLoad]:
        async with self.inner.running(knobs) as probe:
            yield FailsUnderSustainedLoad(probe, self.above, self.holds)


async def test_a_validation_that_fails_above_the_predicted_point_steps_down(
    tmp_path: Path,
) -> None:
    spec = study(validate_rollouts=2000)
    _, healthy = await sweep(tmp_path, spec.model_copy(update={"name": "healthy"}))
    assert healthy.validated is True and len(healthy.validations) == 1
    predicted = healthy.recommended.parallelism
    planted = PlantedLauncher(
        VirtualSimLauncher(ARGS, ProbeSettings(1), PROMPT, OUTPUT, spec.seed),
        above=predicted - 1,
        holds=1200,
    )
    result, found = await sweep(tmp_path, spec.model_copy(update={"name": "planted"}), planted)
    assert all(p.error_rate == 0 for p in result.trials[0].points)  # the sweep saw nothing
    first, last = found.validations[0], found.validations[-1]
    assert first.parallelism == predicted and not first.passed
    assert "error rate 50.0% above the 5% allowed" in first.problems
    assert last.passed and last.parallelism < predicted
    assert found.validated is True
    assert found.recommended.parallelism == last.parallelism
    assert found.recommended.bound_by == "validation"
    assert found.snippets.nemo_gym == f"+num_samples_in_parallel={last.parallelism}"
    write_outputs(result, tmp_path / "planted")
    saved = json.loads((tmp_path / "planted" / "recommendation.json").read_text())
    assert saved["validated"] is True
    assert [v["parallelism"] for v in saved["validations"]] == [predicted, last.parallelism]
    assert saved["validations"][0]["passed"] is False


@dataclasses.dataclass
class SlowerMachineLauncher:
    """A planted busier machine: every launch after the first `normal` ones (the sweep's
    trials) measures everything at `speed` times the rate and latencies ÷ `speed`; with
    `only_above`, only parallelisms above it are slowed (a server, not a machine)."""

    inner: VirtualSimLauncher
    normal: int
    speed: float
    only_above: int = 0
    launches: int = 0

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[Any]:
        self.launches += 1
        slowed = self.launches > self.normal
        async with self.inner.running(knobs) as probe:
            yield _Slowed(probe, self.speed if slowed else 1.0, self.only_above)


@dataclasses.dataclass
class _Slowed:
    inner: VirtualProbe
    speed: float
    only_above: int

    async def measure(self, parallelism: int, settings: ProbeSettings | None = None) -> ProbeResult:
        result = await self.inner.measure(parallelism, settings)
        if parallelism <= self.only_above or self.speed == 1.0:
            return result
        low, high = result.rollouts_per_s_ci
        latency = {
            stage: dataclasses.replace(
                figures,
                p50=figures.p50 / self.speed if figures.p50 is not None else None,
                p95=figures.p95 / self.speed if figures.p95 is not None else None,
            )
            for stage, figures in result.latency_s.items()
        }
        return dataclasses.replace(
            result,
            rollouts_per_s=result.rollouts_per_s * self.speed,
            rollouts_per_s_ci=(low * self.speed, high * self.speed),
            output_tokens_per_s=result.output_tokens_per_s * self.speed,
            latency_s=latency,
        )


async def test_a_machine_slower_at_validation_than_during_the_sweep_is_measured_not_blamed(
    tmp_path: Path,
) -> None:
    """The machine slows ×0.7 after the sweep (another job on its cores): the validation
    run falls below its prediction, the sweep's nearest point measured again falls alike,
    and the run is judged against the prediction scaled by that speed: it passes at the
    recommended parallelism. A server slow only above the recommendation still fails."""
    spec = study(validate_rollouts=2000)
    virtual = VirtualSimLauncher(ARGS, ProbeSettings(1), PROMPT, OUTPUT, spec.seed)
    _, healthy = await sweep(tmp_path, spec.model_copy(update={"name": "healthy"}))
    busier = SlowerMachineLauncher(virtual, normal=1, speed=0.7)
    _, found = await sweep(tmp_path, spec.model_copy(update={"name": "busier"}), busier)
    (run,) = found.validations
    assert run.passed and found.validated is True, run.problems
    assert run.machine_speed is not None and 0.6 < run.machine_speed < 0.8
    assert found.recommended.parallelism == healthy.recommended.parallelism
    assert run.predicted_throughput == pytest.approx(
        healthy.validations[0].predicted_throughput * run.machine_speed
    )

    predicted = healthy.recommended.parallelism
    slow_server = SlowerMachineLauncher(virtual, normal=1, speed=0.7, only_above=predicted - 1)
    _, found = await sweep(tmp_path, spec.model_copy(update={"name": "server"}), slow_server)
    first = found.validations[0]
    assert not first.passed and first.machine_speed == 1.0
    assert any(problem.startswith("throughput") for problem in first.problems), first.problems
    assert found.recommended.parallelism < predicted
