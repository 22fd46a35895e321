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


def _row_key(line: bytes) -> int | None:
    """The rollout key of a JSONL line autotune wrote, None for anything else."""
    try:
        row = orjson.loads(line)
        return rollout_key(row["_ng_task_index"], row["_ng_rollout_index"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def _cut_short(line: bytes, after_rows: bool) -> bool:
    """A last line that is a row a kill cut short: no JSON, after rows (or begun like one)."""
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return after_rows or line.startswith(b'{"_ng_')
    return False


def _not_a_rollout_file(path: Path, line_number: int) -> UsageError:
    return UsageError(
        f"{path} line {line_number} is not a rollout row autotune wrote; "
        "resume needs the file a previous `autotune collect` produced."
    )


def _open_for_reading(path: Path, what: str) -> BinaryIO:
    try:
        return path.open("rb")
    except IsADirectoryError:
        raise UsageError(f"{what} {path} is a directory; pass a .jsonl file.") from None
    except OSError as error:
        raise UsageError(
            f"{what} {path} cannot be read ({error.strerror}); check the path and its permissions."
        ) from None


def completed_keys(path: Path) -> set[int]:
    """Keys (see workload.rollout_key) of every complete row in a rollout file.

    A last line that a kill left without its newline is cut off, but only once every
    complete line has proved to be a rollout row: a file autotune did not write (say the
    task file passed as --output by mistake) is refused untouched.
    """
    keys: set[int] = set()
    if not path.exists():
        return keys
    tail_at: int | None = None  # offset of a last line without its newline
    offset = 0
    with _open_for_reading(path, "rollout file") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                if line.strip() and _row_key(line) is None and not _cut_short(line, bool(keys)):
                    raise _not_a_rollout_file(path, line_number)
                tail_at = offset
                break
            offset += len(line)
            if not line.strip():
                continue
            key = _row_key(line)
            if key is None:
                raise _not_a_rollout_file(path, line_number)
            keys.add(key)
    if tail_at is not None:
        # Cut the partial row (a complete one without its newline is made again).
        with path.open("rb+") as handle:
            handle.truncate(tail_at)
    return keys


def _open_for_appending(path: Path) -> BinaryIO:
    """`path` opened unbuffered for appending, its directory created first."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab", buffering=0)
    except OSError as error:
        raise UsageError(
            f"cannot write {path} ({error.strerror}); choose a writable --output path."
        ) from None


class RolloutSink:
    """Appends rollout rows and failure rows; `None` output keeps nothing (probes)."""

    def __init__(self, output: Path | None, resume: bool) -> None:
        self.output = output
        self._rows: BinaryIO | None = None
        self._failures: BinaryIO | None = None
        self.done: set[int] = set()
        if output is None:
            return
        if output.is_dir():
            raise UsageError(
                f"--output {output} is a directory; pass a file in it, "
                f"e.g. --output {output / 'rollouts.jsonl'}."
            )
        if output.exists() and output.stat().st_size > 0 and not resume:
            raise UsageError(
                f"{output} already holds rollouts; pass --resume to continue it, "
                "or choose another --output."
            )
        if resume:
            self.done = completed_keys(output)
        self._rows = _open_for_appending(output)

    def write(self, row: dict[str, Any]) -> None:
        if self._rows is not None:
            # One unbuffered write per row: on disk (page cache) the moment it returns.
            self._rows.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))

    def write_failure(self, row: dict[str, Any]) -> None:
        if self.output is None:
            return
        if self._failures is None:
            self._failures = _open_for_appending(failures_path(self.output))
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
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        out = output.open("xb")
    except OSError as error:
        raise UsageError(
            f"cannot write {output} ({error.strerror}); choose a writable --output path."
        ) from None
    seen: set[int] = set()
    written = dropped = 0
    try:
        with out:
            for path in inputs:
                written, dropped = _merge_one(path, out, seen, written, dropped)
    except OSError as error:
        output.unlink(missing_ok=True)
        raise UsageError(
            f"cannot merge into {output} ({error.strerror}); "
            "check that the shards are readable and the disk has room."
        ) from None
    except UsageError:
        output.unlink(missing_ok=True)
        raise
    return written, dropped


def _merge_one(
    path: Path, out: BinaryIO, seen: set[int], written: int, dropped: int
) -> tuple[int, int]:
    """Copy one shard's new rows into `out`; returns the running (written, dropped)."""
    with _open_for_reading(path, "shard file") as handle:
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
