"""Terminal output: the progress bar (tqdm, on stderr) and closing summaries."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autotune.report.columns import terminal_table
from autotune.report.diagnose_report import PROBE_COLUMNS
from autotune.results import (
    STAGES,
    CollectSummary,
    DiagnoseResult,
    Recommendation,
    SweepResult,
)


class _Progress:
    """A tqdm bar with a cheap per-rollout `tick` (tqdm redraws at most twice a second)."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def rollout_failed(self, failure_class: str) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def set_total(self, total: int) -> None:
        if self._bar is not None:
            self._bar.reset(total=total)

    def write(self, line: str) -> None:
        """A line above the bar (or plain stderr when there is no bar)."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)


@contextmanager
def progress_bar(enabled: bool, unit: str, total: int | None = None) -> Iterator[_Progress]:
    """A progress bar showing the rate (it/s) and ETA; a no-op when disabled."""
    if not enabled:
        yield _Progress(None)
        return
    from tqdm import tqdm

    # `delay`: nothing is drawn before the caller has had a moment to set the total.
    bar = tqdm(
        total=total, unit=unit, mininterval=0.5, smoothing=0.1, dynamic_ncols=True, delay=0.5
    )
    try:
        yield _Progress(bar)
    except BaseException:
        bar.leave = False  # clear the bar, so the error sentence stands on its own line
        raise
    finally:
        bar.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f}"


def collect_summary_text(summary: CollectSummary) -> str:
    """The closing summary of `autotune collect`, for people."""
    lines = []
    if summary.simulated:
        lines.append("SIMULATED: these figures come from autotune's simulated vLLM-like server.")
    reward = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    lines += [
        f"model {summary.model} at {summary.base_url}",
        f"rollouts      {summary.completed:,} done, {summary.failed:,} failed"
        + (f", {summary.skipped:,} already on disk" if summary.skipped else ""),
        f"throughput    {summary.rollouts_per_s:,.2f} rollouts/s, "
        f"{summary.output_tokens_per_s:,.1f} output tokens/s over {summary.elapsed_s:,.1f} s",
        f"mean reward   {reward}",
        "",
        f"{'stage':<12}{'p50 ms':>12}{'p95 ms':>12}{'mean ms':>12}",
    ]
    for stage in STAGES:
        latency = summary.latency_s[stage]
        if latency.count:
            lines.append(
                f"{stage:<12}{_ms(latency.p50):>12}{_ms(latency.p95):>12}{_ms(latency.mean):>12}"
            )
    if summary.errors_by_class:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(summary.errors_by_class.items()))
        lines.append(f"\nerrors        {errors}")
    if summary.retries_by_class:
        retries = ", ".join(f"{k}: {v}" for k, v in sorted(summary.retries_by_class.items()))
        lines.append(f"retries       {retries}")
    if summary.rate_limited_responses:
        lines.append(f"rate limited  {summary.rate_limited_responses:,} HTTP 429 answers")
    if summary.concurrency_decreases:
        lines.append(
            f"concurrency   lowered {summary.concurrency_decreases:,}× on 429/503 "
            f"(adaptive): {summary.concurrency_limit_min} at the lowest, "
            f"{summary.concurrency_limit_final} at the end"
        )
    if summary.output:
        lines.append(f"output        {summary.output}")
    return "\n".join(lines)


def diagnose_text(result: DiagnoseResult) -> str:
    """The terminal summary of a diagnosis: verdict, probe table, evidence, next step."""
    verdict = result.verdict
    lines = []
    if result.target.simulated:
        lines.append("SIMULATED: measured on autotune's simulated vLLM-like server.")
    leaning = " (leaning; a sweep should decide)" if verdict.leaning else ""
    lines.append(
        f"verdict: {verdict.verdict}{leaning}  —  throughput ×{verdict.speedup:.2f} "
        f"for ×{verdict.parallelism_ratio:.2g} parallelism"
    )
    lines.append("")
    lines += terminal_table(PROBE_COLUMNS, result.probes)
    lines.append("\nevidence:")
    lines += [f"  - {e.text()}" for e in verdict.evidence]
    lines.append(f"\nnext step: {verdict.next_step}")
    lines += [f"note: {note}" for note in verdict.notes]
    return "\n".join(lines)


def sweep_text(result: SweepResult, recommended: Recommendation | None, directory: Path) -> str:
    """The closing summary of a sweep: the recommendation and where the files are."""
    lines = []
    if result.simulated:
        lines.append("SIMULATED: measured on autotune's simulated vLLM-like server.")
    trials = result.completed
    feasible = sum(1 for t in trials if t.feasible)
    lines.append(
        f"study {result.study}: {len(trials)} trials ({feasible} feasible, "
        f"{result.trials_reused} reused), {result.probe_s_total:.0f} s of probes"
    )
    if recommended is None:
        lines.append("no feasible configuration: see the failed configurations in the report")
    else:
        rec = recommended
        knobs = ", ".join(f"{k}={v}" for k, v in rec.server.items()) or "(client only)"
        smallest = rec.smallest_parallelism_at_80pct_of_peak_throughput
        lines += [
            f"best configuration   {knobs}",
            f"peak                 {rec.peak.throughput:.3g} {rec.metric} at parallelism "
            f"{rec.peak.parallelism:.0f}",
            f"recommended          parallelism {rec.recommended.parallelism} "
            f"(80% of peak) → {rec.recommended.predicted_throughput:.3g} predicted",
            f"knee                 parallelism {rec.knee_parallelism:.0f}; 80% of peak "
            f"throughput from parallelism {smallest}",
            f"note                 {rec.note}",
            "",
            f"NeMo Gym   {rec.snippets.nemo_gym}",
            f"vLLM       {rec.snippets.vllm}",
            f"OpenRLHF   {rec.snippets.openrlhf}",
        ]
    lines.append(f"\nreport: {directory / 'index.html'}")
    return "\n".join(lines)
