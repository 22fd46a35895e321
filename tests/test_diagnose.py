"""`autotune diagnose` on the simulated stack set up five ways, each calling for its verdict.

The verdicts must come from what the probes measured: each test only configures the
simulator (or the verifier) the way a real deployment could be, and reads the verdict.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.collector.collect_job import run_collect
from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.diagnose.checks import VERDICTS
from autotune.diagnose.classify import classify
from autotune.diagnose.diagnose_job import DiagnoseConfig, diagnose
from autotune.probe import ProbeSettings
from autotune.probe.virtual import VirtualSimLauncher
from autotune.processes.event_loop import run_async
from autotune.results.diagnosis import DiagnoseResult, Evidence, Thresholds
from autotune.results.probes import ProbeResult
from autotune.results.saved import load_result
from tests.browser import drawn, render
from tests.helpers import autotune, one_sentence_error

# Short probes keep the suite quick; the rules compare ratios, not absolute figures.
FAST = ("--min-s", "1.5", "--max-s", "8", "--synthetic", "400", "--output-tokens", "128,16")


def run_diagnose(tmp_path: Path, *args: str) -> DiagnoseResult:
    """The result `diagnose --output-dir tmp_path/report` saved (beside its index.html)."""
    report = tmp_path / "report"
    result = autotune("diagnose", *FAST, *args, "--output-dir", str(report), timeout=180)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    saved = load_result(report / "diagnose.json")
    assert isinstance(saved, DiagnoseResult)
    return saved


def _evidence(result: DiagnoseResult) -> dict[str, Evidence]:
    return {e.name: e for e in result.verdict.evidence}


@pytest.mark.slow
@pytest.mark.measures
def test_ample_capacity_is_parallelism_bound(tmp_path: Path) -> None:
    result = run_diagnose(tmp_path, "--verifier", "synthetic")
    verdict = result.verdict
    assert verdict.verdict == "parallelism-bound", verdict.evidence
    assert verdict.speedup >= 2.0
    low, high = result.probes
    assert (low.parallelism, high.parallelism) == (5, 20)
    for probe in result.probes:
        assert probe.error_rate == 0
        assert probe.rollouts_per_s_ci[0] <= probe.rollouts_per_s <= probe.rollouts_per_s_ci[1]
        assert probe.token_check is not None and not probe.token_check["mismatch"]
        for stage in ("model", "verify", "total"):
            assert probe.latency_s[stage].p50 is not None

    # The report renders in headless Chromium, offline, with the verdict on the page.
    page = tmp_path / "report" / "index.html"
    phases = {
        phase: drawn(f'[id^="timeline-"][id*="-{phase}-"]')
        for phase in ("warm-up", "measured", "drain")
    }
    shot = render(page, tmp_path / "report.png", checks=phases)
    assert shot.console_errors == []
    assert shot.failed_or_external_requests == []
    assert "Verdict: parallelism-bound" in shot.text
    assert "SIMULATED" in shot.text and "time scale 0.05" in shot.text
    assert shot.screenshot.stat().st_size > 20_000
    assert shot.checks == {"warm-up": 4, "measured": 4, "drain": 4}  # one of each a block

    # `autotune report DIR` renders it again from the saved JSON alone.
    page.unlink()
    again = autotune("report", str(tmp_path / "report"))
    assert again.returncode == 0, again.stderr
    assert "Verdict: parallelism-bound" in page.read_text()


@pytest.mark.slow
@pytest.mark.measures
def test_max_num_seqs_below_the_low_probe_is_model_bound(tmp_path: Path) -> None:
    result = run_diagnose(tmp_path, "--sim-arg=--max-num-seqs=2", "--verifier", "synthetic")
    assert result.verdict.verdict == "model-bound", result.verdict.evidence
    assert result.verdict.speedup < 1.2
    evidence = _evidence(result)
    assert evidence["server requests waiting (mean)"].met
    assert evidence["model latency growth ÷ Little's-law prediction"].met
    assert "max_num_seqs" in result.verdict.next_step


@pytest.mark.slow
@pytest.mark.measures
def test_cpu_heavy_verifier_is_verifier_bound(tmp_path: Path) -> None:
    result = run_diagnose(
        tmp_path, "--verifier", "synthetic", "--verifier-cost-ms", "40", "--verifier-workers", "1"
    )
    assert result.verdict.verdict == "verifier-bound", result.verdict.evidence
    evidence = _evidence(result)
    assert evidence["verifier workers busy (fraction)"].met
    assert "add verifier workers" in result.verdict.next_step


@pytest.mark.slow
@pytest.mark.measures
def test_endpoint_answering_429_is_rate_limited(tmp_path: Path) -> None:
    result = run_diagnose(tmp_path, "--sim-arg=--max-request-rate=40", "--verifier", "synthetic")
    assert result.verdict.verdict == "rate-limited", result.verdict.evidence
    high = result.probes[1]
    assert high.rate_limited_responses > 0 and high.retry_after_seen > 0


@pytest.mark.slow
@pytest.mark.measures
def test_server_dying_in_the_high_probe_is_unstable(tmp_path: Path) -> None:
    result = run_diagnose(
        tmp_path,
        "--sim-arg=--crash-above-concurrency=12",
        "--verifier",
        "synthetic",
        "--max-retries",
        "1",
    )
    assert result.verdict.verdict == "unstable", result.verdict.evidence
    low, high = result.probes
    assert low.error_rate == 0
    assert high.stop_reason == "server died" or high.error_rate > 0.05
    assert "lower parallelism" in result.verdict.next_step


def true_speedup(sim_args: tuple[str, ...], low: int, high: int, output: tuple[int, int]) -> float:
    """The simulator's own curve: its engine in virtual time (no client, no sleeping)
    measured to ±0.2%, at the probes' parallelisms, with the probes' output lengths."""
    settings = ProbeSettings(1, warmup_s=0.0, min_s=400.0, max_s=3000.0, target_halfwidth=0.002)

    async def measure() -> float:
        launcher = VirtualSimLauncher(sim_args, settings, (256, 64), output)
        async with launcher.running({}) as probe:
            slow = await probe.measure(low)
            fast = await probe.measure(high)
        return fast.rollouts_per_s / slow.rollouts_per_s

    return asyncio.run(measure())


def diagnose_in_process(
    sim_args: tuple[str, ...], thresholds: Thresholds, min_s: float = 3.0
) -> DiagnoseResult:
    """`autotune diagnose --synthetic 400 --output-tokens 128,16 --max-s 8` on the embedded
    simulator with `sim_args`, judged by `thresholds` (which the command line cannot set),
    its result not written (no report to draw)."""
    collect = CollectConfig(
        target=TargetConfig(sim_args=sim_args),
        synthetic=SyntheticWorkload(num_tasks=400, output_tokens_mean=128, output_tokens_std=16),
        verifier="synthetic",
    )
    config = DiagnoseConfig(collect, low=5, high=20, min_s=min_s, max_s=8.0, thresholds=thresholds)
    return run_async(diagnose(config))


@pytest.mark.slow
@pytest.mark.measures
@pytest.mark.alone  # beside another measuring test its low probe read slow (x2.088 against x1.957)
def test_a_speedup_exactly_at_the_threshold_is_inconclusive_and_one_clear_of_it_is_not() -> None:
    """The threshold set to the simulator's true speedup (×1.97 with 10 sequences a
    batch for 4× the parallelism): `inconclusive` between the two verdicts, its interval
    around the truth, not one verdict or the other by the luck of the noise. With 256
    sequences the true speedup is ×3.6: parallelism-bound, its interval clear of ×2."""
    # Time scale 0.2: the client's own cost per rollout, stretched 1/scale times in
    # simulated time, stays small beside the simulated model's latency.
    on_threshold = ("--time-scale", "0.2", "--max-num-seqs", "10")
    truth = true_speedup(on_threshold, 5, 20, (128, 16))
    at = diagnose_in_process(on_threshold, Thresholds(scaling_fraction=(truth - 1) / 3))
    verdict = at.verdict
    assert verdict.speedup_interval is not None
    low, high = verdict.speedup_interval
    print(
        f"at the threshold ×{truth:.3f}: {verdict.verdict}, "
        f"×{verdict.speedup:.3f} ({low:.3f}–{high:.3f})"
    )
    assert verdict.verdict == "inconclusive", verdict.confidence
    assert verdict.between == ["parallelism-bound", "model-bound"]
    assert low <= truth <= high and verdict.clear_of_threshold is False
    assert at.target.time_scale == 0.2

    clear = ("--time-scale", "0.2")
    truth = true_speedup(clear, 5, 20, (128, 16))
    scaled = diagnose_in_process(clear, Thresholds()).verdict
    assert scaled.speedup_interval is not None
    low, high = scaled.speedup_interval
    print(
        f"clear of it, true ×{truth:.3f}: {scaled.verdict}, "
        f"×{scaled.speedup:.3f} ({low:.3f}–{high:.3f})"
    )
    # Its interval is clear of the zone, as the truth is; whether a 95% interval covers the
    # truth is a rate over many runs (tests/test_stats.py), which one run cannot judge.
    zone_top = Thresholds().undecided_zone(4)[1]
    assert scaled.verdict == "parallelism-bound" and scaled.clear_of_threshold
    assert low > zone_top and truth > zone_top


@pytest.mark.slow
@pytest.mark.measures
@pytest.mark.parametrize(
    ("sim_args", "expected"),
    [((), "parallelism-bound"), (("--sim-arg=--max-num-seqs=2",), "model-bound")],
)
def test_rollouts_too_long_to_time_by_completions_are_timed_in_tokens(
    tmp_path: Path, sim_args: tuple[str, ...], expected: str
) -> None:
    """Rollouts of 8,000 output tokens (about 60 simulated seconds each, longer when
    queued) against probes capped at 6 s of wall clock (120 simulated): a slot finishes
    one or two in the cap, too few for a window of completions. The probes time output
    tokens instead, and each setup gets its verdict, sure of it."""
    long = ("--max-s", "6", "--output-tokens", "8000,200", "--synthetic", "200")
    context = "--sim-arg=--max-model-len=16384"  # the prompt and 8,000 tokens: past 8,192
    result = run_diagnose(tmp_path, *long, context, *sim_args, "--verifier", "synthetic")
    verdict = result.verdict
    assert verdict.verdict == expected and verdict.clear_of_threshold, verdict.confidence
    for probe in result.probes:
        # Simulated seconds a rollout of 8,000 tokens takes at the rate its slot made them
        # (queueing included); one that ended inside the window says the same.
        assert 8000 / (probe.output_tokens_per_s / probe.parallelism) > 50
        p50 = probe.latency_s["total"].p50
        assert p50 is None or p50 > 50  # none may end inside a window of under two
        assert probe.stop_reason.endswith("(in tokens)"), probe.stop_reason
        assert probe.measured_s <= 6 / 0.05  # the cap, in simulated seconds
        assert all(block.output_tokens_per_s for block in probe.blocks)
        assert probe.rollouts_per_s_ci[0] <= probe.rollouts_per_s <= probe.rollouts_per_s_ci[1]


def first_blocks_alone(probe: ProbeResult) -> ProbeResult:
    """The probe as the old order (one low probe, then one high) measured it: its first
    block and nothing after."""
    block = min(probe.blocks, key=lambda b: b.at)
    return replace(
        probe,
        rollouts_per_s=block.rollouts_per_s,
        rollouts_per_s_ci=block.rollouts_per_s_ci,
        batches=block.batches,
        blocks=[],
    )


@pytest.mark.slow
@pytest.mark.measures
def test_a_load_change_as_the_high_probe_starts_never_decides_a_wrong_verdict() -> None:
    """The simulator (ample capacity: parallelism-bound) slows every step ×3 early in the
    first high block, timed from a run without the change, as when another job lands on
    the machine. The old probe order (the first low block, then the first high one)
    calls that model-bound; the alternating blocks say parallelism-bound, or inconclusive,
    naming the load change either way (benchmarks/load_change.py plants it at three
    places, on two servers)."""
    baseline = diagnose_in_process((), Thresholds())
    print(f"without the change: {baseline.verdict.verdict} ×{baseline.verdict.speedup:.2f}")
    # A host whose own load moved meanwhile (a busy CI machine) makes it inconclusive, and
    # it says so; it times the planted change all the same.
    assert baseline.verdict.verdict == "parallelism-bound" or (
        "the load changed during the probes" in baseline.verdict.confidence
    ), baseline.verdict.confidence
    low, high = baseline.probes
    first_low_run = low.phases[2][2]  # its warm-up, window and drain (simulated seconds)
    high_warm_up = high.phases[0][2] - high.phases[0][1]
    change_at = (first_low_run + high_warm_up / 2) * 0.05  # the sim's real seconds
    old_order = []
    for shift in (0.0, 0.3):
        sim_args = ("--slow-down-after", f"{change_at + shift:.3f}", "--slow-down-factor", "3")
        result = diagnose_in_process(sim_args, Thresholds())
        verdict = result.verdict
        old = classify(*(first_blocks_alone(p) for p in result.probes))
        old_order.append(old.verdict)
        print(
            f"change at {change_at + shift:.2f} s: {verdict.verdict} ×{verdict.speedup:.2f} "
            f"{verdict.speedup_interval}; the old order: {old.verdict} ×{old.speedup:.2f}"
        )
        assert verdict.verdict in ("parallelism-bound", "inconclusive"), verdict.confidence
        assert "the load changed during the probes" in verdict.confidence
    assert "model-bound" in old_order  # the change landed where the old order is fooled


# Three setups of the simulator and the one verdict each must give, every time. The third
# sits on the threshold: 10 sequences a batch give a true speedup of ×1.96 for 4× the
# parallelism, within the 3% margin of ×2.00 (the test checks that against the engine).
# It runs 2× faster than real time, not the default 20×: the client's own cost a rollout
# (HTTP, streaming, verifier) is real time, which the conversion to simulated time
# multiplies by the acceleration, and a constant cost a rollout raises the speedup
# (it weighs more on the low probe's shorter latencies). At 20× this read ×2.03–2.05 on a
# quiet machine, ×2.09–2.10 beside two CPU hogs and up to ×2.38 on a busy CI host: the
# host, not the server, deciding the verdict. At 2× beside the same two hogs: ×1.97–1.97.
REPEATED = {
    "parallelism-bound": (),
    "model-bound": ("--max-num-seqs=2",),
    "inconclusive": ("--max-num-seqs=10", "--time-scale=0.5"),
}


@pytest.mark.slow
@pytest.mark.measures
@pytest.mark.parametrize("expected", list(REPEATED))
def test_five_diagnoses_of_one_setup_give_one_verdict(expected: str) -> None:
    """`autotune diagnose` FAST, five times, in this process (the command line's own path
    is the other tests')."""
    if expected == "inconclusive":
        truth = true_speedup(("--max-num-seqs", "10"), 5, 20, (128, 16))
        low, high = Thresholds().undecided_zone(4)
        assert low < truth < high, truth
    results = [diagnose_in_process(REPEATED[expected], Thresholds(), min_s=1.5) for _ in range(5)]
    for result in results:
        verdict, (low_probe, high_probe) = result.verdict, result.probes
        assert verdict.speedup_interval is not None
        low, high = verdict.speedup_interval
        high = float("inf") if high is None else high  # saved JSON has no infinity
        print(
            f"{expected}: {verdict.verdict} ×{verdict.speedup:.3f} ({low:.3f}–{high:.3f}), "
            f"stops {low_probe.stop_reason}/{high_probe.stop_reason}"
        )
    assert [r.verdict.verdict for r in results] == [expected] * 5


@pytest.mark.slow
@pytest.mark.alone  # a 20x-accelerated diagnose against a real-time collect: beside another
# measuring test a CI run's accelerated client fell 10% behind (9.35 against 10.39 rollouts/s)
def test_diagnose_reports_what_collect_measures_on_the_same_simulator(tmp_path: Path) -> None:
    """`autotune diagnose` with no target runs the simulator 20× faster than real time and
    converts back: its probe at parallelism 20 agrees with `autotune collect
    --parallelism 20` on the same simulator in real time, and it says its time scale."""
    out = tmp_path / "diagnose.json"
    started = time.monotonic()
    result = autotune("diagnose", "--output-dir", str(tmp_path), timeout=120)
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "time scale 0.05 (20× faster than real time)" in result.stdout
    diagnosis = load_result(out)
    assert isinstance(diagnosis, DiagnoseResult) and diagnosis.target.time_scale == 0.05
    high = diagnosis.probes[1]
    summary = run_collect(CollectConfig(parallelism=20, limit=300, verifier="synthetic"))
    figures = {
        "rollouts/s": (high.rollouts_per_s, summary.rollouts_per_s),
        "output tokens/s": (high.output_tokens_per_s, summary.output_tokens_per_s),
        "model p50 s": (high.latency_s["model"].p50, summary.latency_s["model"].p50),
    }
    print(f"diagnose {wall:.1f} s wall;", figures)
    for name, (diagnosed, collected) in figures.items():
        assert diagnosed is not None and collected is not None
        assert abs(diagnosed - collected) <= 0.10 * collected, name


def test_no_task_could_run_is_one_sentence(tmp_path: Path) -> None:
    verifier = tmp_path / "always_fails.py"
    verifier.write_text("def score(row):\n    raise ValueError('broken verifier')\n")
    result = autotune(
        "diagnose", *FAST, "--max-s", "3", "--verifier", f"{verifier}:score", timeout=120
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "no rollout completed at parallelism 5" in result.stderr


@pytest.mark.parametrize("flags", [("--low", "20", "--high", "5")])
def test_bad_probe_flags(flags: tuple[str, ...]) -> None:
    result = autotune("diagnose", *flags)
    assert result.returncode == 2
    assert "--low 20 must be at least 1 and below --high 5" in result.stderr


def test_a_verdict_named_in_fail_on_exits_3_after_saving_the_result(tmp_path: Path) -> None:
    out = tmp_path / "diagnose.json"
    every = ",".join(VERDICTS)  # so whatever this machine measures, the gate fails
    result = autotune(
        "diagnose", *FAST, "--max-s", "3", "--fail-on", every, "--output-dir", str(tmp_path),
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    saved = load_result(out)
    assert isinstance(saved, DiagnoseResult)
    line = one_sentence_error(result)
    assert f"the verdict is {saved.verdict.verdict}, which --fail-on " in line
    assert saved.verdict.verdict in result.stdout  # the summary came first
