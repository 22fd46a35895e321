"""The diagnose report, built only from a saved diagnosis (diagnose.json).

Two steps, as for every plot here: compute the numbers (pure functions below), then
draw them with report.plots.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.report import html, plots
from autotune.report.columns import Column, html_table
from autotune.results import DiagnoseResult, Evidence, ProbeResult

STAGE_ORDER = ("queue", "model", "verify_wait", "verify")
SERIES = {
    "client/cpu_fraction": ("client", "cpu_fraction", "client CPU (cores)"),
    "client/loop_lag_ms": ("client", "loop_lag_ms", "client loop lag (ms)"),
    "server/running": ("server", "vllm:num_requests_running", "server running"),
    "server/waiting": ("server", "vllm:num_requests_waiting", "server waiting"),
    "server/kv": ("server", "vllm:kv_cache_usage_perc", "KV cache usage (0-1)"),
    "gpu/util": ("gpu", "gpu_util_pct_mean", "GPU utilisation (%)"),
}


def simulated_banner(result: DiagnoseResult) -> str | None:
    if result.target.simulated:
        return "SIMULATED — measured on autotune's simulated vLLM-like server, not real hardware"
    return None


def _latency_ms(stage: str, statistic: str) -> Callable[[ProbeResult], float | None]:
    """A probe's latency statistic (p50, p95, mean) of one stage, in milliseconds."""

    def cell(probe: ProbeResult) -> float | None:
        seconds: float | None = getattr(probe.latency_s[stage], statistic)
        return None if seconds is None else seconds * 1000

    return cell


def _interval(probe: ProbeResult) -> str:
    low, high = probe.rollouts_per_s_ci
    return f"{low:.3g}–{high:.3g}"


# The probe table: the HTML page shows every column, the terminal those marked `terminal`.
PROBE_COLUMNS: tuple[Column[ProbeResult], ...] = (
    Column("parallelism", lambda p: p.parallelism),
    Column("rollouts/s", lambda p: p.rollouts_per_s),
    Column("95% CI", _interval),
    Column("output tok/s", lambda p: p.output_tokens_per_s, terminal=False),
    Column("error rate", lambda p: f"{p.error_rate:.1%}"),
    Column("model p50 ms", _latency_ms("model", "p50")),
    Column("model p95 ms", _latency_ms("model", "p95")),
    Column("verify p50 ms", _latency_ms("verify", "p50")),
    Column("total p50 ms", _latency_ms("total", "p50")),
    Column("total p95 ms", _latency_ms("total", "p95"), terminal=False),
    Column("measured s", lambda p: p.measured_s, terminal=False),
    Column("stop", lambda p: p.stop_reason),
)

EVIDENCE_COLUMNS: tuple[Column[Evidence], ...] = (
    Column("measure", lambda e: e.name),
    Column("value", lambda e: e.value),
    Column("threshold", lambda e: f"{e.comparison} {e.threshold:.3g}"),
    Column("met", lambda e: e.met),
    Column("meaning", lambda e: e.meaning),
)


def stage_breakdown(result: DiagnoseResult) -> tuple[list[str], dict[str, list[float]]]:
    """Mean milliseconds per stage per probe, for the stacked bar chart."""
    categories = [f"parallelism {p.parallelism}" for p in result.probes]
    series = {
        stage: [(p.latency_s[stage].mean or 0.0) * 1000 for p in result.probes]
        for stage in STAGE_ORDER
    }
    return categories, series


def telemetry_series(
    result: DiagnoseResult, key: str
) -> dict[str, tuple[list[float], list[float]]]:
    """One telemetry metric over time (seconds since the first probe began), per probe."""
    source, metric, _ = SERIES[key]
    out: dict[str, tuple[list[float], list[float]]] = {}
    points = [s for p in result.probes for s in p.series]
    if not points:
        return out
    t0 = min(s["t"] for s in points)
    for probe in result.probes:
        xs, ys = [], []
        for sample in probe.series:
            if sample["source"] == source and metric in sample:
                xs.append(sample["t"] - t0)
                ys.append(float(sample[metric]))
        if xs:
            out[f"parallelism {probe.parallelism}"] = (xs, ys)
    return out


def render(result: DiagnoseResult) -> str:
    """The whole report page."""
    verdict = result.verdict
    leaning = " (leaning)" if verdict.leaning else ""
    verdict_text = (
        f"Verdict: {verdict.verdict}{leaning} — throughput ×{verdict.speedup:.2f} for "
        f"×{verdict.parallelism_ratio:.2g} parallelism."
    )
    categories, stages = stage_breakdown(result)
    sections = [
        html.section(
            "Verdict",
            html.callout(verdict_text, "verdict"),
            html.callout(f"Next step: {verdict.next_step}", "info"),
            *(html.callout(note, "warning") for note in verdict.notes),
        ),
        html.section("Probes", html_table(PROBE_COLUMNS, result.probes)),
        html.section("Evidence", html_table(EVIDENCE_COLUMNS, verdict.evidence)),
        html.section(
            "Where the time goes",
            html.image(
                plots.bar_chart_stacked(
                    categories, stages, "mean ms per rollout", "Per-stage latency"
                ),
                "mean latency per stage for each probe",
            ),
        ),
    ]
    charts = []
    for key, (_, _, label) in SERIES.items():
        series = telemetry_series(result, key)
        if series:
            charts.append(html.image(plots.time_series(series, label, label), label))
    unavailable = {
        name: reason for p in result.probes for name, reason in p.telemetry_unavailable.items()
    }
    if unavailable:
        charts.append(html.definition_list(sorted(unavailable.items())))
    sections.append(html.section("Telemetry over time", *charts))
    target, workload, settings = result.target, result.workload, result.settings
    sections.append(
        html.section(
            "Settings",
            html.definition_list(
                [
                    ("server", f"{target.base_url} ({target.model})"),
                    (
                        "api",
                        f"{target.api}, {'streaming' if target.stream else 'non-streaming'}",
                    ),
                    ("workload", f"{workload.input or 'synthetic'}, {workload.tasks} tasks"),
                    ("verifier", str(workload.verifier)),
                    (
                        "probes",
                        f"low {settings.low}, high {settings.high}, "
                        f"±{settings.target_halfwidth:.0%} target, {settings.max_s} s cap",
                    ),
                    ("autotune", result.machine["autotune"]),
                ]
            ),
        )
    )
    return html.page(
        f"autotune diagnose: {verdict.verdict}",
        sections,
        banner=simulated_banner(result),
        subtitle="Rebuilt from diagnose.json; `autotune report DIR` renders it again.",
    )


def write(result: DiagnoseResult, directory: Path) -> Path:
    return html.write_report(directory, render(result))
