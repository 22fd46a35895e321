"""A run's step telemetry read from what its framework wrote: a console log (verl, slime,
NeMo RL, TRL, OpenRLHF, prime-rl), a JSONL metrics file, a W&B history export (CSV or
JSON), a TensorBoard event folder, or a Markdown table of runs. The format is named."""

from __future__ import annotations

import csv
import math
import re
import struct
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from autotune.doctor.names import PREFIXES, lookup, metric_names
from autotune.errors import UsageError

KNOWN_FORMATS = (
    "a console log of verl, slime, NeMo RL, TRL, OpenRLHF or prime-rl, a JSONL metrics "
    "file, a W&B history export (CSV or JSON), a TensorBoard event folder or a Markdown "
    "table of runs"
)
# A table of runs names its columns as a framework's metrics less their prefix.
TABLE_PREFIXES = ("timing_s/", "perf/")
STEP_KEYS = ("step", "_step", "Step", "global_step", "training/global_step", "train/global_step")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


@dataclass(slots=True)
class Step:
    """One step's figures, by the table's names (a log's own spelling of a row)."""

    index: int
    values: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class ParsedRun:
    source: str
    format: str
    framework: str
    steps: list[Step]
    notes: list[str] = field(default_factory=list)


def read_runs(path: Path) -> list[ParsedRun]:
    """The runs a file holds: one, or a Markdown table's rows, each a run of one step."""
    if path.is_file() and path.suffix == ".md":
        return _markdown_runs(path)
    return [read_run(path)]


def read_run(path: Path) -> ParsedRun:
    """The run's steps, whichever format holds them; a file this cannot read raises
    UsageError, one sentence naming what it found and the formats it knows."""
    if not path.exists():
        raise UsageError(f"{path} does not exist: pass a run's log, metrics file or export.")
    if path.is_dir() or path.name.startswith("events.out.tfevents"):
        steps, kind = _tensorboard(path), "TensorBoard event files"
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(
                f"{path} is not text (nor a TensorBoard event file): pass {KNOWN_FORMATS}."
            ) from None
        steps, kind = _read_text(path, text)
    run = _named(path, kind, steps)
    if not run.steps:
        raise UsageError(
            f"{path} ({kind}) holds no step time or phase this knows: pass {KNOWN_FORMATS} "
            "(docs/doctor.md lists every metric name read)."
        )
    return run


def _read_text(path: Path, text: str) -> tuple[list[Step], str]:
    stripped = text.lstrip()
    if path.suffix == ".csv":
        return _records(_csv_rows(path, text)), "W&B history export (CSV)"
    if stripped.startswith("[") or (path.suffix == ".json" and stripped.startswith("{")):
        return _records(_json_rows(path, stripped)), "W&B history export (JSON)"
    if stripped.startswith("{") and _is_jsonl(stripped):
        return _records(_jsonl_rows(path, text)), "JSONL metrics"
    return _console(text), "console log"


def _is_jsonl(text: str) -> bool:
    first = text.split("\n", 1)[0].strip()
    return first.startswith("{") and first.endswith("}") and '"' in first


def _jsonl_rows(path: Path, text: str) -> Iterator[dict[str, Any]]:
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            where = "its last line is cut short" if number == len(lines) else f"line {number}"
            raise UsageError(
                f"{path} is JSONL metrics but {where} is not JSON ({line[:60]!r}): pass the "
                "whole file once its run has written it, or follow it with --follow."
            ) from None
        if isinstance(row, dict):
            yield row


def _json_rows(path: Path, text: str) -> Iterator[dict[str, Any]]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise UsageError(
            f"{path} is not whole JSON ({error}): export the run's history again."
        ) from None
    rows = data.get("history", data.get("rows")) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise UsageError(f"{path} is JSON but holds no list of rows: export the run's history.")
    yield from (row for row in rows if isinstance(row, dict))


def _csv_rows(path: Path, text: str) -> Iterator[dict[str, Any]]:
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if not header:
        raise UsageError(f"{path} is an empty CSV file: export the run's history again.")
    # A W&B panel export names columns `RUN - metric` (and `__MIN`/`__MAX` beside them).
    names = [column.rpartition(" - ")[2].strip() for column in header]
    for number, row in enumerate(reader, 2):
        if len(row) != len(names):
            raise UsageError(
                f"{path} row {number} has {len(row)} fields where its header has "
                f"{len(names)}: the file is cut short or not one export."
            )
        yield {name: value for name, value in zip(names, row, strict=True) if value != ""}


def _records(rows: Iterable[dict[str, Any]]) -> list[Step]:
    """Metrics files: one row a step (its step key, else its position)."""
    steps: dict[int, Step] = {}
    for position, row in enumerate(rows):
        marks = (_number(row.get(key)) for key in STEP_KEYS)
        index = next((int(mark) for mark in marks if mark is not None), position)
        step = steps.setdefault(index, Step(index))
        for name, raw in row.items():
            value = _number(raw)
            found = lookup(name)
            if found is not None and value is not None:
                step.values[found.name] = value
    return [step for _, step in sorted(steps.items()) if step.values]


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        return float(raw) if math.isfinite(raw) else None
    if isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if math.isfinite(value) else None
    return None


def _console(text: str) -> list[Step]:
    """A console log: each of the table's names followed by a value; a step begins at a
    step mark (verl, NeMo RL, OpenRLHF, tqdm), or, in a log without marks, where a name
    comes again or another framework's names begin (a log quoting another run beside its
    own). Lines starting with `#` are comments."""
    marked = False  # a log with step marks starts a step only at one
    steps: list[Step] = []
    current: Step | None = None
    for _, kind, index, name, value in _events(text):
        if kind == "tqdm":  # TRL: the step's time is tqdm's seconds an iteration
            marked = True
            if current is None or current.index != index:
                current = Step(index)
                steps.append(current)
            current.values[name] = value
            continue
        if kind == "mark":
            marked = True
            current = Step(index)
            steps.append(current)
            continue
        found = metric_names()[name]  # the pattern matches the table's names only
        if current is None or (
            not marked
            and (found.name in current.values or _framework(current) not in (None, found.framework))
        ):
            current = Step(steps[-1].index + 1 if steps else 1)
            steps.append(current)
        current.values[found.name] = value
    return [step for step in steps if step.values]


Event = tuple[int, str, int, str, float]  # where, what, a step's index, a name, its value
_MARKS = (  # where a step begins
    re.compile(r"step:(\d+)\b"),  # verl
    re.compile(r"Step (\d+)/\d+"),  # NeMo RL
    re.compile(r"Global step (\d+)"),  # OpenRLHF
)
_TQDM = re.compile(rf"\b(\d+)/\d+ \[[^\]\n]*?({_NUMBER})s/it")  # TRL's step time
_COMMENTS = re.compile(r"^[ \t]*#.*$", re.M)
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_/.-")


def _events(text: str) -> list[Event]:
    """Every step mark and every table name with its value, in the text's order: one
    pass of one pattern, the table's names as a trie (a long log is read at the pace of
    the regex's first-character scan); a name at a word's start, or after a logger's
    prefix, counts."""
    found: list[Event] = [
        (pair.start(), "pair", 0, pair[1], float(pair[2]))
        for pair in _pairs().finditer(text)
        if not pair.start() or text[pair.start() - 1] not in _WORD or _prefixed(text, pair.start())
    ]
    for pattern in _MARKS:
        for mark in pattern.finditer(text):
            if not mark.start() or text[mark.start() - 1] not in _WORD:
                found.append((mark.start(), "mark", int(mark[1]), "", 0.0))
    if "s/it" in text:
        for bar in _TQDM.finditer(text):
            found.append(
                (bar.start(), "tqdm", int(bar[1]), "train_runtime_per_step", float(bar[2]))
            )
    found.sort()
    if "#" in text:
        comments = [(m.start(), m.end()) for m in _COMMENTS.finditer(text)]
        starts = [start for start, _ in comments]
        found = [event for event in found if not _inside(event[0], starts, comments)]
    return found


@cache
def _pairs() -> re.Pattern[str]:
    """A table name (the longest that fits) and the number after it: `name:1.5`,
    `'name': 1.5`, `name=1.5`, `• Total step time: 66.55s`."""
    return re.compile(rf"({_trie(list(metric_names()))})['\"]?[ \t]*[:=][ \t]*({_NUMBER})")


def _trie(words: list[str]) -> str:
    """A regex of `words` as a trie: alternatives share their prefixes, so a position
    that starts none of them fails at its first character."""
    children: dict[str, list[str]] = {}
    ends = False
    for word in words:
        if word:
            children.setdefault(word[0], []).append(word[1:])
        else:
            ends = True
    branches = [re.escape(first) + _trie(rest) for first, rest in sorted(children.items())]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    return f"(?:{body})?" if ends else body


def _prefixed(text: str, at: int) -> bool:
    """Whether a logger's prefix (`train/`, `timing/train/`) at a word's start ends at `at`."""
    for prefix in PREFIXES:
        begins = at - len(prefix)
        if begins >= 0 and text.startswith(prefix, begins):
            return not begins or text[begins - 1] not in _WORD
    return False


def _inside(at: int, starts: list[int], spans: list[tuple[int, int]]) -> bool:
    index = bisect_right(starts, at) - 1
    return index >= 0 and spans[index][0] <= at < spans[index][1]


def _framework(step: Step) -> str | None:
    """The framework most of a step's names belong to (the first of a tie)."""
    counts = Counter(row.framework for row in map(lookup, step.values) if row is not None)
    return counts.most_common(1)[0][0] if counts else None


def _named(path: Path, kind: str, steps: list[Step]) -> ParsedRun:
    """The run with its framework, the one most of its steps belong to (the first of a
    tie); steps of another framework (a log quoting another run) are left out, and said."""
    of_step = [_framework(step) for step in steps]
    counts = Counter(of_step)
    framework = counts.most_common(1)[0][0] if counts else None
    own = [step for step, of in zip(steps, of_step, strict=True) if of == framework]
    run = ParsedRun(str(path), f"{framework} {kind}", framework or "unknown", own)
    others = Counter(of for of in of_step if of != framework)
    for other, count in others.items():
        run.notes.append(
            f"{count} step(s) of {other} figures in the same file left out: the file quotes "
            f"another run beside this {framework} one"
        )
    return run


def _markdown_runs(path: Path) -> list[ParsedRun]:
    """A Markdown table whose columns are metric names (a paper's or a doc's comparison):
    each row a run, named by its text columns; `-` is a figure the run has not."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.lstrip().startswith("|")
    ]
    rows = [row for row in rows if not all(set(cell) <= set("-: ") for cell in row)]
    runs = []
    if rows:
        header = rows[0]
        columns = {i: _table_name(name) for i, name in enumerate(header)}
        for number, row in enumerate(rows[1:], 1):
            values = {
                found: value
                for i, cell in enumerate(row)
                if (found := columns.get(i)) is not None and (value := _number(cell)) is not None
            }
            label = ", ".join(
                cell
                for i, cell in enumerate(row)
                if columns.get(i) is None and _number(cell) is None
            )
            if values:
                run = _named(path, "Markdown table of runs", [Step(1, values)])
                run.source = f"{path} (row {number}: {label})"
                runs.append(run)
    if not runs:
        raise UsageError(f"{path} has no table of step figures this knows: pass {KNOWN_FORMATS}.")
    return runs


def _table_name(column: str) -> str | None:
    for name in (column, *(prefix + column for prefix in TABLE_PREFIXES)):
        found = lookup(name)
        if found is not None:
            return found.name
    return None


# -- TensorBoard: TFRecord framing around `Event` protocol buffers, read without TensorFlow --


def _tensorboard(path: Path) -> list[Step]:
    files = sorted(path.rglob("events.out.tfevents*")) if path.is_dir() else [path]
    if not files:
        raise UsageError(
            f"{path} is a folder without TensorBoard event files: pass {KNOWN_FORMATS}."
        )
    steps: dict[int, Step] = {}
    for file in files:
        for index, tag, value in _scalars(file):
            found = lookup(tag)
            if found is not None:
                steps.setdefault(index, Step(index)).values[found.name] = value
    return [step for _, step in sorted(steps.items())]


def _scalars(file: Path) -> Iterator[tuple[int, str, float]]:
    data = file.read_bytes()
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        start, end = offset + 12, offset + 12 + length
        if end + 4 > len(data):
            raise UsageError(
                f"{file} ends inside a record: the event file is cut short; pass it once "
                "its run has flushed it."
            )
        yield from _event(data[start:end])
        offset = end + 4


def _fields(buffer: bytes) -> Iterator[tuple[int, int, Any]]:
    """A protocol buffer's (field, wire type, value): varints, 64-bit, bytes, 32-bit."""
    position = 0
    while position < len(buffer):
        key, position = _varint(buffer, position)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, position = _varint(buffer, position)
        elif wire == 1:
            value, position = buffer[position : position + 8], position + 8
        elif wire == 2:
            size, position = _varint(buffer, position)
            value, position = buffer[position : position + size], position + size
        elif wire == 5:
            value, position = buffer[position : position + 4], position + 4
        else:
            return
        yield number, wire, value


def _varint(buffer: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def _event(record: bytes) -> Iterator[tuple[int, str, float]]:
    """An Event's scalars: step (field 2), summary (5) of values (1) with a tag (1) and a
    simple_value (2) or a one-number tensor (8: float_val 5, double_val 6, content 4)."""
    step, summaries = 0, []
    for number, _, value in _fields(record):
        if number == 2:
            step = value
        elif number == 5:
            summaries.append(value)
    for summary in summaries:
        for number, _, entry in _fields(summary):
            if number != 1:
                continue
            tag, scalar = "", None
            for field_number, wire, item in _fields(entry):
                if field_number == 1:
                    tag = item.decode("utf-8", "replace")
                elif field_number == 2 and wire == 5:
                    scalar = struct.unpack("<f", item)[0]
                elif field_number == 8:
                    scalar = _tensor_scalar(item)
            if tag and scalar is not None:
                yield step, tag, scalar


def _tensor_scalar(tensor: bytes) -> float | None:
    dtype = 1
    for number, wire, value in _fields(tensor):
        if number == 1:
            dtype = value
        elif number == 5 and wire == 5:
            return float(struct.unpack("<f", value)[0])
        elif number == 5 and wire == 2 and len(value) >= 4:
            return float(struct.unpack_from("<f", value)[0])
        elif number == 6 and wire == 1:
            return float(struct.unpack("<d", value)[0])
        elif number == 4 and len(value) in (4, 8):
            return float(struct.unpack("<f" if dtype == 1 else "<d", value)[0])
    return None
