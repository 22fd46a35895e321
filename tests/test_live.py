"""A collect watched while it runs (issue 17): /metrics, the stats file, the drift watch,
the collect report. End-to-end runs go through the CLI on the accelerated simulator;
the drift rules and the expectation's interval are tested on their own."""

from __future__ import annotations

import dataclasses
import math
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from autotune.cli import build_parser
from autotune.cli.run_args import run_config
from autotune.collector.collect_job import _summarise
from autotune.config.collection import CollectConfig, LiveConfig, SyntheticWorkload, TargetConfig
from autotune.errors import UsageError
from autotune.knee import summarise_curve
from autotune.live.drift import DriftWatch, WindowFigures, auto_window_s, window_rate
from autotune.live.expect import diagnose_command, from_recommendation, load_expectation
from autotune.live.figures import RunState, Sources, StageHistograms, Totals
from autotune.live.metrics import RunCollector
from autotune.live.samples import Sampler
from autotune.report import collect_report
from autotune.results.codec import save, to_json
from autotune.results.probes import CurvePoint
from autotune.results.runs import (
    CollectResult,
    CollectSummary,
    DriftWarning,
    Expectation,
    LiveSample,
)
from autotune.results.saved import load_result
from autotune.results.stages import StageLatency, StageSamples
from autotune.results.trials import SweepResult, TrialRecord
from autotune.rl.groups import GroupTracker
from autotune.rollout.backends import CallCounters
from autotune.rollout.concurrency import AdaptiveConcurrency
from autotune.rollout.engine import RunStats
from autotune.rollout.target import MeteredConnector, Target
from autotune.rollout.workload import workload_record
from autotune.stats import RateEstimate
from autotune.sweep.recommend import recommendation
from tests.browser import VIEWPORT, render
from tests.helpers import REPO, autotune, free_port

# -- /metrics equals the closing summary (must-show 1) ---------------------------------------

FLAKY_VERIFIER = (
    "def score(row):\n"
    "    if row['_ng_task_index'] % 10 == 3:\n"
    "        raise ValueError('planted failure')\n"
    "    return float(row['_ng_task_index'] % 2)\n"
)


Scraped = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse_metrics(text: str) -> Scraped:
    """Every sample of a /metrics body, parsed by prometheus_client's own text parser, as
    {sample name: {sorted labels: value}}."""
    samples: Scraped = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def scrape(port: int) -> Scraped | None:
    """/metrics parsed (parse_metrics); None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return parse_metrics(answer.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return None


def by_label(samples: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for labels, value in samples.items()}


SUMMARY_NAMES = {"concurrency_limit": "concurrency_limit_final"}  # the rest are named alike


def assert_one_reading(summary: dict[str, Any], last: dict[str, Any], scraped: Scraped) -> None:
    """Every run total (live/figures.py Totals) is the same in the closing summary (where it
    has it), the stats file's last line and a scrape of the finished run, and the summary's
    rates are those totals over the time the last line was taken at."""
    failed = by_label(scraped.get("autotune_rollouts_failed_total", {}), "failure_class")
    reward = scraped["autotune_reward_mean"][()]
    retries = scraped.get("autotune_model_retries_total", {})
    served = {
        "completed": scraped["autotune_rollouts_completed_total"][()],
        "failed": sum(failed.values()),
        "in_flight": scraped["autotune_rollouts_in_flight"][()],
        "input_tokens": scraped["autotune_input_tokens_total"][()],
        "output_tokens": scraped["autotune_output_tokens_total"][()],
        "mean_reward": None if math.isnan(reward) else reward,
        "errors_by_class": failed,
        "retries_by_class": by_label(retries, "failure_class"),
        "rate_limited_responses": scraped["autotune_rate_limited_responses_total"][()],
        "limiter_wait_s": scraped["autotune_limiter_wait_seconds_total"][()],
        "pool_wait_s": scraped["autotune_connection_pool_wait_seconds_total"][()],
        "concurrency_limit": scraped.get("autotune_concurrency_limit", {}).get(()),
        "cancelled": scraped["autotune_rollouts_cancelled_total"][()],
        "groups_complete": scraped.get("autotune_groups_completed_total", {}).get(()),
        "groups_informative": scraped.get("autotune_groups_informative_total", {}).get(()),
        "groups_informative_tokens": scraped.get(
            "autotune_groups_informative_output_tokens_total", {}
        ).get(()),
    }
    assert set(served) == {field.name for field in dataclasses.fields(Totals)}
    for name, value in served.items():
        assert last[name] == value, name
        if SUMMARY_NAMES.get(name, name) in summary:
            assert summary[SUMMARY_NAMES.get(name, name)] == value, name
    groups = summary.get("groups") or {}
    assert groups.get("complete") == served["groups_complete"]
    assert groups.get("informative") == served["groups_informative"]
    if groups:  # the group figures where rollouts are counted, not only their counts
        share = groups["informative"] / groups["complete"]
        assert scraped["autotune_groups_informative_share"][()] == share
        assert last["groups_informative_share"] == groups["informative_share"] == share
        tokens = served["groups_informative_tokens"]
        assert groups["informative_tokens_per_s"] == tokens / summary["elapsed_s"]
        count = scraped["autotune_group_straggler_ratio_count"][()]
        assert count == groups["complete"] == groups["straggler_ratio"]["count"]
    assert last["summary"] == summary
    assert last["t_s"] == summary["elapsed_s"]
    assert summary["rollouts_per_s"] == summary["completed"] / summary["elapsed_s"]
    assert summary["output_tokens_per_s"] == summary["output_tokens"] / summary["elapsed_s"]


@pytest.mark.slow
def test_metrics_scraped_during_a_run_end_equal_to_its_summary(tmp_path: Path) -> None:
    verifier = tmp_path / "flaky.py"
    verifier.write_text(FLAKY_VERIFIER)
    port = free_port()
    run = tmp_path / "run"
    args = [
        sys.executable, "-m", "autotune", "collect", "--synthetic", "1500",
        "--parallelism", "16", "--sim-arg=--time-scale=0.05", "--output-tokens", "64,16",
        "--verifier", f"{verifier}:score", "--verifier-workers", "2",
        "--max-failure-rate", "0.5", "--output-dir", str(run), "--json", "-q",
        "--metrics-port", str(port), "--metrics-linger", "60", "--stats-every", "0.25",
    ]  # fmt: skip
    process = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    scrapes = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = scrape(port)
            if found is not None:
                scrapes.append(found)
                if found["autotune_collect_finished"][()] == 1:
                    break
            time.sleep(0.05)  # a scrape interval, not a wait for the run
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    summary = orjson.loads(stdout)
    final = scrapes[-1]
    assert final["autotune_collect_finished"][()] == 1
    during = [s for s in scrapes if s["autotune_collect_finished"][()] == 0]
    completed_during = [
        s["autotune_rollouts_completed_total"][()]
        for s in during
        if s.get("autotune_rollouts_completed_total")
    ]
    assert any(0 < n < summary["completed"] for n in completed_during), "no scrape mid-run"
    assert completed_during == sorted(completed_during)  # a counter never goes back

    assert final["autotune_rollouts_completed_total"][()] == summary["completed"] > 0
    assert summary["errors_by_class"] == {"verifier_error": 150}
    assert final["autotune_rollouts_in_flight"][()] == 0
    assert final["autotune_rollouts_planned"][()] == 1500
    assert summary["mean_reward"] is not None
    assert final["autotune_limiter_wait_seconds_total"][()] == 0
    assert final["autotune_connection_pool_wait_seconds_total"][()] > 0
    counts_ = by_label(final["autotune_stage_latency_seconds_count"], "stage")
    sums = by_label(final["autotune_stage_latency_seconds_sum"], "stage")
    for stage, latency in summary["latency_s"].items():
        assert counts_[stage] == latency["count"], stage
        if latency["count"]:
            assert sums[stage] == pytest.approx(latency["mean"] * latency["count"], rel=1e-9)
    infinite = by_label(
        {k: v for k, v in final["autotune_stage_latency_seconds_bucket"].items()
         if dict(k)["le"] == "+Inf"},
        "stage",
    )  # fmt: skip
    assert infinite == counts_

    # The stats file holds the same figures; its last line is the closing summary.
    lines = [
        orjson.loads(line) for line in (run / "rollouts_stats.jsonl").read_bytes().splitlines()
    ]
    assert len(lines) >= 3
    assert all(line["summary"] is None for line in lines[:-1])
    assert_one_reading(summary, lines[-1], final)
    assert [line["completed"] for line in lines] == sorted(line["completed"] for line in lines)
    assert sum(line["window_latency_s"]["model"]["count"] for line in lines) == summary["completed"]


def test_every_total_non_zero_agrees_in_the_summary_the_stats_line_and_a_scrape() -> None:
    """The totals a run above leaves at zero or unset (retries, 429s, the limiters' waits,
    an adaptive concurrency limit), each non-zero, agree in all three outputs too."""
    stats = RunStats(
        taken=64, completed=50, failed=7, cancelled=4, input_tokens=12345, output_tokens=6789,
        reward_sum=31.0, reward_count=40, errors_by_class={"verifier_error": 5, "timeout": 2},
        started=100.0, finished=112.5,
    )  # fmt: skip
    for i in range(50):
        stats.samples.add("total", 0.1 + i / 100)
    counters = CallCounters(retries={"timeout": 3}, rate_limited_responses=4, limiter_wait_s=1.25)
    limiter = AdaptiveConcurrency(16)
    pool = cast(MeteredConnector, SimpleNamespace(acquire_s=0.75))
    groups = GroupTracker(2)
    for task, rewards in enumerate([(1.0, 0.0), (1.0, 1.0), (0.0, 1.0)]):
        for reward in rewards:
            groups.ended(task, 100.0, 101.0 + reward, reward, output_tokens=10)
    sources = Sources(stats, counters, limiter, pool, planned=80, groups=groups)
    target = cast(Target, SimpleNamespace(model="m", base_url="http://h/v1", simulated=True))
    config = cast(CollectConfig, SimpleNamespace(parallelism=16, output=None, tools=None))
    summary = replace(_summarise(sources, target, config, skipped=0), groups=groups.summary(12.5))
    last = Sampler(sources, 1e9).take(stats.finished, summary=summary)
    state = RunState(None)
    state.sources, state.histograms, state.finished = sources, StageHistograms(stats.samples), True
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(state))
    scraped = parse_metrics(generate_latest(registry).decode())
    assert_one_reading(orjson.loads(to_json(summary)), orjson.loads(to_json(last)), scraped)
    assert last.in_flight == 3 and summary.concurrency_limit_final == 16


def test_stage_histograms_catch_up_with_new_samples_at_each_scrape() -> None:
    samples = StageSamples()
    histograms = StageHistograms(samples, bounds=(0.005, 0.01, 0.25))
    for seconds in (0.003, 0.01, 0.2, 700.0):
        samples.add("model", seconds)
    histograms.update()
    assert histograms.cumulative("model") == ([1, 2, 3, 4], pytest.approx(700.213))
    samples.add("model", 0.004)  # only the new sample is counted at the next scrape
    histograms.update()
    histograms.update()
    assert histograms.cumulative("model")[0] == [2, 3, 4, 5]
    assert histograms.cumulative("verify") == ([0, 0, 0, 0], 0.0)


# -- the drift watch, on its own -------------------------------------------------------------

EXPECTED = Expectation(100.0, 90.0, 110.0, 16, "a test", "given")
STAGE_MEANS = {"queue": 0.001, "model": 0.5, "ttft": 0.05, "verify_wait": 0.0, "verify": 0.01}


def window(index: int, rate: float, halfwidth: float, **slower: float) -> WindowFigures:
    """The index-th 10 s window: `rate` ± `halfwidth`, stages as STAGE_MEANS plus `slower`."""
    means = {stage: s + slower.get(stage, 0.0) for stage, s in STAGE_MEANS.items()}
    estimate = RateEstimate(rate, rate - halfwidth, rate + halfwidth, int(rate * 10), 10.0, 8)
    return WindowFigures(10.0 * index, 10.0 * (index + 1), estimate, means)


def test_windows_inside_or_overlapping_the_expectation_never_warn() -> None:
    watch = DriftWatch(EXPECTED, windows=3, window_s=10.0, hint="autotune diagnose")
    rates = [101.0, 95.0, 85.0, 80.0, 120.0, 84.0, 86.0] * 3  # 85 ± 6 reaches 90: not below
    assert all(watch.add(window(i, r, 6.0)) is None for i, r in enumerate(rates))
    assert watch.warning is None and watch.counted == len(rates)


def test_three_windows_below_in_a_row_warn_once_naming_the_stage_that_slowed() -> None:
    watch = DriftWatch(EXPECTED, windows=3, window_s=10.0, hint="autotune diagnose --high 16")
    assert watch.add(window(0, 100.0, 5.0)) is None
    assert watch.add(window(1, 60.0, 5.0, model=0.3)) is None
    assert watch.add(window(2, 101.0, 5.0)) is None  # the streak breaks
    assert watch.add(window(3, 60.0, 5.0, model=0.3, ttft=0.01)) is None
    assert watch.add(window(4, 55.0, 5.0, model=0.35, ttft=0.01)) is None
    warning = watch.add(window(5, 50.0, 5.0, model=0.4, ttft=0.01, verify=0.02))
    assert warning is not None and warning is watch.warning
    assert warning.t_s == 60.0 and warning.windows == 3
    assert warning.stage == "model"
    assert warning.stage_before_s == pytest.approx(0.5)
    assert warning.stage_now_s == pytest.approx(0.9)
    assert warning.rollouts_per_s_ci == (45.0, 55.0)
    assert "the model stage slowed most: 500.0 ms per rollout" in warning.message
    assert warning.message.endswith("find out why with: autotune diagnose --high 16")
    assert watch.add(window(6, 40.0, 5.0, model=0.5)) is None  # once


def test_a_run_below_from_its_first_window_blames_no_stage() -> None:
    watch = DriftWatch(EXPECTED, windows=2, window_s=10.0, hint="h")
    assert watch.add(window(0, 50.0, 5.0)) is None
    warning = watch.add(window(1, 50.0, 5.0))
    assert warning is not None and warning.stage is None
    assert "it was slow from the start" in warning.message


def test_a_window_rate_is_the_probes_estimate_with_its_interval() -> None:
    # 50 slots finishing every 0.5 s in waves: 100 rollouts/s.
    done_at = [0.5 * wave + 0.001 * slot for wave in range(1, 41) for slot in range(50)]
    estimate = window_rate(done_at, 2.0, 18.0, latency_s=0.5)
    assert estimate.rate == pytest.approx(100.0, rel=0.03)
    assert estimate.low <= 100.0 <= estimate.high
    assert estimate.batches >= 8
    assert auto_window_s(0.5) == 60.0 and auto_window_s(30.0) == 16 * 30.0


def test_expect_rate_is_a_floor_without_an_interval() -> None:
    expectation = load_expectation(LiveConfig(expect_rate=42.0))
    assert expectation is not None
    assert (expectation.low, expectation.rollouts_per_s, expectation.high) == (42.0, 42.0, 42.0)
    assert load_expectation(LiveConfig()) is None


def write_sweep(directory: Path, points: dict[int, float], target_halfwidth: float) -> Path:
    """A saved sweep of one trial with these measured points, and its recommendation.json
    (as the sweep job writes them); returns the recommendation's path."""
    curve = summarise_curve(list(points), list(points.values()))
    trial = TrialRecord(
        number=0,
        state="COMPLETE",
        value=max(points.values()),
        feasible=True,
        knobs={},
        points=[CurvePoint(n, x, x * 100, 0.0, 1.0, 5.0, "precision") for n, x in points.items()],
        curve=curve,
    )
    result = SweepResult(
        study="s", created_at=0.0, started_at=0.0, simulated=True, storage="sqlite://",
        trials_reused=0, metric="rollouts_per_s", max_error_rate=0.05, model="m",
        spec={"probe": {"target_halfwidth": target_halfwidth}}, trials=[trial],
        importances={}, machine={},
    )  # fmt: skip
    save(result, directory / "sweep.json")
    found = recommendation(result)
    assert found is not None
    return save(found, directory / "recommendation.json")


def usl_points(miss_at_16: float) -> dict[int, float]:
    """Points on a USL curve (λ 10, σ 0.02, κ 0.0005), parallelism 16's off by a share."""
    return {
        n: 10 * n / (1 + 0.02 * (n - 1) + 0.0005 * n * (n - 1)) * (1 + miss_at_16 * (n == 16))
        for n in (4, 8, 16, 32, 64)
    }


def without_interval(path: Path) -> None:
    """The recommendation as saved before it held an interval."""
    data = orjson.loads(path.read_bytes())
    data["recommended"].pop("throughput_interval", None)
    path.write_bytes(orjson.dumps(data))


def test_a_recommendations_own_interval_is_the_expectation(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, usl_points(0.1), target_halfwidth=0.04)
    expectation = from_recommendation(tmp_path)  # the report directory will do
    saved = orjson.loads(path.read_bytes())["recommended"]
    assert saved["throughput_interval"] is not None
    assert [expectation.low, expectation.high] == saved["throughput_interval"]
    assert expectation.rollouts_per_s == saved["predicted_throughput"]
    assert expectation.parallelism == saved["parallelism"]
    assert "the recommendation's own 95% interval" in expectation.note


def test_a_recommendation_without_one_gets_an_interval_from_its_sweep(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, usl_points(0.1), target_halfwidth=0.04)
    without_interval(path)
    expectation = from_recommendation(path)
    share = expectation.high / expectation.rollouts_per_s - 1
    assert 0.04 + 0.02 < share < 0.04 + 0.10  # the precision plus the fit's largest miss
    assert expectation.low == pytest.approx(expectation.rollouts_per_s * (1 - share))
    assert "holds a prediction without an interval" in expectation.note
    assert "precision (±4%, 95%)" in expectation.note


def test_a_recommendation_alone_gets_the_probes_default_precision(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, usl_points(0.0), 0.04)
    without_interval(path)
    (tmp_path / "sweep.json").unlink()
    expectation = from_recommendation(path)
    assert expectation.high == pytest.approx(expectation.rollouts_per_s * 1.05)
    assert "no readable sweep.json beside it" in expectation.note


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist; pass the recommendation.json a sweep wrote"),
        (b'{"kind": "sweep"}', "is not a recommendation (KeyError"),
        (b"[1, 2]", "is not a recommendation"),
    ],
)
def test_an_expect_file_that_is_no_recommendation_is_one_sentence(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    path = tmp_path / "recommendation.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError) as refused:
        from_recommendation(path)
    assert says in str(refused.value)


def test_the_diagnose_hint_repeats_the_runs_settings() -> None:
    """Its own workload, every field of it (the task count and seed: the same prompts,
    the same prefix cache; repeats; the request fields sent)."""
    config = CollectConfig(
        target=TargetConfig(
            base_url="http://h:8000/v1", stream=False, sim_args=(), extra_body={"top_k": 5}
        ),
        synthetic=SyntheticWorkload(
            num_tasks=400, output_tokens_mean=128, output_tokens_std=32, seed=7
        ),
        num_repeats=4,
        verifier="synthetic",
        verifier_cost_ms=2.0,
    )
    hint = diagnose_command(config, workload_record(config), "m", 64)
    assert hint == (
        "autotune diagnose --base-url http://h:8000/v1 --model m --synthetic 400 "
        "--prompt-tokens 256,64 --output-tokens 128,32 --seed 7 --num-repeats 4 "
        """--extra-body '{"top_k":5}' --no-stream --verifier synthetic """
        "--verifier-cost-ms 2 --low 16 --high 64"
    )
    parsed = run_config(build_parser().parse_args(shlex.split(hint)[1:]))
    assert workload_record(parsed) == workload_record(config)


# -- the collect report (must-show 4) --------------------------------------------------------


def latency(mean_s: float, count: int = 100) -> StageLatency:
    return StageLatency(count, mean_s, mean_s, mean_s * 1.5)


def sample(t: float, completed: int, failed: dict[str, int], model_s: float) -> LiveSample:
    stages = {"queue": 0.001, "model": model_s, "ttft": 0.05, "verify_wait": 0.0, "verify": 0.01}
    window_latency = {stage: latency(mean) for stage, mean in stages.items()}
    window_latency["total"] = latency(sum(stages.values()))
    return LiveSample(
        at=1e9 + t, t_s=t, completed=completed, failed=sum(failed.values()), in_flight=16,
        input_tokens=completed * 256, output_tokens=completed * 128, mean_reward=0.5,
        errors_by_class=failed, retries_by_class={}, rate_limited_responses=0,
        limiter_wait_s=0.0, pool_wait_s=0.01, concurrency_limit=16, window_s=10.0,
        window_rollouts_per_s=100.0 if model_s < 0.6 else 50.0,
        window_output_tokens_per_s=12800.0, window_latency_s=window_latency,
        steady_rollouts_per_s=(100.0, 95.0, 105.0) if model_s < 0.6 else (50.0, 46.0, 54.0),
    )  # fmt: skip


def planted_result() -> CollectResult:
    """A collect whose model stage slowed at 60 s, with a drift warning at 90 s, timeouts
    from 70 s and one user-supplied name that would run if it were not escaped."""
    samples = [sample(10.0 * i, 1000 * i, {}, 0.5) for i in range(1, 7)] + [
        sample(10.0 * i, 6000 + 500 * (i - 6), {"timeout": (i - 6) * 3}, 0.9) for i in range(7, 13)
    ]
    summary = CollectSummary(
        completed=9000, failed=18, skipped=0, elapsed_s=120.0, rollouts_per_s=75.0,
        output_tokens_per_s=9600.0, input_tokens=9000 * 256, output_tokens=9000 * 128,
        mean_reward=0.5, latency_s={s: latency(0.7, 9000) for s in ("queue", "model", "ttft",
        "verify_wait", "verify", "total")}, errors_by_class={"timeout": 18},
        retries_by_class={}, parallelism=16, model="<script>alert(1)</script>",
        base_url="http://127.0.0.1:8000/v1", simulated=True, output="out.jsonl",
    )  # fmt: skip
    warning = DriftWarning(
        t_s=90.0, windows=3, window_s=10.0, rollouts_per_s=50.0, rollouts_per_s_ci=(46.0, 54.0),
        expected_low=90.0, stage="model", stage_before_s=0.5, stage_now_s=0.9,
        message="throughput drifted: 50 rollouts/s ...; the model stage slowed most",
    )  # fmt: skip
    samples[-1] = dataclasses.replace(samples[-1], summary=summary)
    return CollectResult(
        created_at=0.0,
        summary=summary,
        samples=samples,
        expectation=EXPECTED,
        drift=warning,
        drift_windows_counted=11,
        settings={"sample_every_s": 10.0, "drift_window_s": 10.0, "drift_windows": 3},
        machine={"autotune": "0.1.0"},
    )


def test_report_series_come_from_the_samples() -> None:
    result = planted_result()
    rates = collect_report.throughput_series(result)["rollouts/s (each sample)"]
    assert rates[0][:2] == [10.0, 20.0] and rates[1][0] == 100.0 and rates[1][-1] == 50.0
    model = collect_report.latency_series(result)["model"]
    assert model[1][0] == pytest.approx(500.0) and model[1][-1] == pytest.approx(900.0)
    timeouts = collect_report.error_series(result)["timeout"]
    assert timeouts[1][:6] == [0.0] * 6 and timeouts[1][6:] == pytest.approx([0.3] * 6)


def test_collect_report_renders_offline_without_errors_or_sideways_scroll(
    tmp_path: Path,
) -> None:
    result = planted_result()
    saved = save(result, tmp_path / "collect.json")
    loaded = load_result(saved)
    assert isinstance(loaded, CollectResult)
    assert to_json(loaded) == to_json(result)  # the saved file is the whole truth
    page = collect_report.write(loaded, tmp_path)
    shot = render(page, tmp_path / "collect-report.png")
    assert shot.console_errors == []
    assert shot.failed_or_external_requests == []
    assert shot.page_width <= VIEWPORT[0]
    for expected in (
        "SIMULATED",
        "Drift warning at 90 s: throughput drifted",
        "Throughput over the run",
        "Latency by stage over the run",
        "Errors over time",
        "<script>alert(1)</script>",  # shown as text: escaped
        "a test",  # where the expectation came from
    ):
        assert expected in shot.text, expected
    assert shot.screenshot.stat().st_size > 50_000  # three plots


# -- a slowdown planted halfway warns in time; a healthy run never (must-show 2) -------------


@pytest.mark.alone  # a healthy run must match its sweep's prediction: beside another measuring
@pytest.mark.slow  # test a CI run's healthy collect ran 7% below it and the watch (rightly) warned
def test_planted_slowdown_warns_in_time_and_a_healthy_run_does_not(tmp_path: Path) -> None:
    """One seed of benchmarks/drift.py (the benchmark runs 20): a sweep's recommendation,
    then its own `autotune` line pasted with --expect and --fail-on drift: a collect whose
    simulated replica halves its speed 5 s in, one that stays, and one on another workload."""
    bench = subprocess.run(
        [sys.executable, "benchmarks/drift.py", "--seeds", "1", "--different", "1",
         "--keep", str(tmp_path), "--json", "--check"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    result = orjson.loads(bench.stdout)
    slowed, healthy, different = (
        next(r for r in result["runs"] if r["kind"] == kind)
        for kind in ("slowed", "healthy", "different")
    )
    assert slowed["warned"] and slowed["stage"] == "model", slowed
    assert 0 < slowed["windows_after_change"] <= 5, slowed
    assert slowed["exit"] == 3 and slowed["in_summary"], slowed  # --fail-on drift
    assert not healthy["warned"] and healthy["windows_compared"] >= 3, healthy
    assert healthy["exit"] == 0, healthy
    assert different["said_workload_differs"] and different["passed"], different
    assert "--synthetic 2000" in result["collect_line"], result["collect_line"]

    # The slowed run's report marks the warning; `autotune report DIR` rebuilds it.
    report = tmp_path / "slowed-0"
    page = report / "index.html"
    shot = render(page, tmp_path / "slowed-report.png")
    assert shot.console_errors == [] and shot.failed_or_external_requests == []
    assert shot.page_width <= VIEWPORT[0]
    assert "Drift warning at " in shot.text and "the model stage slowed most" in shot.text
    assert "find out why with: autotune diagnose " in shot.text
    page.unlink()
    again = autotune("report", str(report))
    assert again.returncode == 0, again.stderr
    assert "Drift warning at " in page.read_text()


def test_fail_on_drift_needs_an_expectation() -> None:
    result = autotune("collect", "--synthetic", "5", "--no-output", "--fail-on", "drift")
    assert result.returncode == 2 and "--expect" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
