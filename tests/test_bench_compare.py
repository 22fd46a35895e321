"""`autotune bench compare` on results built by hand: verdicts, exit codes, outputs.

No measuring here: each test writes results files whose samples it chose, so the verdict
each one calls for is known. The end-to-end tests (real probes) are in test_bench_run.py.
"""

from __future__ import annotations

import dataclasses
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
import pytest

from autotune.bench import (
    BaselineUnavailable,
    BenchResults,
    CaseResult,
    Metric,
    compare_files,
    load,
    outputs,
    save,
    write_baseline,
)
from autotune.bench.fingerprint import Fingerprint
from autotune.errors import UsageError
from tests.browser import render

SIM = Fingerprint(
    method="probe/1",
    workload="0123456789abcdef",
    model="sim/llama-3.1-8b",
    server="simulated",
    gpu="not used",
    driver="not used",
    autotune="0.1.0",
    host="ci-runner-1",
)
BASE = [100.0, 101.0, 99.0, 100.5, 99.5]


def case(
    samples: list[float],
    name: str = "sim",
    fingerprint: Fingerprint = SIM,
    settings: dict[str, object] | None = None,
    error: str | None = None,
) -> CaseResult:
    return CaseResult(
        name=name,
        kind="probe",
        threshold=0.05,
        settings=settings or {"parallelism": 16},
        fingerprint=None if error else fingerprint,
        metrics={} if error else {"rollouts_per_s": Metric("rollouts/s", tuple(samples))},
        details=(),
        warmup=1,
        wall_s=10.0,
        error=error,
    )


def write(path: Path, *cases: CaseResult, created_at: float | None = None) -> Path:
    results = BenchResults(
        suite="suite.yaml",
        created_at=created_at or time.time(),
        alpha=0.01,
        machine={"host": "ci-runner-1"},
        cases=cases,
    )
    return save(results, path)


def baseline(tmp_path: Path, *cases: CaseResult) -> Path:
    source = write(tmp_path / "baseline-source.json", *cases, created_at=1_000_000.0)
    path = tmp_path / "baseline.json"
    write_baseline(source, path, reason="test baseline")
    return path


def test_a_20_percent_fall_beyond_every_baseline_sample_is_a_regression(tmp_path: Path) -> None:
    base = baseline(tmp_path, case(BASE))
    now = write(tmp_path / "now.json", case([s * 0.8 for s in BASE]))
    comparison = compare_files([now], base)
    (verdict,) = comparison.verdicts
    assert verdict.verdict == "regression"
    assert verdict.ratio == pytest.approx(0.8)
    assert verdict.p_value == pytest.approx(2 / 252)
    assert verdict.interval is not None and verdict.interval[1] < 0.95
    assert comparison.exit_code == 1


def test_a_2_percent_fall_is_unchanged_even_when_significant(tmp_path: Path) -> None:
    base = baseline(tmp_path, case(BASE))
    now = write(tmp_path / "now.json", case([s * 0.98 - 1.5 for s in BASE]))
    (verdict,) = compare_files([now], base).verdicts
    assert verdict.p_value is not None and verdict.p_value < 0.01  # real, but small
    assert 0.95 < (verdict.ratio or 0) < 1
    assert verdict.verdict == "unchanged"
    assert "within ±5%" in verdict.reason


def test_a_large_fall_that_noise_explains_is_not_flagged(tmp_path: Path) -> None:
    base = baseline(tmp_path, case(BASE))
    now = write(tmp_path / "now.json", case([60.0, 85.0, 90.0, 99.8, 120.0]))
    (verdict,) = compare_files([now], base).verdicts
    assert (verdict.ratio or 1) < 0.95
    assert verdict.verdict == "unchanged"
    assert "not significantly" in verdict.reason


def test_an_improvement_is_reported_and_passes(tmp_path: Path) -> None:
    base = baseline(tmp_path, case(BASE))
    now = write(tmp_path / "now.json", case([s * 1.3 for s in BASE]))
    comparison = compare_files([now], base)
    assert comparison.verdicts[0].verdict == "improvement"
    assert "update the baseline" in comparison.verdicts[0].reason
    assert comparison.exit_code == 0


def test_a_baseline_from_other_hardware_is_not_compared(tmp_path: Path) -> None:
    vllm = dataclasses.replace(
        SIM, server="0.6.3", gpu="8 × NVIDIA H100 80GB HBM3", driver="550.54.15"
    )
    base = baseline(tmp_path, case([s * 2 for s in BASE], fingerprint=vllm))
    now = write(tmp_path / "now.json", case(BASE))
    comparison = compare_files([now], base)
    (verdict,) = comparison.verdicts
    assert verdict.verdict == "not comparable"
    assert verdict.ratio is None and verdict.p_value is None  # not compared at all
    assert "gpu: 8 × NVIDIA H100 80GB HBM3 → not used" in verdict.reason
    assert comparison.exit_code == 3

    # Comparing across a vLLM upgrade on purpose: name the fields to look past.
    across = compare_files([now], base, ignore=["server", "gpu", "driver"])
    assert across.verdicts[0].verdict == "regression"
    assert across.exit_code == 1


def test_host_and_autotune_version_are_recorded_but_do_not_decide(tmp_path: Path) -> None:
    elsewhere = dataclasses.replace(SIM, host="fresh-ci-machine-7", autotune="0.2.0")
    base = baseline(tmp_path, case(BASE))
    now = write(tmp_path / "now.json", case(BASE, fingerprint=elsewhere))
    comparison = compare_files([now], base)
    assert comparison.verdicts[0].verdict == "unchanged"
    assert comparison.fingerprints["sim"]["host"] == "fresh-ci-machine-7"


def test_a_changed_setting_is_compared_and_named(tmp_path: Path) -> None:
    base = baseline(tmp_path, case(BASE, settings={"parallelism": 32}))
    now = write(tmp_path / "now.json", case([s * 0.7 for s in BASE], settings={"parallelism": 8}))
    comparison = compare_files([now], base)
    assert comparison.verdicts[0].verdict == "regression"
    assert comparison.verdicts[0].settings_changed == ("parallelism: 32 → 8",)
    assert "parallelism: 32 → 8" in outputs.markdown(comparison)


def test_exit_codes_rank_regression_then_could_not_run_then_not_comparable(
    tmp_path: Path,
) -> None:
    base = baseline(tmp_path, case(BASE), case(BASE, name="other"), case(BASE, name="gone"))
    now = write(
        tmp_path / "now.json",
        case([s * 0.5 for s in BASE]),
        case([], name="other", error="cannot reach the model server at http://x/v1."),
        case(BASE, name="new-case"),
    )
    comparison = compare_files([now], base)
    verdicts = {(v.case, v.verdict) for v in comparison.verdicts}
    assert verdicts == {
        ("sim", "regression"),
        ("other", "could not run"),
        ("new-case", "not comparable"),
        ("gone", "not comparable"),
    }
    assert comparison.exit_code == 1
    without_regression = write(
        tmp_path / "later.json",
        case(BASE),
        case([], name="other", error="the server died."),
        case(BASE, name="gone"),
    )
    assert compare_files([without_regression], base).exit_code == 4
    only_new = write(tmp_path / "only-new.json", case(BASE), case(BASE, name="other"),
                     case(BASE, name="gone"), case(BASE, name="new-case"))  # fmt: skip
    assert compare_files([only_new], base).exit_code == 3


def test_a_missing_baseline_is_its_own_error(tmp_path: Path) -> None:
    now = write(tmp_path / "now.json", case(BASE))
    with pytest.raises(BaselineUnavailable, match="does not exist; make one on purpose"):
        compare_files([now], tmp_path / "nowhere.json")


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    base = baseline(tmp_path, case(BASE))
    now = write(tmp_path / "now.json", case(BASE))
    with pytest.raises(UsageError, match="--ignore-fingerprint 'host' is not a decisive field"):
        compare_files([now], base, ignore=["host"])
    with pytest.raises(UsageError, match="--threshold must be between 0 and 1"):
        compare_files([now], base, threshold=5)


def test_results_round_trip_and_a_baseline_is_never_overwritten_by_a_run(tmp_path: Path) -> None:
    path = write(tmp_path / "now.json", case(BASE))
    assert load(path).cases[0] == case(BASE)
    base = baseline(tmp_path, case(BASE))
    assert load(base).baseline is not None and load(base).baseline["reason"] == "test baseline"
    before = base.read_bytes()
    with pytest.raises(UsageError, match="is a baseline; write results elsewhere"):
        write(base, case([1.0] * 5))
    assert base.read_bytes() == before


def test_a_baseline_needs_every_case(tmp_path: Path) -> None:
    source = write(tmp_path / "now.json", case(BASE), case([], name="down", error="down."))
    with pytest.raises(UsageError, match=r"cases that could not run \(down\)"):
        write_baseline(source, tmp_path / "baseline.json", reason="x")
    assert not (tmp_path / "baseline.json").exists()


def test_a_damaged_results_file_is_one_sentence(tmp_path: Path) -> None:
    path = write(tmp_path / "now.json", case(BASE))
    data = orjson.loads(path.read_bytes())
    data["cases"][0]["metrics"]["rollouts_per_s"]["samples"][0] = -1
    path.write_bytes(orjson.dumps(data))
    with pytest.raises(UsageError, match="not a complete bench results file"):
        load(path)


# --- outputs --------------------------------------------------------------------------------


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A baseline with two cases, and a run where one regressed and one cannot be compared."""
    gpu = dataclasses.replace(SIM, server="0.6.3", gpu="1 × NVIDIA H100", driver="550")
    base = baseline(tmp_path, case(BASE), case(BASE, name="vllm", fingerprint=gpu))
    write(tmp_path / "now.json", case([s * 0.8 for s in BASE]), case(BASE, name="vllm"))
    return base


def test_junit_xml_has_a_testcase_per_case_and_metric_and_a_failure_per_regression(
    tmp_path: Path, mixed: Path
) -> None:
    comparison = compare_files([tmp_path / "now.json"], mixed)
    root = ET.fromstring(outputs.junit_xml(comparison))
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "1")
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    assert set(cases) == {("bench.sim", "rollouts_per_s"), ("bench.vllm", "rollouts_per_s")}
    failure = cases["bench.sim", "rollouts_per_s"].find("failure")
    assert failure is not None and failure.get("type") == "regression"
    assert "fell 20.0%" in (failure.get("message") or "")
    error = cases["bench.vllm", "rollouts_per_s"].find("error")
    assert error is not None and error.get("type") == "not-comparable"


def test_markdown_shows_the_ratio_and_p_value_of_each_case(tmp_path: Path, mixed: Path) -> None:
    text = outputs.markdown(compare_files([tmp_path / "now.json"], mixed))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| case"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "case", "metric", "baseline", "now", "ratio", "99% interval", "p-value", "verdict",
    ]  # fmt: skip
    sim = next(line for line in lines if line.startswith("| sim |"))
    assert "| 0.800 |" in sim and "| 0.0079 |" in sim and "regression" in sim
    vllm = next(line for line in lines if line.startswith("| vllm |"))
    assert "not comparable" in vllm
    assert lines[0] == "## autotune bench: 1 regression, 1 not comparable (exit 1)"


def test_the_markdown_is_appended_to_the_github_step_summary(
    tmp_path: Path, mixed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    table = outputs.markdown(compare_files([tmp_path / "now.json"], mixed))
    assert outputs.append_step_summary(table) == summary
    assert summary.read_text() == "earlier step\n" + table + "\n"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    assert outputs.append_step_summary(table) is None


def test_the_html_report_shows_the_history_of_runs(tmp_path: Path) -> None:
    base = baseline(tmp_path, case(BASE))
    runs = [
        write(tmp_path / f"run{i}.json", case([s * factor for s in BASE]), created_at=2e6 + i)
        for i, factor in enumerate((1.0, 0.99, 0.8))
    ]
    comparison = compare_files(list(reversed(runs)), base)  # any order: sorted by date
    assert comparison.results == str(runs[-1]) and len(comparison.history) == 3
    page = outputs.write_html(comparison, tmp_path / "report")
    shot = render(page, tmp_path / "report.png")
    assert shot.console_errors == []
    assert shot.failed_or_external_requests == []
    assert "autotune bench: 1 regression (exit 1)" in shot.text
    assert "History" in shot.text and "SIMULATED" in shot.text
    assert page.read_text().count("data:image/png;base64,") == 2  # samples + history


def test_an_ab_judges_its_pairs_where_the_samples_alone_could_not_tell(tmp_path: Path) -> None:
    """The machine slows ×2 across an A/B and back; each pair's candidate is 10% slower
    than its baseline. Paired (`bench ab`): a regression, the ratio its pairs' ×0.90 and
    its interval at the corrected level. The same samples unpaired: unchanged."""
    from autotune.bench.compare import AbRecord, compare_results

    drift = [1.0, 0.8, 0.65, 0.55, 0.5, 0.6, 0.9]
    old = [100 * d for d in drift]
    new = [90 * d * (1 + 0.002 * (-1) ** i) for i, d in enumerate(drift)]
    results = load(write(tmp_path / "new.json", case(new)))
    base = load(write(tmp_path / "old.json", case(old)))
    record = AbRecord("old", "new", len(drift), 8, "", {}, 1.0)
    paired = compare_results(results, base, results_name="n", baseline_name="o", ab=record)
    (verdict,) = paired.verdicts
    assert verdict.verdict == "regression" and verdict.p_value is not None
    assert verdict.ratio == pytest.approx(0.9, abs=0.002) and verdict.p_value < 0.01 / 8
    assert verdict.interval is not None and 0.88 < verdict.interval[0] < verdict.interval[1] < 0.92
    assert paired.confidence == pytest.approx(1 - 0.01 / 8)
    assert "paired two-sided t test" in outputs.markdown(paired)
    unpaired = compare_results(results, base, results_name="n", baseline_name="o")
    assert [v.verdict for v in unpaired.verdicts] == ["unchanged"]
