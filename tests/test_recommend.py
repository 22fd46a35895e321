"""The recommendation (sweep/recommend.py), computed from hand-built sweep results, and
the promise behind its `vllm serve` line: the flags recommended are the flags launched."""

from __future__ import annotations

import dataclasses
import math
import shlex
from typing import Any

import pytest

from autotune.cli import build_parser
from autotune.cli.run_args import run_config
from autotune.config.flags import server_flags
from autotune.config.study import ObjectiveSpec
from autotune.engines.known import VLLM
from autotune.knee import summarise_curve
from autotune.report.sweep_report import interval_bands, interval_text, knee_marks
from autotune.results.probes import CurvePoint
from autotune.results.runs import WorkloadRecord
from autotune.results.stages import LATENCY_SLOS
from autotune.results.trials import (
    CEILING_RULE,
    HEADROOM_RULE,
    CurveSummary,
    Recommendation,
    SweepResult,
    TrialOutcome,
    TrialRecord,
)
from autotune.rollout.workload import workload_record
from autotune.servers.vllm import vllm_command
from autotune.sweep.recommend import (
    latency_margin,
    quantile_margin,
    recommendation,
    serve_line,
)
from tests.test_sweep_curve import usl

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KNOBS: dict[str, Any] = {
    "gpu_memory_utilization": 0.85,
    "max_num_seqs": 64.0,  # Optuna hands integer choices back as floats at times
    "enable_prefix_caching": False,
    "enforce_eager": True,
}


def usl_curve(lam: float, sigma: float = 0.02, kappa: float = 0.0005) -> CurveSummary:
    """The summary of a measured doubling ladder of a USL-shaped configuration."""
    ladder = [4, 8, 16, 32, 64, 128]
    rates = [lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1)) for n in ladder]
    return summarise_curve(ladder, rates)


def trial(
    number: int,
    value: float | None,
    knobs: dict[str, Any],
    *,
    state: str = "COMPLETE",
    feasible: bool = True,
    curve: CurveSummary | None = None,
) -> TrialRecord:
    return TrialRecord(
        number=number,
        state=state,
        value=value,
        feasible=feasible,
        knobs=knobs,
        curve=curve,
        infeasible_reason=None if feasible else "ValueError: No available memory",
    )


def sweep(*trials: TrialRecord, model: str | None = MODEL) -> SweepResult:
    return SweepResult(
        study="s",
        created_at=0.0,
        started_at=0.0,
        simulated=True,
        storage="sqlite:///s.db",
        trials_reused=0,
        metric="rollouts_per_s",
        max_error_rate=0.05,
        model=model,
        spec={},
        trials=list(trials),
        importances={},
        machine={},
    )


def test_the_best_feasible_complete_trial_is_recommended() -> None:
    best = usl_curve(lam=2.0)
    result = sweep(
        trial(0, 10.0, {"max_num_seqs": 16}, curve=usl_curve(lam=0.5)),
        trial(1, 99.0, {"max_num_seqs": 512}, feasible=False),  # refused by the server
        trial(2, 98.0, {"max_num_seqs": 1024}, state="FAIL", curve=usl_curve(lam=5.0)),
        trial(3, 30.0, KNOBS, curve=best),
        trial(4, 20.0, {"max_num_seqs": 32}, curve=usl_curve(lam=1.0)),
    )
    rec = recommendation(result)
    assert rec is not None
    assert rec.server == KNOBS
    assert rec.peak.parallelism == best.peak_parallelism
    assert rec.peak.throughput == best.peak_throughput
    assert rec.metric == "rollouts_per_s" and rec.simulated is True


def test_it_recommends_80_percent_of_the_peak_parallelism() -> None:
    curve = usl_curve(lam=1.0)
    assert curve.peak_inside_range  # the USL peak (about 44) lies inside 4..128
    rec = recommendation(sweep(trial(0, 15.0, KNOBS, curve=curve)))
    assert rec is not None
    parallelism = math.floor(0.8 * rec.peak.parallelism)
    assert rec.recommended.parallelism == parallelism == curve.recommended_parallelism
    assert rec.recommended.predicted_throughput == curve.recommended_throughput
    assert rec.recommended.predicted_throughput < rec.peak.throughput
    assert "80%" in rec.recommended.rule
    assert rec.snippets.nemo_gym == f"+num_samples_in_parallel={parallelism}"
    assert rec.snippets.autotune.startswith(f"autotune collect --parallelism {parallelism} ")
    assert f"near {parallelism} requests" in rec.snippets.openrlhf_note


@pytest.mark.parametrize(
    "trials",
    [
        [],
        [trial(0, 50.0, KNOBS, feasible=False)],
        [trial(0, 50.0, KNOBS, state="FAIL", curve=usl_curve(1.0))],
        [trial(0, 50.0, KNOBS, curve=None)],  # feasible, but no curve to recommend from
    ],
    ids=["no trial", "only infeasible", "only failed", "no fitted curve"],
)
def test_nothing_is_recommended_without_a_usable_trial(trials: list[TrialRecord]) -> None:
    assert recommendation(sweep(*trials)) is None


def test_the_vllm_snippet_is_the_serve_line_spelled_as_launched() -> None:
    rec = recommendation(sweep(trial(0, 15.0, KNOBS, curve=usl_curve(1.0))))
    assert rec is not None
    expected = "vllm serve " + MODEL + " " + " ".join(server_flags(KNOBS))
    assert rec.snippets.serve == serve_line(VLLM, MODEL, KNOBS) == expected
    assert expected == (
        f"vllm serve {MODEL} --gpu-memory-utilization 0.85 --max-num-seqs 64 "
        "--no-enable-prefix-caching --enforce-eager"
    )


def test_a_sweep_without_a_model_name_says_model() -> None:
    rec = recommendation(sweep(trial(0, 15.0, KNOBS, curve=usl_curve(1.0)), model=None))
    assert rec is not None
    assert rec.snippets.serve.startswith("vllm serve MODEL --gpu-memory-utilization 0.85")


def test_openrlhf_gets_the_knobs_it_has_flags_for() -> None:
    knobs = {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9, "max_num_seqs": 64}
    rec = recommendation(sweep(trial(0, 15.0, knobs, curve=usl_curve(1.0))))
    assert rec is not None
    assert rec.snippets.openrlhf == (
        "--vllm.tensor_parallel_size 2 --vllm.gpu_memory_utilization 0.9"
    )


def test_the_launched_vllm_command_carries_exactly_the_recommended_flags() -> None:
    """What autotune launched for a trial and what it recommends for the same knobs
    must be the same flags, floats and booleans included."""
    base = ("python", "-m", "vllm.entrypoints.openai.api_server")
    command = vllm_command(base, "M", 8123, KNOBS)
    assert command[: len(base) + 4] == [*base, "--model", "M", "--port", "8123"]
    launched = command[len(base) + 4 :]
    rec = recommendation(sweep(trial(0, 15.0, KNOBS, curve=usl_curve(1.0)), model="M"))
    assert rec is not None
    assert rec.snippets.serve == " ".join(["vllm serve", "M", *launched])
    assert launched == [
        "--gpu-memory-utilization",
        "0.85",
        "--max-num-seqs",
        "64",
        "--no-enable-prefix-caching",
        "--enforce-eager",
    ]


def test_a_ttft_slo_binds_like_the_latency_one() -> None:
    """Points whose p95 TTFT grows with parallelism: an SLO under the 80% point's TTFT
    lowers the recommendation and is named as the rule that set it."""
    curve = usl_curve(lam=1.0)
    points = [
        CurvePoint(n, usl(n), 100 * usl(n), 0.0, 1.0, 4.0, "time cap", p95_ttft_s=0.01 * n)
        for n in (4, 8, 16, 32, 64, 128)  # usl_curve's ladder
    ]
    measured = dataclasses.replace(trial(0, 15.0, KNOBS, curve=curve), points=points)
    free = recommendation(sweep(measured))
    assert free is not None and free.recommended.bound_by == "80% of peak"
    headroom = free.recommended.parallelism  # 35: its expected p95 TTFT is 0.35 s
    bound = recommendation(dataclasses.replace(sweep(measured), p95_ttft_slo_s=0.2))
    assert bound is not None
    assert bound.recommended.bound_by == "p95 TTFT SLO"
    # The largest parallelism whose expected TTFT (0.01 s a request) stays 10% inside 0.2 s.
    assert bound.recommended.parallelism == 18 < headroom
    assert bound.recommended.p95_ttft_s is not None and bound.recommended.p95_ttft_s * 1.1 <= 0.2
    assert "p95 TTFT stays 10% within 0.2 s" in bound.recommended.rule


def test_every_slo_a_study_can_set_is_in_the_one_table_every_rule_reads() -> None:
    """The trial's constraints, the curve's SLO rung, the recommendation and validation
    all read LATENCY_SLOS: an SLO added to the objective but not to it would be ignored."""
    fields = {name for name in ObjectiveSpec.model_fields if name.endswith("_slo_s")}
    assert {slo.field for slo in LATENCY_SLOS} == fields
    for slo in LATENCY_SLOS:
        assert slo.field in SweepResult.__dataclass_fields__
        assert slo.figure in CurvePoint.__dataclass_fields__
        assert f"min_{slo.figure}" in TrialOutcome.__dataclass_fields__


# -- a GPU budget split into engines × TP (issue 13) ----------------------------------------

SPLIT: dict[str, Any] = {
    "num_engines": 4,
    "tensor_parallel_size": 2,
    "enable_prefix_caching": True,
    "max_num_seqs": 256,
}


def test_a_split_budget_is_recommended_as_engines_tp_and_parallelism_per_engine() -> None:
    off = {**SPLIT, "enable_prefix_caching": False}
    one_engine = {**SPLIT, "num_engines": 1, "tensor_parallel_size": 8}
    rec = recommendation(
        sweep(
            trial(0, 30.0, SPLIT, curve=usl_curve(1.0)),
            trial(1, 20.0, off, curve=usl_curve(0.7)),
            trial(2, 25.0, one_engine, curve=usl_curve(0.8)),
            trial(3, 5.0, {**one_engine, "enable_prefix_caching": False}, curve=usl_curve(0.2)),
        )
    )
    assert rec is not None
    parallelism = rec.recommended.parallelism
    assert (rec.engines, rec.tensor_parallel_size, rec.enable_prefix_caching) == (4, 2, True)
    assert rec.parallelism_per_engine == math.ceil(parallelism / 4)
    assert rec.snippets.openrlhf == (
        "--vllm.num_engines 4 --vllm.tensor_parallel_size 2 --vllm.enable_prefix_caching"
    )
    assert rec.snippets.serve == (
        f"vllm serve {MODEL} --data-parallel-size 4 --tensor-parallel-size 2 "
        "--enable-prefix-caching --max-num-seqs 256"
    )
    assert rec.snippets.nemo_gym == f"+num_samples_in_parallel={parallelism}"  # the total
    assert f"near {rec.parallelism_per_engine} requests in flight per engine" in (
        rec.snippets.openrlhf_note
    )
    # What caching bought is compared at the recommended split only (4x2, not 1x8).
    assert rec.prefix_caching is not None
    assert (rec.prefix_caching.split, rec.prefix_caching.on, rec.prefix_caching.off) == (
        "4x2",
        30.0,
        20.0,
    )
    assert rec.prefix_caching.gain == pytest.approx(1.5)


def test_caching_off_is_no_openrlhf_switch_and_an_explicit_vllm_flag() -> None:
    off = {**SPLIT, "enable_prefix_caching": False}
    rec = recommendation(sweep(trial(0, 30.0, off, curve=usl_curve(1.0))))
    assert rec is not None
    assert rec.snippets.openrlhf == "--vllm.num_engines 4 --vllm.tensor_parallel_size 2"
    assert "--no-enable-prefix-caching" in rec.snippets.serve
    assert rec.enable_prefix_caching is False
    assert rec.prefix_caching is None  # caching on was never measured at 4x2


def test_a_recommendation_round_trips_its_gpu_plan() -> None:
    rec = recommendation(
        sweep(
            trial(0, 30.0, SPLIT, curve=usl_curve(1.0)),
            trial(1, 20.0, {**SPLIT, "enable_prefix_caching": False}, curve=usl_curve(0.7)),
        )
    )
    assert rec is not None
    assert type(rec).from_dict(rec.to_dict()) == rec


def test_the_collect_line_reruns_the_sweeps_own_workload_on_its_server() -> None:
    """Pasted as the README says, the recommendation's `autotune` line parses into a run
    whose workload is the one the sweep measured, field for field, on the simulator with
    the sweep's flags and the best trial's knobs."""
    measured = WorkloadRecord(
        input=None, input_sha256=None, synthetic_tasks=400, prompt_tokens=(512, 64),
        output_tokens=(128, 32), seed=3, limit=300, num_repeats=4,
        extra_body={"ignore_eos": True}, api="chat", stream=False, verifier="synthetic",
    )  # fmt: skip
    result = dataclasses.replace(
        sweep(trial(0, 15.0, KNOBS, curve=usl_curve(lam=1.0))),
        spec={"target": {"kind": "sim", "args": ["--time-scale", "0.05"]}},
        workload=measured,
    )
    rec = recommendation(result)
    assert rec is not None and rec.workload == measured
    argv = shlex.split(rec.snippets.autotune)[1:]
    args = build_parser().parse_args(argv)
    config = run_config(args)
    sim_flags = list(config.target.sim_args)
    assert workload_record(config) == measured, measured.differences(workload_record(config))
    assert sim_flags[:2] == ["--time-scale", "0.05"] and "--max-num-seqs" in sim_flags
    assert args.parallelism == rec.recommended.parallelism


def ci(rate: float) -> tuple[float, float]:
    return 0.97 * rate, 1.03 * rate


def ladder_trial(rates: dict[int, float], ceiling: int | None = None) -> TrialRecord:
    """A trial measured at each parallelism of `rates`, each point ±3% over 10 batches
    (p95 latency 0.1 s a unit of parallelism); `ceiling`: the server's, where it ended."""
    points = [
        CurvePoint(n, r, 128 * r, 0.0, 0.1 * n, 10.0, "converged", None, None, ci(r), batches=10)
        for n, r in rates.items()
    ]
    curve = summarise_curve(list(rates), list(rates.values()), ceiling)
    return dataclasses.replace(trial(0, max(rates.values()), KNOBS, curve=curve), points=points)


def test_a_peak_at_the_top_of_the_range_has_intervals_open_above() -> None:
    """Throughput still growing at the largest parallelism tried: the peak lies at or past
    it, so its interval (and 80% of it) is "at least 256", never a zero-width [256, 256]."""
    growing = ladder_trial({n: 0.5 * n / (1 + 0.001 * (n - 1)) for n in (8, 16, 32, 64, 128, 256)})
    assert growing.curve is not None and not growing.curve.peak_inside_range
    rec = recommendation(sweep(growing))
    assert rec is not None and rec.peak.parallelism_interval is not None
    assert rec.peak.parallelism_interval[0] == 256 and math.isinf(rec.peak.parallelism_interval[1])
    assert interval_text(rec.peak.parallelism_interval) == "at least 256"
    assert rec.recommended.parallelism_interval is not None
    assert math.isinf(rec.recommended.parallelism_interval[1])
    assert "peak parallelism, 95% interval: at least 256" in interval_bands(rec)

    turning = ladder_trial({n: usl(n, 1.0, 0.02, 0.0005) for n in (4, 8, 16, 32, 64, 128)})
    rec = recommendation(sweep(turning))
    assert rec is not None and rec.peak.parallelism_interval is not None
    low, high = rec.peak.parallelism_interval
    assert low < high < math.inf  # a peak inside the range keeps both ends


def test_a_curve_level_at_the_servers_ceiling_is_recommended_at_80_percent_of_it() -> None:
    """A server that runs at most 128 requests at once, still scaling up to them: its
    peak is the ceiling, and the recommendation is the guide's 80% of it (102), with the
    ceiling beside it as the alternative and what running full would gain."""
    capped = ladder_trial({n: 0.5 * n for n in (16, 32, 64, 128)}, ceiling=128)
    rec = recommendation(sweep(capped))
    assert rec is not None
    assert rec.peak.parallelism == 128 and rec.peak.inside_searched_range
    assert rec.recommended.parallelism == 102 and rec.recommended.bound_by == HEADROOM_RULE
    assert rec.snippets.nemo_gym == "+num_samples_in_parallel=102"
    assert rec.alternative is not None
    assert rec.alternative.parallelism == 128 and rec.alternative.bound_by == CEILING_RULE
    # A linear curve: the batch's last fifth is a quarter more throughput.
    gain = rec.alternative.predicted_throughput / rec.recommended.predicted_throughput
    assert gain == pytest.approx(128 / 102, rel=0.02)
    assert "instead: parallelism 128 = the server's ceiling" in " ".join(knee_marks(rec)[0])
    # A curve that turns down below any ceiling has one answer, and no alternative.
    turning = ladder_trial({n: usl(n, 1.0, 0.02, 0.0005) for n in (4, 8, 16, 32, 64, 128)})
    assert (plain := recommendation(sweep(turning))) is not None and plain.alternative is None


def test_recommend_ceiling_runs_a_level_curve_full() -> None:
    """`recommend: ceiling` swaps the two: the ceiling, its interval closed, with 80% of
    it as the alternative; an SLO still binds from the ceiling down."""
    capped = ladder_trial({n: 0.5 * n for n in (16, 32, 64, 128)}, ceiling=128)
    full = dataclasses.replace(sweep(capped), spec={"recommend": "ceiling"})
    rec = recommendation(full)
    assert rec is not None
    assert rec.recommended.parallelism == 128 and rec.recommended.bound_by == CEILING_RULE
    assert "server's ceiling (128 requests at once" in rec.recommended.rule
    assert rec.recommended.parallelism_interval == (128, 128)
    assert interval_text(rec.recommended.parallelism_interval) == "128 in every bootstrap draw"
    assert not any(band.startswith("recommended") for band in interval_bands(rec))
    assert rec.alternative is not None and rec.alternative.parallelism == 102
    assert rec.alternative.bound_by == HEADROOM_RULE
    # A latency SLO still binds, from the ceiling down: 0.1 s a unit, 10% inside 10 s.
    bound = recommendation(dataclasses.replace(full, p95_latency_slo_s=10.0))
    assert bound is not None and bound.recommended.bound_by == "p95 latency SLO"
    assert bound.recommended.parallelism == 90
    assert "at or under the server's ceiling (128)" in bound.recommended.rule
    headroom = recommendation(dataclasses.replace(sweep(capped), p95_latency_slo_s=10.0))
    assert headroom is not None and headroom.recommended.parallelism == 90
    assert "at or under 80% of the peak (102)" in headroom.recommended.rule


def test_the_latency_margin_is_what_the_measured_p95_is_known_to() -> None:
    """The p95 of n log-normal latencies is known to ±1.96 · √(0.95·0.05/n) · σ / φ(z95)
    of itself (σ = ln(p95/p50) / z95): a narrow spread counted over many rollouts needs
    only the 3% floor, a wide one over few more than the flat 10% of old."""

    def point(p50: float, p95: float, completed: int | None) -> CurvePoint:
        return CurvePoint(16, 1.0, 100.0, 0.0, p95, 10.0, "converged", p50, completed=completed)

    wide = quantile_margin(point(10.0, 20.0, 100), "p95_latency_s", 0.95)
    sigma = math.log(2.0) / 1.6449
    assert wide == pytest.approx(1.96 * math.sqrt(0.0475 / 100) * sigma / 0.10314, rel=1e-3)
    assert wide > 0.10  # 17%: a p95 twice the median, read from 100 rollouts
    narrow, uncounted = point(10.0, 11.0, 2000), point(10.0, 20.0, None)
    assert quantile_margin(narrow, "p95_latency_s", 0.95) == 0.03  # floored: run-to-run drift
    assert quantile_margin(uncounted, "p95_latency_s", 0.95) == 0.10  # the flat margin
    # Read between two points, the wider of their margins holds.
    points = [point(10.0, 11.0, 2000), dataclasses.replace(point(10.0, 20.0, 100), parallelism=64)]
    assert latency_margin(points, 32, "p95_latency_s") == wide
    assert latency_margin(points, 16, "p95_ttft_s") == 0.10


def test_a_p99_slo_binds_with_the_p99s_own_margin() -> None:
    """p99 = 0.2 s a unit of parallelism, twice the p50, 400 rollouts a point: the p99 is
    known to ±1.96 · √(0.99·0.01/400) · σ / φ(z99), σ = ln 2 / z99 (11%), so the
    recommendation keeps its expected p99 that far inside a 20 s SLO."""
    capped = ladder_trial({n: 0.5 * n for n in (16, 32, 64, 128)}, ceiling=128)
    tails = [
        dataclasses.replace(p, p50_latency_s=0.1 * n, p99_latency_s=0.2 * n, completed=400)
        for p, n in ((p, p.parallelism) for p in capped.points)
    ]
    capped = dataclasses.replace(capped, points=tails)
    rec = recommendation(dataclasses.replace(sweep(capped), p99_latency_slo_s=20.0))
    assert rec is not None and rec.recommended.bound_by == "p99 latency SLO"
    sigma = math.log(2) / 2.3263
    margin = 1.96 * math.sqrt(0.99 * 0.01 / 400) * sigma / 0.02665
    assert margin == pytest.approx(0.109, abs=0.001)
    assert rec.recommended.parallelism == math.floor(20.0 / (0.2 * (1 + margin))) == 90
    assert "p99 rollout latency stays 11% within 20 s" in rec.recommended.rule
    assert rec.p99_latency_slo_s == 20.0


def test_a_recommendation_saved_before_engines_reads_back_with_its_vllm_line() -> None:
    """Files written when the launch line was `snippets.vllm` load as `serve`, vLLM's."""
    rec = recommendation(sweep(trial(0, 30.0, KNOBS, curve=usl_curve(lam=2.0))))
    assert rec is not None
    saved = rec.to_dict()
    old = {
        k: v for k, v in saved["snippets"].items() if k not in ("engine", "frameworks", "options")
    }
    old["vllm"] = old.pop("serve")
    again = Recommendation.from_dict({**saved, "snippets": old})
    assert again.snippets.serve == rec.snippets.serve and again.snippets.engine == "vllm"
