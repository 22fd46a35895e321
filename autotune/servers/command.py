"""The user's own collector as the thing measured (`kind: command`).

A NeMo Gym user tunes NeMo Gym itself: autotune runs their collection command with
`{parallelism}`, `{output}` and `{limit}` filled in, e.g.

    ng_collect_rollouts +input_jsonl_fpath=tasks.jsonl +output_jsonl_fpath={output}
        +limit={limit} +num_samples_in_parallel={parallelism}

and watches the rollout JSONL it writes. Each row's arrival is timed, so the rate is
measured in steady state like any probe's: from the moment every slot has finished
a rollout until the last `parallelism` rows (the drain), leaving the command's own
start-up and wind-down out. A command that writes its rows only at the end is timed
as a whole instead (`stop_reason` says which). The command runs in its own process
group and is stopped with it on Ctrl-C, on cancellation, and on errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from pathlib import Path

from autotune.errors import CollectionError, UsageError
from autotune.probe import ProbeResult
from autotune.results import STAGES, StageLatency
from autotune.servers.launcher import _die_with_parent, last_error_line
from autotune.stats import batch_means_rate
from autotune.telemetry import GpuSampler, TelemetryRecorder, summarise

PLACEHOLDERS = ("{parallelism}", "{output}", "{limit}")
POLL_S = 0.1
STOP_GRACE_S = 10.0


def command_argv(template: str, parallelism: int, output: Path, limit: int) -> list[str]:
    """The template split as a shell would, with the placeholders filled in.

    Only these three placeholders are replaced, so other braces (Hydra overrides,
    JSON) pass through untouched.
    """
    for needed in ("{parallelism}", "{output}"):
        if needed not in template:
            raise UsageError(
                f"the command template has no {needed}; autotune sets the parallelism and "
                "reads the rollouts it writes, e.g. '... +num_samples_in_parallel="
                "{parallelism} +output_jsonl_fpath={output}'."
            )
    try:
        argv = shlex.split(template)
    except ValueError as error:
        raise UsageError(
            f"the command template cannot be split ({error}); check its quotes."
        ) from None
    values = (str(parallelism), str(output), str(limit))
    filled = []
    for arg in argv:
        for placeholder, value in zip(PLACEHOLDERS, values, strict=True):
            arg = arg.replace(placeholder, value)
        filled.append(arg)
    return filled


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


def _stop_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)


async def _run(argv: list[str], log_path: Path, watcher: _RowWatcher) -> tuple[int, float, float]:
    """Run to completion, polling the output; returns (exit status, start, end)."""
    with log_path.open("wb") as log:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            raise UsageError(
                f"cannot run {argv[0]!r} ({error.strerror}); check the command template."
            ) from None
        started = time.time()
        try:
            while process.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), POLL_S)
                watcher.poll()
        finally:
            if process.returncode is None:  # cancelled or interrupted: stop its whole group
                _stop_group(process)
                try:
                    await asyncio.wait_for(asyncio.shield(process.wait()), STOP_GRACE_S)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
            else:  # it exited: end any process it left running in its group
                _stop_group(process)
        return process.returncode or 0, started, time.time()


def _window(
    arrivals: list[float], parallelism: int, started: float, ended: float
) -> tuple[float, float, str]:
    """The steady-state window: after every slot finished a rollout, before the drain.

    Rows are stamped at the poll that saw them, so the window runs between two polls'
    stamps (shifted half a poll, so that it counts exactly the rows seen after the
    first stamp and up to the second). Too few rows, or all at once: the whole run.
    """
    if len(arrivals) > 2 * parallelism:
        first, last = arrivals[parallelism - 1], arrivals[-parallelism]
        if last > first:
            return first + POLL_S / 2, last + POLL_S / 2, "rows timed"
    return started, ended + POLL_S / 2, "whole run timed"


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
        status, started, ended = await _run(argv, log_path, watcher)
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
    start, end, reason = _window(arrivals, parallelism, started, ended)
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
        stop_reason=reason,
        latency_s={stage: StageLatency.of([]) for stage in STAGES},
        errors_by_class={},
        rate_limited_responses=0,
        retry_after_seen=0,
        limiter_wait_share=0.0,
        verifier_capacity=None,
        verifier_busy_fraction=None,
        verifier_capacity_rps=None,
        telemetry=summarise(recorder.samples, start, end),
        telemetry_unavailable=dict(recorder.unavailable),
        token_check=None,
    )
