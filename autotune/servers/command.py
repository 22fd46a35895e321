"""A user's own collector command, run as autotune runs a server: in its own process
group, stopped with it on Ctrl-C, on cancellation and on errors.
Why: docs/design/servers.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from collections.abc import Callable
from pathlib import Path

from autotune.errors import UsageError
from autotune.servers.launcher import _die_with_parent

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


def _stop_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)


async def run_to_completion(
    argv: list[str], log_path: Path, poll: Callable[[], None]
) -> tuple[int, float, float]:
    """Run to completion, calling `poll` every POLL_S; returns (exit status, start, end)."""
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
                poll()
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
