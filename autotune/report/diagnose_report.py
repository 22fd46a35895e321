"""The diagnose report, built only from a saved diagnosis (diagnose.json).

Two steps, as for every plot here: compute the numbers (pure functions below), then
draw them with report.plots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.report import html, plots

STAGE_ORDER = ("queue", "model", "verify_wait", "verify")
SERIES = {
    "client/cpu_fraction": ("client", "cpu_fraction", "client CPU (cores)"),
    "client/loop_lag_ms": ("client", "loop_lag_ms", "client loop lag (ms)"),
    "server/running": ("server", "vllm:num_requests_running", "server running"),
    "server/waiting": ("server", "vllm:num_requests_waiting", "server waiting"),
    "server/kv": ("server", "vllm:kv_cache_usage_perc", "KV cache usage (0-1)"),
    "gpu/util": ("gpu", "gpu_util_pct_mean", "GPU utilisation (%)"),
}


def simulated_banner(result: dict[str, Any]) -> str | None:
    if result.get("target", {}).get("simulated"):
        return "SIMULATED — measured on autotune's simulated vLLM-like server, not real hardware"
    return None


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def probe_rows(result: dict[str, Any]) -> tuple[list[str], list[list[object]]]:
    """The probe table: one row a probe."""
    columns = [
        "parallelism",
        "rollouts/s",
        "95% CI",
        "output tok/s",
        "error rate",
        "model p50 ms",
        "model p95 ms",
        "verify p50 ms",
        "total p50 ms",
        "total p95 ms",
        "measured s",
        "stop",
    ]
    rows: list[list[object]] = []
    for probe in result["probes"]:
        latency = probe["latency_s"]
        low, high = probe["rollouts_per_s_ci"]
        rows.append(
            [
                probe["parallelism"],
                probe["rollouts_per_s"],
                f"{low:.3g}–{high:.3g}",
                probe["output_tokens_per_s"],
                f"{probe['error_rate']:.1%}",
                _ms(latency["model"]["p50"]),
                _ms(latency["model"]["p95"]),
                _ms(latency["verify"]["p50"]),
                _ms(latency["total"]["p50"]),
                _ms(latency["total"]["p95"]),
                probe["measured_s"],
                probe["stop_reason"],
            ]
        )
    return columns, rows


def stage_breakdown(result: dict[str, Any]) -> tuple[list[str], dict[str, list[float]]]:
    """Mean seconds per stage per probe, for the stacked bar chart."""
    categories = [f"parallelism {p['parallelism']}" for p in result["probes"]]
    series = {
        stage: [(p["latency_s"][stage]["mean"] or 0.0) * 1000 for p in result["probes"]]
        for stage in STAGE_ORDER
    }
    return categories, series


def telemetry_series(
    result: dict[str, Any], key: str
) -> dict[str, tuple[list[float], list[float]]]:
    """One telemetry metric over time (seconds since the first probe began), per probe."""
    source, metric, _ = SERIES[key]
    out: dict[str, tuple[list[float], list[float]]] = {}
    points = [s for p in result["probes"] for s in p["series"]]
    if not points:
        return out
    t0 = min(s["t"] for s in points)
    for probe in result["probes"]:
        xs, ys = [], []
        for sample in probe["series"]:
            if sample["source"] == source and metric in sample:
                xs.append(sample["t"] - t0)
                ys.append(float(sample[metric]))
        if xs:
            out[f"parallelism {probe['parallelism']}"] = (xs, ys)
    return out


def render(result: dict[str, Any]) -> str:
    """The whole report page."""
    leaning = " (leaning)" if result.get("leaning") else ""
    verdict_text = (
        f"Verdict: {result['verdict']}{leaning} — throughput ×{result['speedup']:.2f} for "
        f"×{result['parallelism_ratio']:.2g} parallelism."
    )
    columns, rows = probe_rows(result)
    categories, stages = stage_breakdown(result)
    sections = [
        html.section(
            "Verdict",
            html.callout(verdict_text, "verdict"),
            html.callout(f"Next step: {result['next_step']}", "info"),
            *(html.callout(note, "warning") for note in result.get("notes", [])),
        ),
        html.section("Probes", html.table(columns, rows)),
        html.section(
            "Evidence",
            html.table(
                ["measure", "value", "threshold", "met", "meaning"],
                [
                    [
                        e["name"],
                        e["value"],
                        f"{e['comparison']} {e['threshold']:.3g}",
                        e["met"],
                        e["meaning"],
                    ]
                    for e in result["evidence"]
                ],
            ),
        ),
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
        name: reason
        for p in result["probes"]
        for name, reason in p["telemetry_unavailable"].items()
    }
    if unavailable:
        charts.append(html.definition_list(sorted(unavailable.items())))
    sections.append(html.section("Telemetry over time", *charts))
    target = result["target"]
    workload = result["workload"]
    sections.append(
        html.section(
            "Settings",
            html.definition_list(
                [
                    ("server", f"{target['base_url']} ({target['model']})"),
                    (
                        "api",
                        f"{target['api']}, {'streaming' if target['stream'] else 'non-streaming'}",
                    ),
                    ("workload", f"{workload['input'] or 'synthetic'}, {workload['tasks']} tasks"),
                    ("verifier", str(workload["verifier"])),
                    (
                        "probes",
                        f"low {result['settings']['low']}, high {result['settings']['high']}, "
                        f"±{result['settings']['target_halfwidth']:.0%} target, "
                        f"{result['settings']['max_s']} s cap",
                    ),
                    ("autotune", result["machine"]["autotune"]),
                ]
            ),
        )
    )
    return html.page(
        f"autotune diagnose: {result['verdict']}",
        sections,
        banner=simulated_banner(result),
        subtitle="Rebuilt from diagnose.json; `autotune report DIR` renders it again.",
    )


def write(result: dict[str, Any], directory: Path) -> Path:
    return html.write_report(directory, render(result))
