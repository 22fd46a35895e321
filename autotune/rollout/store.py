"""Rollout files: append-and-flush writing, resume bookkeeping, shard merging.
Why: docs/design/rollout.md.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from autotune.config.collection import CollectConfig
from autotune.errors import UsageError
from autotune.files import write_whole
from autotune.rollout.workload import rollout_key


def failures_path(output: Path) -> Path:
    """`out.jsonl` → `out_failures.jsonl`, beside it."""
    return output.with_name(f"{output.stem}_failures{output.suffix or '.jsonl'}")


def run_path(output: Path) -> Path:
    """`out.jsonl` → `out_run.json`, beside it: the record of the run that made it."""
    return output.with_name(f"{output.stem}_run.json")


RUN_FORMAT = 1
_HEAD_BYTES = 4 << 20  # the hash covers this much of a task file, so a large one costs ms

# The keys of a run record that must match for a resumed run to add the same kind of
# rollout: (what differs, the fix). The rest of a record (input path, --limit, --shard,
# the synthetic task count) says which rollouts of those tasks a run makes; a wider or
# another slice adds rows under their own (task, rollout) keys, never mixes them.
_MUST_MATCH = {
    "tasks": ("tasks were", "pass the same --input (or the same synthetic settings)"),
    "verifier": ("verifier was", "pass the same --verifier"),
    "num_repeats": ("--num-repeats was", "pass the same --num-repeats"),
    "model": ("model was", "collect from the same model (--model, --base-url)"),
}


def input_identity(path: Path) -> dict[str, Any]:
    """A task file's size and the hash of its first 4 MiB: the same tasks wherever the
    file is moved; a changed file, other tasks."""
    with _open_for_reading(path, "task file") as handle:
        head = handle.read(_HEAD_BYTES)
        size = os.fstat(handle.fileno()).st_size
    return {"bytes": size, "sha256_head": hashlib.sha256(head).hexdigest()}


def check_run(output: Path, run: dict[str, Any]) -> None:
    """Refuse to resume `output` when its run record says a different run made it.

    Only keys in both records are compared, so a model not yet known passes, and an
    output from before run records (none beside it) resumes as before.
    """
    path = run_path(output)
    try:
        saved = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return
    except (OSError, orjson.JSONDecodeError):
        saved = None
    if not isinstance(saved, dict):
        raise UsageError(
            f"{path} is not a run record autotune can read; delete it to resume {output} "
            "without checking which run made it."
        )
    for key, (what, fix) in _MUST_MATCH.items():
        if key in saved and key in run and saved[key] != run[key]:
            raise UsageError(
                f"--resume: {output} holds rollouts of another run (its {what} "
                f"{_shown(key, saved)}, now {_shown(key, run)}); {fix}, "
                "or choose another --output-dir."
            )


def _shown(key: str, run: dict[str, Any]) -> str:
    value = run[key]
    if key != "tasks":
        return repr(value)
    if "synthetic" in value:
        spec = value["synthetic"]
        return (
            f"synthetic with seed {spec['seed']}, prompts of {spec['prompt_tokens'][0]}±"
            f"{spec['prompt_tokens'][1]} and outputs of {spec['output_tokens'][0]}±"
            f"{spec['output_tokens'][1]} tokens"
        )
    return f"{run.get('input')} of {value['bytes']:,} bytes, sha256 {value['sha256_head'][:12]}"


def save_run(output: Path, run: dict[str, Any]) -> None:
    """Write `run` beside `output` (whole or not at all: a kill leaves the old one)."""
    path = run_path(output)
    try:
        write_whole(path, orjson.dumps({"format": RUN_FORMAT, **run}, option=orjson.OPT_INDENT_2))
    except OSError as error:
        raise UsageError(
            f"cannot write {path} ({error.strerror}); choose a writable --output-dir."
        ) from None


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
            f"cannot write {path} ({error.strerror}); choose a writable --output-dir."
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
                "or choose another --output-dir."
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
            f"cannot write {output} ({error.strerror}); choose a writable --output-dir."
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


def run_record(config: CollectConfig) -> dict[str, Any]:
    """What makes this run's rollouts what they are, saved beside its output so that
    `--resume` can refuse another run's file (see store.check_run); the model is added
    once the target has named it."""
    tasks: dict[str, Any]
    if config.input is not None:
        tasks = input_identity(config.input)
    else:
        spec = config.synthetic
        tasks = {
            "synthetic": {
                "seed": spec.seed,
                "prompt_tokens": [spec.prompt_tokens_mean, spec.prompt_tokens_std],
                "output_tokens": [spec.output_tokens_mean, spec.output_tokens_std],
            }
        }
    shard = config.shard
    return {
        "tasks": tasks,
        "input": str(config.input) if config.input is not None else None,
        "synthetic_tasks": None if config.input is not None else config.synthetic.num_tasks,
        "verifier": config.verifier,
        "num_repeats": config.num_repeats,
        "limit": config.limit,
        "shard": f"{shard.index}/{shard.count}" if shard is not None else None,
    }
