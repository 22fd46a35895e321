"""The HTML report toolkit: pure builders unit-tested, whole pages rendered in Chromium.

The browser tests check what a reviewer relies on: the page shows what it should, logs no
error, and loads nothing from the network. Negative controls prove the harness can fail.
"""

from __future__ import annotations

import base64
import re
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.diagnose.classify import classify
from autotune.knee import summarise_curve
from autotune.report import diagnose_report, sweep_report
from autotune.report import html as h
from autotune.report.diagnose_report import PROBE_COLUMNS
from autotune.report.plots import bar_chart_stacked, horizontal_bars, time_series
from autotune.report.terminal import diagnose_text
from autotune.results.diagnosis import (
    DiagnoseResult,
    DiagnoseSettings,
    DiagnoseTarget,
    DiagnoseWorkload,
    Evidence,
    Verdict,
)
from autotune.results.probes import CurvePoint, ProbeResult
from autotune.results.stages import STAGES, StageLatency
from autotune.results.trials import SweepResult, TrialRecord
from autotune.sweep.objectives import objective_for
from autotune.sweep.recommend import recommendation
from tests.browser import VIEWPORT, RenderResult, drawn, render

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOSTILE = "<script>alert(\"pwned\")</script> & 'quoted'"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first chunk, right after the signature)."""
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# --- pure builders -------------------------------------------------------------------------


def test_table_escapes_every_cell_column_and_caption() -> None:
    out = h.table([HOSTILE, "n"], [[HOSTILE, 1], ["ok", 2]], caption=HOSTILE)
    assert "<script>" not in out
    assert out.count("&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt; &amp; &#x27;") == 3


def test_table_formats_numbers_and_right_aligns_numeric_columns() -> None:
    out = h.table(["name", "rate"], [["a", 1234567], ["b", 0.123456], ["c", None]])
    assert "<td>a</td>" in out
    assert '<td class="num">1,234,567</td>' in out
    assert '<td class="num">0.1235</td>' in out
    assert '<th class="num">rate</th>' in out
    assert "<td>—</td>" in out


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (12345.6, "12,346"),
        (12.3456, "12.35"),
        (float("nan"), "—"),
        (float("inf"), "∞"),
        (True, "yes"),
        (-42, "-42"),
        ("text", "text"),
    ],
)
def test_format_value(value: object, text: str) -> None:
    assert h.format_value(value) == text


def test_table_rejects_a_ragged_row() -> None:
    with pytest.raises(ValueError, match="row 1 has 1 cells"):
        h.table(["a", "b"], [[1, 2], [3]])


def test_image_is_an_inline_data_uri_with_escaped_alt() -> None:
    png = PNG_SIGNATURE + b"rest of the file"
    out = h.image(png, alt='a "quoted" <alt>')
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', out)
    assert match is not None
    assert base64.b64decode(match.group(1)) == png
    assert 'alt="a &quot;quoted&quot; &lt;alt&gt;"' in out


def test_image_rejects_bytes_that_are_not_png() -> None:
    with pytest.raises(ValueError, match="PNG"):
        h.image(b"GIF89a...", alt="x")


def test_callout_escapes_and_checks_its_kind() -> None:
    assert h.callout("<b>", "warning") == '<div class="callout warning">&lt;b&gt;</div>'
    with pytest.raises(ValueError, match="callout kind"):
        h.callout("x", "danger")  # type: ignore[arg-type]


def test_page_is_self_contained_and_escapes_title_and_banner(tmp_path: Path) -> None:
    doc = h.page(HOSTILE, [h.section(HOSTILE, h.paragraph(HOSTILE))], banner=HOSTILE)
    assert f'<meta http-equiv="Content-Security-Policy" content="{h.CSP}">' in doc
    assert "<script" not in doc
    assert not re.search(r'(?:src|href)="(?!data:)', doc)  # nothing to fetch
    path = h.write_report(tmp_path / "out", doc)
    assert path == tmp_path / "out" / "index.html"
    assert path.read_text(encoding="utf-8") == doc
    assert [p.name for p in path.parent.iterdir()] == ["index.html"]


def test_plots_return_png_and_check_their_input() -> None:
    bars = bar_chart_stacked(["p1", "p2"], {"model": [1.0, 2.0], "verify": [0.5, 0.2]}, "s", "t")
    line = time_series({"kv": ([0.0, 1.0, 2.0], [0.1, 0.5, 0.4])}, "fraction", "t")
    for png in (bars, line):
        width, height = png_size(png)
        assert 400 < width < 2000 and 200 < height < 1000
    with pytest.raises(ValueError, match="series 'model' has 1 values for 2 categories"):
        bar_chart_stacked(["p1", "p2"], {"model": [1.0]}, "s", "t")
    with pytest.raises(ValueError, match="2 x values and 1 y values"):
        time_series({"kv": ([0.0, 1.0], [0.1])}, "y", "t")


def test_plots_from_the_simulator_carry_its_mark() -> None:
    """The PNG plots too: the mark is drawn into the figure, not beside it."""
    stages = (["p1", "p2"], {"model": [1.0, 2.0]}, "ms", "t")
    assert bar_chart_stacked(*stages, simulated=True) != bar_chart_stacked(*stages)
    line = ({"kv": ([0.0, 1.0], [0.1, 0.5])}, "fraction", "t")
    assert time_series(*line, simulated=True) != time_series(*line)
    assert horizontal_bars({"a": 1.0}, "x", "t", simulated=True) != horizontal_bars(
        {"a": 1.0}, "x", "t"
    )


def _diagnosis() -> DiagnoseResult:
    """A small diagnosis built by hand: two probes, one piece of evidence."""
    probes = [
        ProbeResult(
            parallelism=n,
            rollouts_per_s=rate,
            rollouts_per_s_ci=(rate - 1, rate + 1),
            output_tokens_per_s=rate * 64,
            error_rate=0.0,
            completed=100,
            failed=0,
            measured_s=4.0,
            warmup_s=0.5,
            stop_reason="converged",
        )
        for n, rate in ((2, 10.0), (8, 30.0))
    ]
    evidence = Evidence("speedup", 3.0, 3.0, ">=", True, "it scaled")
    return DiagnoseResult(
        created_at=0.0,
        verdict=Verdict("parallelism-bound", False, 3.0, 4.0, [evidence], "raise it"),
        probes=probes,
        target=DiagnoseTarget(base_url="http://h/v1", model="m", simulated=True),
        workload=DiagnoseWorkload(input=None, tasks=100),
        settings=DiagnoseSettings(low=2, high=8, min_s=1.0, max_s=5.0, target_halfwidth=0.05),
        machine={"autotune": "test"},
    )


def test_probe_table_is_one_definition_for_the_terminal_and_the_page() -> None:
    result = _diagnosis()
    text = diagnose_text(result)
    page = diagnose_report.render(result)
    shown = [c.header for c in PROBE_COLUMNS if c.terminal]
    hidden = [c.header for c in PROBE_COLUMNS if not c.terminal]
    assert shown and hidden
    header = next(line for line in text.splitlines() if line.startswith("parallelism"))
    assert header.split() == " ".join(shown).split()
    assert not any(name in text for name in hidden)
    for column in PROBE_COLUMNS:  # the page shows every column, the terminal's among them
        assert re.search(rf"<th[^>]*>{re.escape(h.format_value(column.header))}</th>", page)
    assert "9–11" in text and "9–11" in page  # the same cell in both
    assert "speedup = 3 (threshold >= 3: yes) — it scaled" in text


def test_each_probes_gpu_utilisation_names_its_window_and_readings() -> None:
    """With a GPU the summary prints each probe's utilisation with the window it covers
    and how many NVML readings made it (the high probe's is what a verdict cites), and the
    page's probe table has both; without one, the summary has no such lines."""
    result = _diagnosis()
    assert "GPU utilisation" not in diagnose_text(result)
    probes = [
        replace(p, telemetry={"gpu/gpu_util_pct_mean": {"mean": m, "max": 99.0, "samples": n}})
        for p, m, n in zip(result.probes, (45.7, 72.1), (42.0, 25.0), strict=True)
    ]
    text = diagnose_text(replace(result, probes=probes))
    assert (
        "GPU utilisation:\n"
        "  45.7%, mean of 42 NVML readings over the measured 4.0 s of the probe at "
        "parallelism 2 (1 block)\n"
        "  72.1%, mean of 25 NVML readings over the measured 4.0 s of the probe at "
        "parallelism 8 (1 block)\n"
    ) in text
    assert re.search(
        r"<td[^>]*>72\.1</td>\s*<td[^>]*>25</td>",
        diagnose_report.render(replace(result, probes=probes)),
    )


def test_importing_the_toolkit_does_not_import_matplotlib() -> None:
    code = (
        "import sys, autotune.report.html, autotune.report.plots; "
        "sys.exit('matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- rendered in Chromium ------------------------------------------------------------------


def full_page() -> str:
    """A page using every element, with user text that would run if it were not escaped."""
    stages = bar_chart_stacked(
        ["p=4", "p=16", "p=64"],
        {"queued": [0.01, 0.05, 0.9], "model": [1.2, 1.4, 2.1], "verify": [0.3, 0.3, 0.35]},
        ylabel="seconds per rollout",
        title="Latency by stage",
    )
    kv = time_series(
        {
            "kv cache": ([0, 1, 2, 3, 4], [0.1, 0.4, 0.7, 0.9, 0.95]),
            "running/64": ([0, 1, 2, 3, 4], [0.2, 0.6, 0.9, 1.0, 1.0]),
        },
        ylabel="fraction",
        title="Server telemetry",
    )
    return h.page(
        "Diagnosis: model-bound",
        [
            h.section(
                "Verdict",
                h.callout("Model-bound: the server is saturated at parallelism 16.", "verdict"),
                h.callout("Only 3 probes ran; intervals are wide.", "warning"),
                h.callout("Figures from the simulated server.", "info"),
            ),
            h.section(
                "Probes",
                h.table(
                    ["task", "parallelism", "rollouts/s", "p95 latency (s)"],
                    [
                        [HOSTILE, 4, 3.52, 1.61],
                        ["math", 16, 1234.5, 2.003],
                        ["code", 64, 1250.25, 3.5],
                    ],
                    caption="One row per probe",
                ),
                h.image(stages, alt="Stacked latency by stage"),
                h.image(kv, alt="Telemetry over time"),
            ),
            h.section(
                "Run",
                h.definition_list([("model", "tiny-llama"), ("machine", "2 cores, no GPU")]),
                h.paragraph("Rebuilt from results.json."),
            ),
        ],
        banner="SIMULATED — these figures come from autotune's simulated server",
        subtitle="results.json · schema 1",
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> RenderResult:
    out = tmp_path_factory.mktemp("report")
    path = h.write_report(out, full_page())
    return render(path, out / "screenshot.png")


def test_report_renders_without_errors_or_network(rendered: RenderResult) -> None:
    assert rendered.console_errors == []
    assert rendered.failed_or_external_requests == []


def test_report_shows_its_text_with_user_text_escaped(rendered: RenderResult) -> None:
    for expected in (
        "SIMULATED — these figures come",
        "Diagnosis: model-bound",
        "Model-bound: the server is saturated",
        "Only 3 probes ran",
        "One row per probe",
        HOSTILE,  # shown as text, so it was escaped and never ran
        "1,234",
        "1,250",
        "tiny-llama",
        "2 cores, no GPU",
        "Rebuilt from results.json.",
    ):
        assert expected in rendered.text


def test_report_screenshot_is_a_full_page_png(rendered: RenderResult) -> None:
    data = rendered.screenshot.read_bytes()
    assert len(data) > 5_000
    width, height = png_size(data)
    assert width == VIEWPORT[0]
    assert 900 <= height < 16_000  # two plots and a table: longer than one screen


def test_harness_reports_an_external_request(tmp_path: Path) -> None:
    page = tmp_path / "external.html"
    page.write_text('<!DOCTYPE html><p>hi</p><img src="http://127.0.0.1:9/x.png" alt="x">')
    result = render(page, tmp_path / "external.png")
    assert "external: http://127.0.0.1:9/x.png" in result.failed_or_external_requests
    assert any(
        r.startswith("failed: http://127.0.0.1:9/x.png") for r in result.failed_or_external_requests
    )


def test_harness_reports_a_console_error(tmp_path: Path) -> None:
    page = tmp_path / "boom.html"  # no CSP here, or the inline script would be refused
    page.write_text('<!DOCTYPE html><p>hi</p><script>console.error("boom")</script>')
    result = render(page, tmp_path / "boom.png")
    assert result.console_errors == ["boom"]
    assert result.failed_or_external_requests == []
    assert result.text == "hi"


def test_the_policy_blocks_and_the_harness_reports_what_slips_into_a_page(tmp_path: Path) -> None:
    leak = h.section("leak", '<img src="http://127.0.0.1:9/x.png" alt="x">')
    path = h.write_report(tmp_path, h.page("t", [leak]))
    result = render(path, tmp_path / "leak.png")
    assert any("Content Security Policy" in e for e in result.console_errors)
    assert "failed: http://127.0.0.1:9/x.png (csp)" in result.failed_or_external_requests


# --- the diagnose and sweep reports, rendered ---------------------------------------------

# What a reader must find on a report page, by element (the plots are inline SVG).
PAGE_CHECKS = {
    "page_width": "document.documentElement.scrollWidth",
    "tables_overflowing": """[...document.querySelectorAll('table')].filter(
        t => t.getBoundingClientRect().right >
             document.querySelector('main').getBoundingClientRect().right + 1).length""",
    "plots_without_simulated_mark": """[...document.querySelectorAll('svg.plot')].filter(
        s => !s.textContent.includes('SIMULATED')).length""",
}


def _timeline_probe(parallelism: int, rate: float) -> ProbeResult:
    """A probe as the engine probe saves it: warm-up, window, drain, in simulated time."""
    phases = [("warm-up", 0.0, 20.0), ("measured", 20.0, 80.0), ("drain", 80.0, 86.0)]
    timeline = [(t + 1.0, rate * (0.5 if t < 4 else 1.0)) for t in range(0, 86, 2)]
    latency = {stage: StageLatency(300, 0.001, 0.001, 0.002) for stage in STAGES}
    latency["model"] = latency["total"] = StageLatency(300, 1.7, 1.7, 2.3)
    return ProbeResult(
        parallelism=parallelism,
        rollouts_per_s=rate,
        rollouts_per_s_ci=(rate * 0.96, rate * 1.04),
        output_tokens_per_s=rate * 256,
        error_rate=0.0,
        completed=round(rate * 60),
        failed=0,
        measured_s=60.0,
        warmup_s=20.0,
        stop_reason="precision",
        latency_s=latency,
        batches=12,
        latency_cv=0.2,
        timeline=timeline,
        phases=phases,
    )


def _inconclusive_diagnosis() -> DiagnoseResult:
    """Two probes whose speedup (×2.03, 95% interval ×1.92–×2.15) straddles ×2.00."""
    low, high = _timeline_probe(5, 2.9), _timeline_probe(20, 5.9)
    verdict = classify(low, high)
    assert verdict.verdict == "inconclusive"
    return DiagnoseResult(
        created_at=0.0,
        verdict=verdict,
        probes=[low, high],
        target=DiagnoseTarget(
            base_url="http://127.0.0.1:8000/v1",
            model="sim/llama-3.1-8b",
            simulated=True,
            api="chat",
            stream=True,
            time_scale=0.05,
        ),
        workload=DiagnoseWorkload(input=None, tasks=2000, verifier="synthetic"),
        settings=DiagnoseSettings(low=5, high=20, min_s=3.0, max_s=20.0, target_halfwidth=0.15),
        machine={"autotune": "test"},
    )


def test_the_diagnose_report_shows_its_windows_intervals_and_thresholds(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The page a reviewer reads: each probe's warm-up, window and drain shaded; both
    probes' intervals; the thresholds as bands; the speedup's interval against them;
    the time scale; every plot marked SIMULATED; nothing wider than the page."""
    out = tmp_path_factory.mktemp("diagnose-report")
    page = diagnose_report.write(_inconclusive_diagnosis(), out)
    checks = {
        **PAGE_CHECKS,
        "warm-up": drawn('[id^="timeline-"][id*="-warm-up-"]'),
        "measured": drawn('[id^="timeline-"][id*="-measured-"]'),
        "drain": drawn('[id^="timeline-"][id*="-drain-"]'),
        "rate_bands": drawn('[id^="timeline-"][id$="-interval"]'),
        "probe_intervals": drawn('[id^="scaling-interval-"]'),
        "threshold_bands": drawn('[id^="scaling-band-"]'),
        "speedup_interval": drawn("#speedup-interval"),
        "speedup_thresholds": drawn('[id^="speedup-threshold-"]'),
        "speedup_margin": drawn("#speedup-zone"),
    }
    shot = render(page, out / "diagnose-report.png", checks=checks)
    print(f"diagnose report screenshot: {shot.screenshot}")
    assert shot.console_errors == []
    assert shot.failed_or_external_requests == []
    found = shot.checks
    assert found["page_width"] <= VIEWPORT[0] and found["tables_overflowing"] == 0
    assert found["plots_without_simulated_mark"] == 0
    assert (found["warm-up"], found["measured"], found["drain"], found["rate_bands"]) == (2,) * 4
    assert (found["probe_intervals"], found["threshold_bands"]) == (2, 2)
    assert (found["speedup_interval"], found["speedup_thresholds"], found["speedup_margin"]) == (
        1,
        2,
        1,
    )
    for expected in (
        "Verdict: inconclusive between parallelism-bound and model-bound",
        "95% interval ×1.",
        "straddles" if "straddles" in shot.text else "reaches across the 3% margin",
        "time scale 0.05 (20× faster than real time)",
        "rollouts/s",
    ):
        assert expected in shot.text
    assert not re.search(r"\d\.\d{4,}", shot.text)  # no 0.01311-style figures


def _sweep_trial(number: int, knobs: dict[str, object], lam: float) -> TrialRecord:
    ladder = [4, 8, 16, 32, 64, 128]
    rates = [lam * n / (1 + 0.02 * (n - 1) + 0.0004 * n * (n - 1)) for n in ladder]
    points = [
        CurvePoint(n, r, r * 256, 0.0, 1.0, 5.0, "precision")
        for n, r in zip(ladder, rates, strict=True)
    ]
    return TrialRecord(
        number=number,
        state="COMPLETE",
        value=max(rates),
        feasible=True,
        knobs=knobs,
        points=points,
        curve=summarise_curve(ladder, rates),
        probe_s=30.0,
        wall_s=33.3333,
        p95_latency_s=1.23456,
        error_rate=0.0,
    )


def test_the_sweep_report_labels_its_80_percent_lines_and_shows_every_curve(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two trials of one configuration give one curve; three configurations, three
    curves, each its own style; 'recommended' is said to be 80% of the peak
    parallelism, and the 80%-of-peak-throughput line has its own label."""
    same = {"gpu_memory_utilization": 0.9, "max_num_seqs": 128, "max_num_batched_tokens": 8192}
    trials = [
        _sweep_trial(0, same, 2.0),
        _sweep_trial(1, {**same, "max_num_seqs": 256}, 2.4),
        _sweep_trial(2, same, 2.01),  # the same configuration again
        _sweep_trial(3, {**same, "max_num_seqs": 64}, 1.5),
    ]
    result = SweepResult(
        study="report-test", created_at=0.0, started_at=0.0, simulated=True,
        storage="sqlite:///report-test.db", trials_reused=0, metric="rollouts_per_s",
        max_error_rate=0.05, model="sim/llama-3.1-8b",
        spec={"target": {"kind": "sim", "args": ["--time-scale", "0.05"]}},
        trials=trials, importances={"max_num_seqs": 0.8, "gpu_memory_utilization": 0.2},
        machine={"autotune": "test"},
    )  # fmt: skip
    recommended = recommendation(result)
    assert recommended is not None
    out = tmp_path_factory.mktemp("sweep-report")
    page = sweep_report.write(result, recommended, out, objective_for(result.metric))
    checks = {
        **PAGE_CHECKS,
        "curves": drawn('[id^="knee-curve-"]'),
        "marks": drawn('[id^="knee-mark-"]'),
        "level": drawn("#knee-level"),
        "knee_text": "document.getElementById('knee').textContent",
    }
    shot = render(page, out / "sweep-report.png", checks=checks)
    print(f"sweep report screenshot: {shot.screenshot}")
    assert shot.console_errors == []
    assert shot.failed_or_external_requests == []
    found = shot.checks
    assert found["page_width"] <= VIEWPORT[0] and found["tables_overflowing"] == 0
    assert found["plots_without_simulated_mark"] == 0
    assert (found["curves"], found["marks"], found["level"]) == (3, 3, 1)
    knee = found["knee_text"]
    assert "= 80% of the peak parallelism" in knee
    assert "80% of the peak throughput: " in knee
    # Trial 2 repeated trial 0's configuration and measured more: its curve alone is drawn.
    assert knee.count("trial 2:") == 2 and "trial 0:" not in knee  # fit and points, once
    assert "(80% of the peak parallelism)" in shot.text
    assert "33.3" in shot.text and "33.3333" not in shot.text  # rounded on the page
