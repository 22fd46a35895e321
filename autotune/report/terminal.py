"""Terminal output: progress on stderr (a live bar on a terminal, plain lines in a log,
nothing with --quiet) and the closing summaries."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from autotune.engines import ENGINES
from autotune.engines.description import OPTIONS_FILE
from autotune.report.collect_report import tool_calls_line
from autotune.report.columns import REPLICA_COLUMNS, terminal_table
from autotune.report.diagnose_report import (
    GROUP_COLUMNS,
    LATENCY_COLUMNS,
    PROBE_COLUMNS,
    time_scale_note,
    verdict_line,
)
from autotune.report.sweep_report import (
    SPLIT_COLUMNS,
    ValidationWording,
    alternative_text,
    gpu_rows,
    share_text,
    split_rows,
    validated_text,
)
from autotune.results.diagnosis import DiagnoseResult
from autotune.results.runs import CollectSummary, LoopSummary
from autotune.results.stages import STAGES
from autotune.results.trials import Recommendation, Snippets, SweepResult

if TYPE_CHECKING:
    from autotune.probe.status import ProbeStatus
    from autotune.results.trials import TrialOutcome


BAR_EVERY_S = 0.2  # a terminal's bar is redrawn at most this often
LINE_EVERY_S = 10.0  # a log (stderr not a terminal) gets a progress line this often
_BAR_WIDTH = 20
_ERASE_LINE = "\r\x1b[K"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _Status:
    """Where progress goes: on a terminal one line redrawn in place; in a log (a pipe, a
    file) a plain line now and then, never a carriage return."""

    def __init__(self, stream: TextIO, live: bool) -> None:
        self.stream = stream
        self.live = live
        self.colour = live and not os.environ.get("NO_COLOR")  # https://no-color.org
        self.every_s = BAR_EVERY_S if live else LINE_EVERY_S
        self._next = 0.0
        self._shown = ""

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def show(self, text: str) -> None:
        """The current status: redrawn in place, or written as the next log line."""
        self._next = time.monotonic() + self.every_s
        self._shown = text
        if self.live:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write(_ERASE_LINE + self._fit(text, width))
        else:
            head, _, tail = text.partition(_BAR_MARK)
            self.stream.write(head.rstrip() + tail.partition(_BAR_MARK)[2] + "\n")
        self.stream.flush()

    def line(self, text: str) -> None:
        """A line that stays (above the bar, which is drawn again under it)."""
        if self.live and self._shown:
            self.stream.write(_ERASE_LINE)
        self.stream.write(text + "\n")
        if self.live and self._shown:
            self.show(self._shown)
        self.stream.flush()

    def close(self, keep: bool) -> None:
        """Leave the last bar on its own line (`keep`), or erase it."""
        if self.live and self._shown:
            self.stream.write("\n" if keep else _ERASE_LINE)
            self.stream.flush()

    def _fit(self, text: str, width: int) -> str:
        """The bar's text cut to the terminal's width, its bar coloured unless NO_COLOR."""
        head, _, tail = text.partition(_BAR_MARK)
        bar, _, rest = tail.partition(_BAR_MARK)
        plain = head + bar + rest
        if len(plain) > width:  # a narrow terminal: the figures matter more than the bar
            return (head.rstrip() + rest)[:width]
        if self.colour and bar:
            bar = f"\x1b[32m{bar}\x1b[0m"
        return head + bar + rest


_BAR_MARK = "\x00"  # brackets the bar in a status text, so that it can be coloured or left out


class Progress:
    """The progress of a job that does a known number of things (rollouts, trials): a bar
    with the count, the rate and the ETA. The rate is completions per second since the
    total was set, the quantity collect's closing summary reports; failures count toward
    the ETA, not the rate. Cheap per rollout: it draws only when its status is due."""

    def __init__(self, status: _Status | None, unit: str, total: int | None = None) -> None:
        self._status = status
        self.unit = unit
        self.total = total
        self.done = 0
        self.failed = 0
        self.started = self.last = time.monotonic()  # `last`: the latest completion

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None:
        self.done += 1
        self._tick()

    def rollout_failed(self, failure_class: str) -> None:
        self.failed += 1
        self._tick()

    def _tick(self) -> None:
        self.last = time.monotonic()
        if self._status is not None and self._status.due():
            self._status.show(self.text())

    def set_total(self, total: int) -> None:
        """The count to reach; the clock (and the rate) starts now."""
        self.total, self.done, self.failed = total, 0, 0
        self.started = self.last = time.monotonic()
        if self._status is not None:
            self._status.show(self.text())

    def write(self, line: str) -> None:
        """A line for the person watching (above the bar; on stderr even when quiet)."""
        if self._status is not None:
            self._status.line(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def text(self, final: bool = False) -> str:
        """The status line; `final`: timed to the last completion, as the summary is."""
        elapsed = (self.last if final else time.monotonic()) - self.started
        finished = self.done + self.failed
        parts = [f"{finished:,}" + (f"/{self.total:,}" if self.total else "") + f" {self.unit}s"]
        if self.total:
            share = min(1.0, finished / self.total)
            filled = round(share * _BAR_WIDTH)
            bar = "█" * filled + "░" * (_BAR_WIDTH - filled)
            parts[0] += f" {share:4.0%} {_BAR_MARK}{bar}{_BAR_MARK}"
        parts.append(f"{self.done / elapsed if elapsed > 0 else 0:,.2f} {self.unit}s/s")
        if self.failed:
            parts.append(f"{self.failed:,} failed")
        if self.total and finished and finished < self.total:
            parts.append(f"ETA {_clock((self.total - finished) * elapsed / finished)}")
        parts.append(f"elapsed {_clock(elapsed)}")  # last: the first cut on a narrow terminal
        return "  ".join(parts)


def _status(enabled: bool) -> _Status | None:
    """stderr's status line: live on a terminal (not TERM=dumb), plain lines otherwise."""
    if not enabled:
        return None
    live = sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    return _Status(sys.stderr, live)


@contextmanager
def progress_bar(enabled: bool, unit: str, total: int | None = None) -> Iterator[Progress]:
    """Progress on stderr (see Progress and _Status); nothing when disabled (--quiet)."""
    status = _status(enabled)
    progress = Progress(status, unit, total)
    try:
        yield progress
    except BaseException:
        if status is not None:
            status.close(keep=False)  # the error sentence stands on its own line
        raise
    if status is not None:
        final = progress.text(final=True)  # the final count, whatever the schedule...
        if status.live or final != status._shown:  # ...once in a log
            status.show(final)
        status.close(keep=True)


def _probe_text(index: int, count: int, status: ProbeStatus) -> str:
    number = f"{index + 1}/{count}" if index < count else f"{index + 1} (one more round)"
    head = f"block {number} at parallelism {status.parallelism}: {status.phase}"
    if status.phase == "warm-up":
        return (
            f"{head}, {status.completed:,} rollouts done, {status.phase_s:.1f} s "
            "(until every slot has finished one)"
        )
    if status.rate is None or status.halfwidth is None:  # too few completions for a rate
        measured = f"{status.phase_s:.1f} s measured"
    else:
        measured = (
            f"{status.rate:,.3g} rollouts/s (wall clock) ±{status.halfwidth:.1%}, "
            f"{status.phase_s:.1f} s measured"
        )
    if status.phase == "drain":
        return f"{head} (the rollouts in flight finish, uncounted); {measured}"
    if status.phase == "measuring":
        stop = f"stops at ±{status.target_halfwidth:.0%} or {status.max_s:.3g} s"
        return f"{head} {measured}; {stop}"
    return head


@contextmanager
def probe_progress(
    enabled: bool, count: int
) -> Iterator[Callable[[int, ProbeStatus], None] | None]:
    """Each probe block's progress (warm-up, measuring with its interval, drain) on stderr: one
    line redrawn on a terminal, a line per phase and every LINE_EVERY_S in a log. None
    when disabled, so that a quiet probe computes no status at all."""
    status = _status(enabled)
    if status is None:
        yield None
        return
    phase = [""]

    def watch(index: int, probe: ProbeStatus) -> None:
        key = f"{index}:{probe.phase}"
        if key != phase[0] or status.due():
            phase[0] = key
            status.show(_probe_text(index, count, probe))

    try:
        yield watch
    finally:
        status.close(keep=False)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f}"


def loop_summary_text(summary: LoopSummary) -> str:
    """The closing summary of `autotune loop`, for people."""
    lines = []
    if summary.simulated:
        lines.append("SIMULATED: these figures come from autotune's simulated vLLM-like server.")
    bound = f", at most {summary.max_ahead} groups ahead" if summary.mode == "async" else ""
    if summary.max_staleness is not None:
        bound += f", older than {summary.max_staleness} versions dropped"
    stale = summary.staleness_histogram
    lines += [
        f"model {summary.model} at {summary.base_url}",
        f"mode          {summary.mode}: {summary.batch_groups} groups of "
        f"{summary.group_size} a step{bound}; pause {summary.pause_mode} "
        f"({summary.pause_source})",
        f"trained       {summary.trained_samples:,} samples in {len(summary.steps)} steps, "
        f"{summary.trained_samples_per_s:,.2f} samples/s over {summary.elapsed_s:,.1f} s",
        f"time          trainer idle {summary.trainer_idle_share:.0%}, generator idle "
        f"{summary.generator_idle_share:.0%}, syncing {summary.sync_share:.0%}",
        "staleness     "
        + (", ".join(f"{k}: {v:,}" for k, v in stale.items()) if stale else "-")
        + (
            f" (p50 {summary.staleness_p50:g}, p95 {summary.staleness_p95:g}, "
            f"max {summary.staleness_max})"
            if summary.staleness_p50 is not None and summary.staleness_p95 is not None
            else ""
        ),
        f"pause/resume  {_ms(summary.pause_s.mean)} / {_ms(summary.resume_s.mean)} ms mean",
    ]
    ends = [
        (summary.dropped_stale_samples, "dropped as stale"),
        (summary.aborted_samples, "aborted by a pause and sent again"),
        (summary.failed_samples, "failed"),
        (summary.cancelled_samples, "cancelled at the end"),
        (summary.untrained_samples, "complete but not trained at the end"),
    ]
    if any(n for n, _ in ends):
        lines.append("samples       " + ", ".join(f"{n:,} {what}" for n, what in ends if n))
    return "\n".join(lines)


def collect_summary_text(summary: CollectSummary) -> str:
    """The closing summary of `autotune collect`, for people."""
    lines = []
    if summary.simulated:
        lines.append("SIMULATED: these figures come from autotune's simulated vLLM-like server.")
    reward = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    lines += [
        f"model {summary.model} at {summary.base_url}"
        + (f" and {len(summary.replicas) - 1} more replica(s)" if summary.replicas else ""),
        f"rollouts      {summary.completed:,} done, {summary.failed:,} failed"
        + (f", {summary.cancelled:,} cancelled" if summary.cancelled else "")
        + (f", {summary.skipped:,} already on disk" if summary.skipped else ""),
        f"throughput    {summary.rollouts_per_s:,.2f} rollouts/s, "
        f"{summary.output_tokens_per_s:,.1f} output tokens/s over {summary.elapsed_s:,.1f} s",
        f"mean reward   {reward}",
        *group_lines(summary),
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
    if summary.tool_calls:
        lines.append(f"tools         {tool_calls_line(summary)}")
    if summary.drift is not None:
        lines.append(f"drift         {summary.drift.message}")
    if summary.concurrency_decreases:
        lines.append(
            f"concurrency   lowered {summary.concurrency_decreases:,}× on 429/503 "
            f"(adaptive): {summary.concurrency_limit_min} at the lowest, "
            f"{summary.concurrency_limit_final} at the end"
        )
    if summary.replicas:
        lines += ["", *terminal_table(REPLICA_COLUMNS, summary.replicas)]
    if summary.output:
        lines.append(f"output        {summary.output}")
    return "\n".join(lines)


def group_lines(summary: CollectSummary) -> list[str]:
    """GRPO groups and batch steps, what an RL trainer sees (none for single rollouts)."""
    lines = []
    groups = summary.groups
    if groups is not None:
        share = "-" if groups.informative_share is None else f"{groups.informative_share:.0%}"
        lines += [
            f"groups        {groups.complete:,} complete ({groups.size} samples each), "
            f"{groups.informative:,} informative ({share})"
            + (f", {groups.incomplete:,} incomplete" if groups.incomplete else ""),
            f"RL goodput    {groups.informative_groups_per_s:,.2f} informative groups/s, "
            f"{groups.informative_tokens_per_s:,.1f} of their output tokens/s",
            f"stragglers    group completion p50 {seconds_text(groups.completion_s.p50)}, "
            f"p95 {seconds_text(groups.completion_s.p95)}; slowest/median sample p50 "
            f"{_ratio(groups.straggler_ratio.p50)}, p95 {_ratio(groups.straggler_ratio.p95)}",
        ]
    batch = summary.batch
    if batch is not None:
        remedies = [f"over-sample {batch.over_sample:g}"] if batch.over_sample else []
        remedies += ["carry-over"] if batch.carry_over else []
        wasted = "-" if batch.cancelled_tokens is None else f"{batch.cancelled_tokens:,}"
        lines += [
            f"batch steps   {len(batch.steps):,} steps of {batch.batch_groups} groups"
            + (f" ({', '.join(remedies)})" if remedies else "")
            + f": step p50 {seconds_text(batch.step_s.p50)}, p95 {seconds_text(batch.step_s.p95)}",
            f"              tail {share_text(batch.tail_share)} of a step, server busy "
            f"{share_text(batch.busy_share)} of {batch.capacity} ({batch.capacity_source}; "
            f"the {batch.busy_source}'s count)",
            f"              {batch.cancelled_samples:,} samples cancelled ({wasted} tokens); "
            f"staleness mean {_ratio(batch.staleness_mean)} steps, max "
            f"{'-' if batch.staleness_max is None else batch.staleness_max}",
        ]
    return lines


def seconds_text(value: float | None) -> str:
    """Seconds as the terminal shows them, "-" for none."""
    return "-" if value is None else f"{value:,.2f} s"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def diagnose_text(result: DiagnoseResult) -> str:
    """The terminal summary of a diagnosis: verdict and how sure it is, probe tables,
    evidence, next step."""
    verdict = result.verdict
    lines = []
    if result.target.simulated:
        lines.append("SIMULATED: measured on autotune's simulated vLLM-like server.")
        note = time_scale_note(result)
        if note:
            lines.append(note)
    lines.append(f"verdict: {verdict_line(result)}")
    if verdict.confidence:
        lines.append(f"confidence: {verdict.confidence}")
    lines.append("")
    lines += terminal_table(PROBE_COLUMNS, result.probes)
    if any(probe.groups for probe in result.probes):
        lines += ["", *terminal_table(GROUP_COLUMNS, result.probes)]
    lines.append("")
    lines += terminal_table(LATENCY_COLUMNS, result.probes)
    gpu = [
        f"  {stats['mean']:.1f}%, {probe.gpu_window}"
        for probe in result.probes
        if (stats := probe.telemetry.get("gpu/gpu_util_pct_mean")) is not None
    ]
    if gpu:
        lines += ["", "GPU utilisation:", *gpu]
    high = max(result.probes, key=lambda probe: probe.parallelism, default=None)
    if high is not None and high.replicas:
        lines += ["", f"replicas at parallelism {high.parallelism}:"]
        lines += terminal_table(REPLICA_COLUMNS, high.replicas)
    lines.append("\nevidence:")
    lines += [f"  - {e.text()}" for e in verdict.evidence]
    lines.append(f"\nnext step: {verdict.next_step}")
    lines += [f"note: {note}" for note in verdict.notes]
    return "\n".join(lines)


class TrialPresenter(Protocol):
    """How a study's objective words what a trial found (sweep/objectives)."""

    def trial_text(self, outcome: TrialOutcome) -> str: ...


class SummaryPresenter(Protocol):
    """How a study's objective sums up its recommendation (sweep/objectives)."""

    def summary_lines(self, result: SweepResult, recommended: Any) -> list[str]: ...


TERMINAL_VALIDATION = ValidationWording(
    not_run="no validation run (budget.validate_rollouts: 0)",
    number=lambda value: f"{value:.3g}",
    held="yes ({figures})",
    failed="NO ({figures}: {problems})",
)


def trial_line(number: int, outcome: TrialOutcome, presenter: TrialPresenter) -> str:
    """One finished trial as the sweep prints it (its reason already free of secrets)."""
    knobs = ", ".join(f"{k}={v}" for k, v in outcome.knobs.items()) or "client only"
    if outcome.infeasible_reason:
        found = f"infeasible: {outcome.infeasible_reason}"
    else:
        found = presenter.trial_text(outcome)
    if outcome.pruned_reason:
        found += f", pruned: {outcome.pruned_reason}"
    if outcome.copied_from is not None:
        return f"trial {number}: {knobs} → {found} (a copy of trial {outcome.copied_from})"
    return f"trial {number}: {knobs} → {found} ({outcome.wall_s:.1f} s)"


def curve_lines(result: SweepResult, rec: Recommendation) -> list[str]:
    """A curve study's recommendation: the configuration, its peak, the parallelism
    recommended and validated, and the lines NeMo Gym, vLLM and OpenRLHF take."""
    knobs = ", ".join(f"{k}={v}" for k, v in rec.server.items()) or "(client only)"
    smallest = rec.smallest_parallelism_at_80pct_of_peak_throughput
    lines = [
        f"best configuration   {knobs}",
        f"peak                 {rec.peak.throughput:.3g} {rec.metric} at parallelism "
        f"{rec.peak.parallelism:.0f}",
        f"recommended          parallelism {rec.recommended.parallelism} "
        f"({rec.recommended.bound_by}) → {rec.recommended.predicted_throughput:.3g} "
        "predicted",
        *(
            [f"instead              {alternative}"]
            if (alternative := alternative_text(rec, lambda x: f"{x:.3g}"))
            else []
        ),
        *(f"{name:<21}{text}" for name, text in gpu_rows(rec)),
        f"validated            {validated_text(rec, TERMINAL_VALIDATION)}",
        f"knee                 parallelism {rec.knee_parallelism:.0f}; 80% of peak "
        f"throughput from parallelism {smallest}",
        f"note                 {rec.note}",
    ]
    splits = split_rows(result)
    if splits:
        lines += ["", *terminal_table(SPLIT_COLUMNS, splits)]
    lines += [
        "",
        f"NeMo Gym   {rec.snippets.nemo_gym}",
        *engine_lines(rec.snippets),
    ]
    return lines


def engine_lines(snippets: Snippets) -> list[str]:
    """The engine's launch line, its options file, and the RL frameworks' lines."""
    rows = [(ENGINES[snippets.engine].title, snippets.serve)]
    rows += [(name, line) for name, line in snippets.frameworks.items()]
    rows += [("OpenRLHF", snippets.openrlhf)] if snippets.engine == "vllm" else []
    lines = [f"{name:<10} {line}" for name, line in rows]
    if snippets.options:
        options = snippets.options.splitlines()
        lines += [f"options    {OPTIONS_FILE}:", *("  " + row for row in options)]
    return lines


def sweep_text(
    result: SweepResult, recommended: Any, directory: Path, presenter: SummaryPresenter
) -> str:
    """The closing summary of a sweep: the recommendation and where the files are."""
    lines = []
    if result.simulated:
        lines.append("SIMULATED: measured on autotune's simulated vLLM-like server.")
    trials = result.completed
    feasible = sum(1 for t in trials if t.feasible)
    lines.append(
        f"study {result.study}: {len(trials)} trials ({feasible} feasible, "
        f"{len(result.pruned)} more pruned, {result.trials_reused} reused), "
        f"{result.probe_s_total:.0f} s of probes"
    )
    if recommended is None:
        lines.append("no feasible configuration: see the failed configurations in the report")
    else:
        lines += presenter.summary_lines(result, recommended)
    lines.append(f"\nreport: {directory / 'index.html'}")
    return "\n".join(lines)
