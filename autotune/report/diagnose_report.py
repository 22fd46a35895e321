"""The diagnose report, built only from a saved diagnosis (diagnose.json).

Two steps, as for every plot here: compute the numbers (pure functions below), then
draw them with report.plots.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from autotune.diagnose.checks import block_pairs, pair_rates
from autotune.report import html, plots
from autotune.report.columns import REPLICA_COLUMNS, Column, html_table
from autotune.results.codec import save
from autotune.results.diagnosis import DiagnoseResult, Evidence, quantity
from autotune.results.probes import ProbeBlock, ProbeResult
from autotune.stats import ratio_interval

STAGE_ORDER = ("queue", "model", "verify_wait", "verify")
SERIES = {
    "client/cpu_fraction": ("client", "cpu_fraction", "client CPU (cores)"),
    "client/loop_lag_ms": ("client", "loop_lag_ms", "client loop lag (ms)"),
    "server/running": ("server", "vllm:num_requests_running", "server running"),
    "server/waiting": ("server", "vllm:num_requests_waiting", "server waiting"),
    "server/kv": ("server", "vllm:kv_cache_usage_perc", "KV cache usage (0-1)"),
    "gpu/util": ("gpu", "gpu_util_pct_mean", "GPU utilisation (%)"),
}


RESULT_FILE = "diagnose.json"


def simulated_banner(result: DiagnoseResult) -> str | None:
    if result.target.simulated:
        return "SIMULATED — measured on autotune's simulated vLLM-like server, not real hardware"
    return None


def time_scale_note(result: DiagnoseResult) -> str | None:
    """What the simulator's time scale means for the figures, or None off the simulator."""
    scale = result.target.time_scale
    if not result.target.simulated:
        return None
    if scale is None:
        return (
            "This file does not say at what time scale the simulator ran (it was saved "
            "before autotune recorded that): its figures may be wall-clock rates of a "
            "simulator run faster than real time."
        )
    if scale == 0:
        return (
            "The simulator ran as fast as it could (time scale 0): figures are wall-clock "
            "rates of that run, not what the simulated server would show in real time."
        )
    if scale == 1:
        return "The simulator ran in real time (time scale 1): figures are as measured."
    speed = f"{1 / scale:.3g}× faster than" if scale < 1 else f"{scale:.3g}× slower than"
    return (
        f"The simulator ran at time scale {scale:g} ({speed} real time); every figure is "
        "in simulated time, as the simulated server would show it in real time. The client "
        f"and the verifier ran in real time beside it, so their stages read {1 / scale:.3g}× "
        "longer than they would beside a real-time server."
    )


def _ms(value: float | None) -> float | int | None:
    """Milliseconds rounded to what they mean: whole from 10 ms, two digits below."""
    if value is None:
        return None
    return round(value) if value >= 10 else float(f"{value:.2g}")


def _latency_ms(stage: str, statistic: str) -> Callable[[ProbeResult], float | int | None]:
    """A probe's latency statistic (p50, p95, mean) of one stage, in milliseconds."""

    def cell(probe: ProbeResult) -> float | int | None:
        seconds: float | None = getattr(probe.latency_s[stage], statistic)
        return None if seconds is None else _ms(seconds * 1000)

    return cell


def _interval(probe: ProbeResult) -> str:
    low, high = probe.rollouts_per_s_ci
    return f"{low:.3g}–{high:.3g}"


def _precision(probe: ProbeResult) -> str:
    """The interval's half-width as a share of the rate: what `target_halfwidth` bounds."""
    rate, high = probe.rollouts_per_s, probe.rollouts_per_s_ci[1]
    return f"±{(high - rate) / rate:.1%}" if rate > 0 and math.isfinite(high) else "—"


def _digits(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def _gpu_util(probe: ProbeResult, stat: str) -> float | None:
    """The probe's GPU utilisation over its measured blocks (`mean`), or how many NVML
    readings it is from (`samples`): the figure a verdict cites for the high probe."""
    return probe.telemetry.get("gpu/gpu_util_pct_mean", {}).get(stat)


# The probe tables: the HTML page shows every column, the terminal those marked `terminal`.
PROBE_COLUMNS: tuple[Column[ProbeResult], ...] = (
    Column("parallelism", lambda p: p.parallelism),
    Column("rollouts/s", lambda p: _digits(p.rollouts_per_s)),
    Column("95% CI", _interval),
    Column("±", _precision),
    Column("output tok/s", lambda p: round(p.output_tokens_per_s), terminal=False),
    Column("error rate", lambda p: quantity(p.error_rate, "share")),
    Column("timeouts", lambda p: p.timeouts, terminal=False),
    Column("measured s", lambda p: _digits(p.measured_s), terminal=False),
    Column("GPU util %", lambda p: _gpu_util(p, "mean"), terminal=False, digits=3),
    Column("GPU util readings", lambda p: _gpu_util(p, "samples"), terminal=False),
    Column("stop", lambda p: p.stop_reason),
)

# With --num-repeats above 1: each probe's GRPO groups (those that ended in its window).
GROUP_COLUMNS: tuple[Column[ProbeResult], ...] = (
    Column("parallelism", lambda p: p.parallelism),
    Column("groups", lambda p: p.groups.complete if p.groups else None),
    Column(
        "informative",
        lambda p: (
            quantity(p.groups.informative_share, "share")
            if p.groups and p.groups.informative_share is not None
            else None
        ),
    ),
    Column(
        "informative groups/s",
        lambda p: _digits(p.groups.informative_groups_per_s) if p.groups else None,
    ),
    Column("completion p95 s", lambda p: _digits(p.groups.completion_s.p95) if p.groups else None),
    Column("straggler p95", lambda p: _digits(p.groups.straggler_ratio.p95) if p.groups else None),
)

LATENCY_COLUMNS: tuple[Column[ProbeResult], ...] = (
    Column("parallelism", lambda p: p.parallelism),
    Column("model p50 ms", _latency_ms("model", "p50")),
    Column("model p95 ms", _latency_ms("model", "p95")),
    Column("verify p50 ms", _latency_ms("verify", "p50")),
    Column("total p50 ms", _latency_ms("total", "p50")),
    Column("total p95 ms", _latency_ms("total", "p95")),
    Column("p95/p50", lambda p: _digits(p.latency_dispersion)),
    Column("CV", lambda p: _digits(p.latency_cv, 2)),
)

BlockPair = tuple[int, ProbeBlock, ProbeBlock]  # (pair number, low block, high block)


def _block_rate(block: ProbeBlock) -> str:
    low, high = block.rollouts_per_s_ci
    return f"{block.rollouts_per_s:.3g} ({low:.3g}–{high:.3g})"


def _pair_speedup(pair: BlockPair) -> str:
    _, low, high = pair
    speedup = ratio_interval(*pair_rates(low, high))
    return f"×{speedup.ratio:.2f} (×{speedup.low:.2f}–×{speedup.high:.2f})"


# Each pair of blocks measured side by side: where the machine's load changed, the rates
# move between pairs (cancelled in the speedup) or the pairs' speedups disagree.
PAIR_COLUMNS: tuple[Column[BlockPair], ...] = (
    Column("pair", lambda pair: pair[0]),
    Column("low rollouts/s (95% CI)", lambda pair: _block_rate(pair[1])),
    Column("high rollouts/s (95% CI)", lambda pair: _block_rate(pair[2])),
    Column("speedup (95% CI)", _pair_speedup),
    Column("low p95/p50", lambda pair: _digits(pair[1].latency_dispersion)),
    Column("high p95/p50", lambda pair: _digits(pair[2].latency_dispersion)),
    Column("stops", lambda pair: f"{pair[1].stop_reason} / {pair[2].stop_reason}"),
)


def pair_rows(result: DiagnoseResult) -> list[BlockPair]:
    low, high = result.probes[0], result.probes[-1]
    return [(n, lo, hi) for n, (lo, hi) in enumerate(block_pairs(low, high), start=1)]


EVIDENCE_COLUMNS: tuple[Column[Evidence], ...] = (
    Column("measure", lambda e: e.name),
    Column("value", lambda e: quantity(e.value, e.unit)),
    Column("threshold", lambda e: f"{e.comparison} {quantity(e.threshold, e.unit)}"),
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


def speedup_thresholds(result: DiagnoseResult) -> list[tuple[str, float]]:
    """The two speedups the verdict is judged against: 'barely moved' below the first,
    parallelism-bound from the second."""
    th, ratio = result.settings.thresholds, result.verdict.parallelism_ratio
    flat, scales = 1 + th.flat_gain, th.parallelism_bound_speedup(ratio)
    return [
        (f"barely moved below ×{flat:.2f}", flat),
        (f"parallelism-bound from ×{scales:.2f}", scales),
    ]


def threshold_margin(result: DiagnoseResult) -> tuple[str, float, float]:
    """The speedups on the parallelism-bound threshold: an interval must clear these."""
    th = result.settings.thresholds
    low, high = th.undecided_zone(result.verdict.parallelism_ratio)
    return (f"on the threshold (±{th.threshold_margin:.0%})", low, high)


def threshold_bands(result: DiagnoseResult) -> list[tuple[str, float, float]]:
    """The thresholds as throughputs at the high parallelism: each speedup threshold
    times the low probe's rate, a band as wide as the low probe's 95% interval."""
    low = result.probes[0]
    lo, hi = low.rollouts_per_s_ci
    return [
        (f"{label} the low probe's rate", factor * lo, factor * hi)
        for label, factor in speedup_thresholds(result)
    ]


def timelines(result: DiagnoseResult) -> list[plots.Timeline]:
    """Each probe's throughput over time with its phases, for the shaded plot."""
    return [
        plots.Timeline(
            f"parallelism {p.parallelism}: {p.stop_reason}",
            p.timeline,
            p.phases,
            (p.rollouts_per_s, *p.rollouts_per_s_ci),
        )
        for p in result.probes
        if p.timeline
    ]


def _bounds(interval: tuple[float | None, float | None]) -> tuple[float, float]:
    """An interval as saved: JSON has no infinity, so an unbounded side reads back None."""
    low, high = interval
    return (0.0 if low is None else low), (math.inf if high is None else high)


def verdict_line(result: DiagnoseResult) -> str:
    """The verdict with its speedup and the speedup's 95% interval."""
    verdict = result.verdict
    leaning = " (leaning)" if verdict.leaning else ""
    between = f" between {' and '.join(verdict.between)}" if verdict.between else ""
    interval = ""
    if verdict.speedup_interval is not None:
        low, high = _bounds(verdict.speedup_interval)
        interval = f" (95% interval ×{low:.2f}–×{high:.2f})"
    return (
        f"{verdict.verdict}{leaning}{between} — throughput ×{verdict.speedup:.2f}{interval} "
        f"for ×{verdict.parallelism_ratio:.2g} parallelism"
    )


def replica_section(result: DiagnoseResult) -> list[str]:
    """Each replica at each probe, when several served the model."""
    tables = [
        html_table(REPLICA_COLUMNS, probe.replicas, caption=f"parallelism {probe.parallelism}")
        for probe in result.probes
        if probe.replicas
    ]
    return [html.section("Replicas", *tables)] if tables else []


def render(result: DiagnoseResult) -> str:
    """The whole report page."""
    verdict = result.verdict
    simulated = result.target.simulated
    unit = "rollouts/s (simulated time)" if result.target.time_scale else "rollouts/s"
    categories, stages = stage_breakdown(result)
    note = time_scale_note(result)
    unsure = verdict.verdict == "inconclusive"
    sure: html.CalloutKind = "warning" if unsure else "info"
    sections = [
        html.section(
            "Verdict",
            html.callout(f"Verdict: {verdict_line(result)}.", "warning" if unsure else "verdict"),
            *(
                [html.callout(f"Confidence: {verdict.confidence}.", sure)]
                if verdict.confidence
                else []
            ),
            html.callout(f"Next step: {verdict.next_step}", "info"),
            *([html.callout(note, "warning")] if note else []),
            *(html.callout(n, "warning") for n in verdict.notes),
        )
    ]
    bounds = None if verdict.speedup_interval is None else _bounds(verdict.speedup_interval)
    if bounds is not None and math.isfinite(bounds[1]):
        low, high = bounds
        sections.append(
            html.section(
                "Speedup against the thresholds",
                html.svg(
                    plots.interval_against_thresholds(
                        (verdict.speedup, low, high),
                        speedup_thresholds(result),
                        "speedup (high ÷ low throughput)",
                        "The speedup's 95% interval and the verdict thresholds",
                        key="speedup",
                        zone=threshold_margin(result),
                        simulated=simulated,
                    ),
                    "the speedup's 95% interval against the verdict thresholds",
                ),
            )
        )
    sections.append(
        html.section(
            "Throughput versus parallelism",
            html.svg(
                plots.throughput_with_bands(
                    [
                        (p.parallelism, p.rollouts_per_s, *p.rollouts_per_s_ci)
                        for p in result.probes
                    ],
                    threshold_bands(result),
                    unit,
                    "Each probe's rate with its 95% interval; the thresholds as bands",
                    key="scaling",
                    simulated=simulated,
                ),
                "throughput at both parallelisms with intervals and threshold bands",
            ),
        )
    )
    shown = timelines(result)
    if shown:
        sections.append(
            html.section(
                "Throughput over time",
                html.svg(
                    plots.probe_timelines(
                        shown,
                        unit,
                        "Warm-up, measured window and drain of each probe",
                        key="timeline",
                        simulated=simulated,
                    ),
                    "each probe's throughput over time with warm-up, window and drain shaded",
                ),
                html.paragraph(
                    "Only the green window is measured: it starts once every slot has finished "
                    "a rollout and ends when the rate's interval is precise enough (or at the "
                    "cap); the band is the rate's 95% interval."
                ),
            )
        )
    sections += [
        html.section(
            "Probes",
            html_table(PROBE_COLUMNS, result.probes, caption="throughput"),
            *(
                [html_table(GROUP_COLUMNS, result.probes, caption="GRPO groups")]
                if any(p.groups for p in result.probes)
                else []
            ),
            html_table(LATENCY_COLUMNS, result.probes, caption="latency"),
            *(
                [html_table(PAIR_COLUMNS, pairs, caption="pairs of blocks, in the order run")]
                if (pairs := pair_rows(result))
                else []
            ),
        ),
        html.section("Evidence", html_table(EVIDENCE_COLUMNS, verdict.evidence)),
        *replica_section(result),
        html.section(
            "Where the time goes",
            html.image(
                plots.bar_chart_stacked(
                    categories,
                    stages,
                    "mean ms per rollout",
                    "Per-stage latency",
                    simulated=simulated,
                ),
                "mean latency per stage for each probe",
            ),
        ),
    ]
    charts = []
    for key, (_, _, label) in SERIES.items():
        series = telemetry_series(result, key)
        if series:
            charts.append(
                html.image(plots.time_series(series, label, label, simulated=simulated), label)
            )
    unavailable = {
        name: reason for p in result.probes for name, reason in p.telemetry_unavailable.items()
    }
    if unavailable:
        charts.append(html.definition_list(sorted(unavailable.items())))
    sections.append(html.section("Telemetry over time", *charts))
    target, workload, settings = result.target, result.workload, result.settings
    items = [
        ("server", f"{target.base_url} ({target.model})"),
        ("api", f"{target.api}, {'streaming' if target.stream else 'non-streaming'}"),
        ("workload", f"{workload.input or 'synthetic'}, {workload.tasks} tasks"),
        ("verifier", str(workload.verifier)),
        (
            "probes",
            f"low {settings.low}, high {settings.high}, ±{settings.target_halfwidth:.0%} "
            f"target, {settings.max_s:g} s cap (wall clock)",
        ),
    ]
    if target.simulated and target.time_scale is not None:
        items.append(("time scale", f"{target.time_scale:g} real s per simulated s"))
    items.append(("autotune", result.machine["autotune"]))
    sections.append(html.section("Settings", html.definition_list(items)))
    return html.page(
        f"autotune diagnose: {verdict.verdict}",
        sections,
        banner=simulated_banner(result),
        subtitle="Rebuilt from diagnose.json; `autotune report DIR` renders it again.",
    )


def write(result: DiagnoseResult, directory: Path) -> Path:
    return html.write_report(directory, render(result))


def write_outputs(result: DiagnoseResult, directory: Path) -> list[Path]:
    """diagnose.json, then index.html rebuilt from it (also what `autotune report` calls)."""
    saved = save(result, directory / RESULT_FILE)
    return [saved, write(result, directory)]
