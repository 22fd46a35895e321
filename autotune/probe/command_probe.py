"""The command probe: a user's own collector (NeMo Gym's, say) run once per parallelism,
each row it writes timed as it lands. Why: docs/design/probes.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import CollectionError
from autotune.results.probes import ProbeResult
from autotune.servers.command import POLL_S, command_argv, run_to_completion
from autotune.servers.launcher import last_error_line
from autotune.stats import batch_means_rate
from autotune.telemetry import GpuSampler, TelemetryRecorder, summarise
from autotune.window import ProbeSettings, steady_window

log = logging.getLogger("autotune")

ROLLOUTS_PER_SLOT = 10  # a run's default {limit}: ten waves of completions to time
FEW_PER_SLOT = 5  # below this, a run's steady window holds too few rows to time it


def rollouts_per_run(limit: int | None, parallelism: int) -> int:
    """A run's `{limit}`: the user's, or ROLLOUTS_PER_SLOT for each slot."""
    if limit is None:
        return ROLLOUTS_PER_SLOT * parallelism
    if limit < FEW_PER_SLOT * parallelism:
        log.warning(
            "--limit %d gives parallelism %d only %.1f rollouts a slot: the rate is timed "
            "after every slot's first rollout and before the drain, which leaves few rows; "
            "omit --limit (%d a slot) or raise it to at least %d.",
            limit, parallelism, limit / parallelism, ROLLOUTS_PER_SLOT,
            FEW_PER_SLOT * parallelism,
        )  # fmt: skip
    return limit


class _RowWatcher:
    """Counts the complete lines of a growing JSONL file and when each appeared."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.arrivals: list[float] = []
        self._offset = 0

    def poll(self) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        now = time.time()
        rows = sum(1 for line in complete.splitlines() if line.strip())
        self.arrivals.extend([now] * rows)


async def run_command_probe(
    template: str, parallelism: int, limit: int, workdir: Path
) -> ProbeResult:
    """Run the user's collector once at `parallelism` and measure its rollouts/s."""
    workdir.mkdir(parents=True, exist_ok=True)
    output = workdir / f"rollouts-p{parallelism}.jsonl"
    output.unlink(missing_ok=True)
    log_path = workdir / f"command-p{parallelism}.log"
    argv = command_argv(template, parallelism, output, limit)
    watcher = _RowWatcher(output)
    async with TelemetryRecorder([GpuSampler()]) as recorder:
        status, started, ended = await run_to_completion(argv, log_path, watcher.poll)
    if status != 0:
        reason = last_error_line(log_path.read_text(errors="replace")) or "no output"
        raise CollectionError(
            f"the command exited with status {status} at parallelism {parallelism} "
            f"({reason}); run it by hand to fix it (log: {log_path})."
        )
    arrivals = watcher.arrivals
    if not arrivals:
        raise CollectionError(
            f"the command wrote no rollout to {output} at parallelism {parallelism}; "
            "check that it writes its rows to {output}."
        )
    # Rows are stamped at the poll that saw them: shifted half a poll, the window counts
    # exactly the rows seen after its first stamp and up to its last.
    window = steady_window(
        arrivals,
        ProbeSettings(parallelism, warmup_s=0.0),
        started=started - POLL_S / 2,
        now=ended,
        mean_latency_s=0.0,
        finished=True,
    )
    assert window is not None  # a finished run always has its window
    start, end = window.start + POLL_S / 2, window.end + POLL_S / 2
    estimate = batch_means_rate(arrivals, start, end)
    return ProbeResult(
        parallelism=parallelism,
        rollouts_per_s=estimate.rate,
        rollouts_per_s_ci=(estimate.low, estimate.high),
        output_tokens_per_s=0.0,
        error_rate=0.0,
        completed=estimate.events,
        failed=0,
        measured_s=end - start,
        warmup_s=start - started,
        stop_reason=window.reason,
        telemetry=summarise(recorder.samples, start, end),
        batches=estimate.batches,
        telemetry_unavailable=dict(recorder.unavailable),
    )


@dataclass(slots=True)
class CommandProbe:
    """Runs the collector once per measured parallelism.

    `tolerate_failures`: a run that fails (the command exits non-zero or writes nothing)
    becomes a point with every rollout failed, so a sweep can go on past it; otherwise
    the CollectionError names its log.
    """

    template: str
    limit: int | None  # rollouts a run; None: ROLLOUTS_PER_SLOT a slot
    workdir: Path
    tolerate_failures: bool = False

    async def measure(self, parallelism: int, settings: ProbeSettings | None = None) -> ProbeResult:
        """One run of the collector: a finished run is timed whole, so `settings` (how
        long to measure) do not apply."""
        limit = rollouts_per_run(self.limit, parallelism)
        try:
            return await run_command_probe(self.template, parallelism, limit, self.workdir)
        except CollectionError as error:
            if not self.tolerate_failures:
                raise
            log.warning("%s", error)
            return ProbeResult(
                parallelism, 0.0, (0.0, 0.0), 0.0, 1.0, 0, 0, 0.0, 0.0, "command failed"
            )
