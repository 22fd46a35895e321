"""Rollout files: append-and-flush writing, resume bookkeeping, shard merging.

Each finished rollout is one JSONL line, written and flushed as it finishes, so a
killed run (kill -9 included) loses at most the line being written; `--resume` cuts
that truncated tail off and skips every (task, rollout) already on disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from autotune.errors import UsageError
from autotune.workload import rollout_key


def failures_path(output: Path) -> Path:
    """`out.jsonl` → `out_failures.jsonl`, beside it."""
    return output.with_name(f"{output.stem}_failures{output.suffix or '.jsonl'}")


def _repair_tail(path: Path) -> None:
    """Cut a last line that a kill left without its newline."""
    size = path.stat().st_size
    if size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        # Walk back to the previous newline; everything after it is a partial row.
        position = size
        while position > 0:
            step = min(65536, position)
            handle.seek(position - step)
            block = handle.read(step)
            cut = block.rfind(b"\n")
            if cut != -1:
                handle.truncate(position - step + cut + 1)
                return
            position -= step
        handle.truncate(0)


def completed_keys(path: Path) -> set[int]:
    """Keys (see workload.rollout_key) of every complete row in a rollout file."""
    keys: set[int] = set()
    if not path.exists():
        return keys
    _repair_tail(path)
    with path.open("rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                keys.add(rollout_key(row["_ng_task_index"], row["_ng_rollout_index"]))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise UsageError(
                    f"{path} line {line_number} is not a rollout row autotune wrote; "
                    "resume needs the file a previous `autotune collect` produced."
                ) from None
    return keys


class RolloutSink:
    """Appends rollout rows and failure rows; `None` output keeps nothing (probes)."""

    def __init__(self, output: Path | None, resume: bool) -> None:
        self.output = output
        self._rows: BinaryIO | None = None
        self._failures: BinaryIO | None = None
        self.done: set[int] = set()
        if output is None:
            return
        if output.exists() and output.stat().st_size > 0 and not resume:
            raise UsageError(
                f"{output} already holds rollouts; pass --resume to continue it, "
                "or choose another --output."
            )
        if resume:
            self.done = completed_keys(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        self._rows = output.open("ab", buffering=0)

    def write(self, row: dict[str, Any]) -> None:
        if self._rows is not None:
            # One unbuffered write per row: on disk (page cache) the moment it returns.
            self._rows.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))

    def write_failure(self, row: dict[str, Any]) -> None:
        if self.output is None:
            return
        if self._failures is None:
            self._failures = failures_path(self.output).open("ab", buffering=0)
        self._failures.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        for handle in (self._rows, self._failures):
            if handle is not None:
                os.fsync(handle.fileno())
                handle.close()
        self._rows = self._failures = None


def merge_rollouts(inputs: list[Path], output: Path) -> tuple[int, int]:
    """Join shard outputs into one file, dropping repeated (task, rollout) rows.

    Returns (rows written, duplicates dropped). Refuses to overwrite an existing file.
    """
    if output.exists():
        raise UsageError(f"{output} already exists; choose a new merged file name.")
    for path in inputs:
        if not path.is_file():
            raise UsageError(f"shard file {path} does not exist; check the paths given to merge.")
    seen: set[int] = set()
    written = dropped = 0
    try:
        with output.open("wb") as out:
            for path in inputs:
                written, dropped = _merge_one(path, out, seen, written, dropped)
    except UsageError:
        output.unlink(missing_ok=True)
        raise
    return written, dropped


def _merge_one(
    path: Path, out: BinaryIO, seen: set[int], written: int, dropped: int
) -> tuple[int, int]:
    """Copy one shard's new rows into `out`; returns the running (written, dropped)."""
    with path.open("rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                key = rollout_key(row["_ng_task_index"], row["_ng_rollout_index"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                if not line.endswith(b"\n"):
                    continue  # a truncated last line from a killed run
                raise UsageError(
                    f"{path} line {line_number} is not a rollout row; "
                    "merge only files that `autotune collect` wrote."
                ) from None
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            out.write(line)
            written += 1
    return written, dropped
