"""`autotune diagnose` on the simulated stack set up five ways, each calling for its verdict.

The verdicts must come from what the probes measured: each test only configures the
simulator (or the verifier) the way a real deployment could be, and reads the verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.classify import VERDICTS
from autotune.results import DiagnoseResult, Evidence, load_result
from tests.browser import render
from tests.helpers import autotune, one_sentence_error

# Short probes keep the suite quick; the rules compare ratios, not absolute figures.
FAST = ("--min-s", "1.5", "--max-s", "8", "--synthetic", "400", "--output-tokens", "128,16")


def run_diagnose(tmp_path: Path, *args: str, report: bool = False) -> DiagnoseResult:
    out = tmp_path / "diagnose.json"
    extra = ["--report", str(tmp_path / "report")] if report else []
    result = autotune("diagnose", *FAST, *args, "--json", str(out), *extra, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    saved = load_result(out)
    assert isinstance(saved, DiagnoseResult)
    return saved


def _evidence(result: DiagnoseResult) -> dict[str, Evidence]:
    return {e.name: e for e in result.verdict.evidence}


@pytest.mark.slow
def test_ample_capacity_is_parallelism_bound(tmp_path: Path) -> None:
    result = run_diagnose(tmp_path, "--verifier", "synthetic", report=True)
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
    shot = render(page, tmp_path / "report.png")
    assert shot.console_errors == []
    assert shot.failed_or_external_requests == []
    assert "Verdict: parallelism-bound" in shot.text
    assert "SIMULATED" in shot.text
    assert shot.screenshot.stat().st_size > 20_000

    # `autotune report DIR` renders it again from the saved JSON alone.
    page.unlink()
    again = autotune("report", str(tmp_path / "report"))
    assert again.returncode == 0, again.stderr
    assert "Verdict: parallelism-bound" in page.read_text()


@pytest.mark.slow
def test_max_num_seqs_below_the_low_probe_is_model_bound(tmp_path: Path) -> None:
    result = run_diagnose(tmp_path, "--sim-arg=--max-num-seqs=2", "--verifier", "synthetic")
    assert result.verdict.verdict == "model-bound", result.verdict.evidence
    assert result.verdict.speedup < 1.2
    evidence = _evidence(result)
    assert evidence["server requests waiting (mean)"].met
    assert evidence["model latency growth ÷ Little's-law prediction"].met
    assert "max_num_seqs" in result.verdict.next_step


@pytest.mark.slow
def test_cpu_heavy_verifier_is_verifier_bound(tmp_path: Path) -> None:
    result = run_diagnose(
        tmp_path, "--verifier", "synthetic", "--verifier-cost-ms", "40", "--verifier-workers", "1"
    )
    assert result.verdict.verdict == "verifier-bound", result.verdict.evidence
    evidence = _evidence(result)
    assert evidence["verifier workers busy (fraction)"].met
    assert "add verifier workers" in result.verdict.next_step


@pytest.mark.slow
def test_endpoint_answering_429_is_rate_limited(tmp_path: Path) -> None:
    result = run_diagnose(tmp_path, "--sim-arg=--max-request-rate=40", "--verifier", "synthetic")
    assert result.verdict.verdict == "rate-limited", result.verdict.evidence
    high = result.probes[1]
    assert high.rate_limited_responses > 0 and high.retry_after_seen > 0


@pytest.mark.slow
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


@pytest.mark.slow
def test_five_diagnoses_agree(tmp_path: Path) -> None:
    verdicts = [
        run_diagnose(
            tmp_path / str(i), "--sim-arg=--max-num-seqs=2", "--verifier", "synthetic"
        ).verdict.verdict
        for i in range(5)
    ]
    assert verdicts == ["model-bound"] * 5


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
        "diagnose", *FAST, "--max-s", "3", "--fail-on", every, "--json", str(out), timeout=120
    )
    assert result.returncode == 3, result.stderr
    saved = load_result(out)
    assert isinstance(saved, DiagnoseResult)
    line = one_sentence_error(result)
    assert f"the verdict is {saved.verdict.verdict}, which --fail-on " in line
    assert saved.verdict.verdict in result.stdout  # the summary came first
