"""The collect report, built only from a saved collect (collect.json): throughput and
per-stage latency over the run, errors over time, the drift warning marked where it came.
Why: docs/design/report.md.
"""

from __future__ import annotations

from pathlib import Path

from autotune.report import html, plots
from autotune.report.columns import REPLICA_COLUMNS, html_table
from autotune.results.codec import save
from autotune.results.runs import CollectResult, CollectSummary, LiveSample
from autotune.results.stages import STAGES, StageLatency

SERIES_STAGES = ("queue", "model", "ttft", "tool", "verify_wait", "verify")

Series = dict[str, tuple[list[float], list[float]]]


RESULT_FILE = "collect.json"  # what `collect --report DIR` saves beside index.html


def simulated_banner(result: CollectResult) -> str | None:
    if result.summary.simulated:
        return "SIMULATED — measured on autotune's simulated vLLM-like server, not real hardware"
    return None


def throughput_series(result: CollectResult) -> Series:
    """Rollouts/s in each sample's window; the drift watch's steady-state rate where it ran."""
    samples = result.samples
    series: Series = {
        "rollouts/s (each sample)": (
            [s.t_s for s in samples],
            [s.window_rollouts_per_s for s in samples],
        )
    }
    steady = [(s.t_s, s.steady_rollouts_per_s) for s in samples if s.steady_rollouts_per_s]
    if steady:
        series["steady state (last drift window)"] = (
            [t for t, _ in steady],
            [rate for _, (rate, _, _) in steady],
        )
    return series


def latency_series(result: CollectResult) -> Series:
    """Each stage's mean milliseconds per rollout in each sample's window."""
    series: Series = {}
    for stage in SERIES_STAGES:
        points = [
            (s.t_s, latency.mean * 1000)
            for s in result.samples
            if (latency := s.window_latency_s.get(stage)) is not None and latency.mean is not None
        ]
        if points:
            series[stage] = ([t for t, _ in points], [ms for _, ms in points])
    return series


def error_series(result: CollectResult) -> Series:
    """Failed rollouts per second in each sample's window, by class."""
    classes = sorted({name for s in result.samples for name in s.errors_by_class})
    series: Series = {}
    for name in classes:
        xs, ys, before = [], [], 0
        for sample in result.samples:
            now = sample.errors_by_class.get(name, 0)
            xs.append(sample.t_s)
            ys.append((now - before) / sample.window_s)
            before = now
        series[name] = (xs, ys)
    return series


def _marks(result: CollectResult) -> dict[str, float]:
    drift = result.drift
    return {f"drift warning ({drift.t_s:.0f} s)": drift.t_s} if drift is not None else {}


def _verdict(result: CollectResult) -> list[str]:
    expectation, drift = result.expectation, result.drift
    if drift is not None:
        return [html.callout(f"Drift warning at {drift.t_s:.0f} s: {drift.message}", "warning")]
    if expectation is None:
        return [
            html.callout(
                "No drift watch ran: pass --expect reports/<study>/recommendation.json or "
                "--expect-rate to compare the run with what it was tuned for.",
                "info",
            )
        ]
    counted, width = result.drift_windows_counted, result.settings.get("drift_window_s")
    if not counted:
        return [
            html.callout(
                "The drift watch compared no window: the run ended before warm-up and one "
                "whole window of steady state had passed.",
                "info",
            )
        ]
    return [
        html.callout(
            f"Throughput held the expectation: {counted} steady-state windows of {width:.3g} s "
            f"compared, never {result.settings.get('drift_windows')} in a row below "
            f"{expectation.low:.3g} rollouts/s.",
            "verdict",
        )
    ]


def tool_calls_line(summary: CollectSummary) -> str:
    """Tool calls made and those answered with an error, with what was done about them."""
    line = f"{summary.tool_calls:,} calls"
    if summary.tool_errors:
        done = (
            "their rollouts failed (--tool-errors fail)"
            if summary.tool_errors_treatment == "fail"
            else "fed back to the model, as NeMo Gym does (--tool-errors feed)"
        )
        share = summary.tool_errors / summary.tool_calls
        line += f", {summary.tool_errors:,} ({share:.1%}) answered an error: {done}"
    return line


def _totals(result: CollectResult) -> str:
    summary = result.summary
    last: LiveSample | None = result.samples[-1] if result.samples else None
    rows: list[list[object]] = [
        ["rollouts completed", summary.completed],
        ["rollouts failed", summary.failed],
        ["already on disk (resumed)", summary.skipped],
        ["rollouts/s (whole run)", summary.rollouts_per_s],
        ["output tokens/s (whole run)", summary.output_tokens_per_s],
        ["mean reward", summary.mean_reward],
        ["model calls retried", sum(summary.retries_by_class.values())],
        ["HTTP 429 answers", summary.rate_limited_responses],
    ]
    if last is not None:
        rows.append(["seconds waiting for --rpm/--tpm", last.limiter_wait_s])
        rows.append(["seconds getting a pooled connection", last.pool_wait_s])
    if summary.concurrency_limit_final is not None:
        rows.append(["adaptive concurrency limit at the end", summary.concurrency_limit_final])
    if summary.cancelled:
        rows.append(["samples cancelled by a batch step's end", summary.cancelled])
    if summary.tool_calls:
        rows.append(["tool calls", tool_calls_line(summary)])
    groups = summary.groups
    if groups is not None:
        rows += [
            [f"groups complete ({groups.size} samples each)", groups.complete],
            ["informative groups (rewards differ)", groups.informative],
            ["RL goodput: informative groups/s", groups.informative_groups_per_s],
            ["group completion p50 / p95 (s)", _pair(groups.completion_s)],
            ["straggler ratio p50 / p95", _pair(groups.straggler_ratio)],
        ]
    batch = summary.batch
    if batch is not None:
        rows += [
            [f"batch steps of {batch.batch_groups} groups", len(batch.steps)],
            ["step tail share (mean)", batch.tail_share],
            [
                f"server busy share (÷ {batch.capacity}, {batch.capacity_source}; "
                f"the {batch.busy_source}'s count)",
                batch.busy_share,
            ],
            ["staleness mean (steps)", batch.staleness_mean],
            ["staleness max (steps)", batch.staleness_max],
        ]
    return html.table(["figure", "value"], rows)


def _pair(latency: StageLatency) -> str:
    """`p50 / p95` of a distribution, two decimals each."""
    return " / ".join("-" if v is None else f"{v:.2f}" for v in (latency.p50, latency.p95))


def _stage_table(result: CollectResult) -> str:
    rows = []
    for stage in STAGES:
        latency = result.summary.latency_s.get(stage)  # a file saved before a stage existed
        if latency is not None and latency.count:
            rows.append(
                [
                    stage,
                    latency.count,
                    None if latency.p50 is None else latency.p50 * 1000,
                    None if latency.p95 is None else latency.p95 * 1000,
                    None if latency.mean is None else latency.mean * 1000,
                ]
            )
    return html.table(["stage", "rollouts", "p50 ms", "p95 ms", "mean ms"], rows)


def render(result: CollectResult) -> str:
    """The whole report page."""
    summary, expectation, marks = result.summary, result.expectation, _marks(result)
    levels = {}
    if expectation is not None:
        levels[f"expected low ({expectation.low:.3g}/s)"] = expectation.low
        if expectation.rollouts_per_s != expectation.low:
            levels[f"predicted ({expectation.rollouts_per_s:.3g}/s)"] = expectation.rollouts_per_s
    sections = [
        html.section("Run", *_verdict(result), _totals(result)),
        html.section(
            "Throughput over the run",
            html.image(
                plots.time_series(
                    throughput_series(result),
                    "rollouts/s",
                    "Throughput",
                    marks=marks,
                    levels=levels,
                ),
                "rollouts per second over the run",
            ),
        ),
    ]
    latency = latency_series(result)
    if latency:
        sections.append(
            html.section(
                "Latency by stage over the run",
                html.image(
                    plots.time_series(latency, "mean ms per rollout", "Stage latency", marks=marks),
                    "mean latency of each stage over the run",
                ),
                _stage_table(result),
            )
        )
    errors = error_series(result)
    if errors:
        failures = html.image(
            plots.time_series(errors, "failed rollouts/s", "Failures by class", marks=marks),
            "failed rollouts per second by class over the run",
        )
    else:
        failures = html.paragraph("No rollout failed.")
    sections.append(html.section("Errors over time", failures))
    if summary.replicas:
        sections.append(
            html.section(
                "Replicas",
                html_table(REPLICA_COLUMNS, summary.replicas),
                html.paragraph(
                    "Each call went to the replica with the fewest calls in flight; its "
                    "/metrics counters cover the whole run."
                ),
            )
        )
    settings = [
        (
            "server",
            f"{', '.join(r.url for r in summary.replicas) or summary.base_url} ({summary.model})",
        ),
        ("parallelism", str(summary.parallelism or "unlimited")),
        ("output", summary.output or "not kept"),
        ("samples", f"{len(result.samples)}, every {result.settings.get('sample_every_s')} s"),
    ]
    if expectation is not None:
        interval = (
            f"{expectation.low:.3g}–{expectation.high:.3g}"
            if expectation.high > expectation.low
            else f"{expectation.low:.3g} (no interval)"
        )
        settings += [
            ("expected", f"{interval} rollouts/s"),
            ("expectation from", expectation.source),
            ("its interval", expectation.note),
            (
                "drift watch",
                f"warn after {result.settings.get('drift_windows')} windows in a row below the "
                f"low end; {result.drift_windows_counted} windows of "
                f"{result.settings.get('drift_window_s') or 0:.3g} s compared",
            ),
        ]
    settings.append(("autotune", result.machine.get("autotune", "?")))
    sections.append(html.section("Settings", html.definition_list(settings)))
    return html.page(
        f"autotune collect: {summary.completed:,} rollouts at "
        f"{html.format_value(summary.rollouts_per_s)}/s",
        sections,
        banner=simulated_banner(result),
        subtitle="Rebuilt from collect.json; `autotune report DIR` renders it again.",
    )


def write(result: CollectResult, directory: Path) -> Path:
    return html.write_report(directory, render(result))


def write_outputs(result: CollectResult, directory: Path) -> list[Path]:
    """collect.json, then index.html rebuilt from it (also what `autotune report` calls)."""
    saved = save(result, directory / RESULT_FILE)
    return [saved, write(result, directory)]
