"""What every command shares: the parser, exit codes, the output convention (`--output-dir`,
`--json`, `--quiet`), flag types. Why: docs/design/cli.md.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import select
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from autotune.errors import UsageError
from autotune.helpformat import DefaultsHelpFormatter

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_GATE = 3  # the run finished but fails its gate (--max-failure-rate, --fail-on)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended

REPORTS = Path("reports")
ROLLOUTS_FILE = "rollouts.jsonl"
SUMMARY_FILE = "summary.json"  # collect's closing summary, beside its rollouts


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C raises KeyboardInterrupt, so that both stop the same way:
    output flushed, worker processes and launched servers stopped (processes.event_loop)."""


def terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


_EXIT_CODES = (
    "exit status: 0 done; 1 a runtime error (one sentence on stderr); 2 a usage error "
    "(a bad flag, file or spec); {gate}130 interrupted (Ctrl-C); 143 terminated (SIGTERM)."
)


def epilog(gate: str = "") -> str:
    """The exit-code paragraph of a command's --help; `gate` says what exit 3 means."""
    return _EXIT_CODES.format(gate=f"3 {gate}; " if gate else "")


class Parser(argparse.ArgumentParser):
    """argparse, its errors one `autotune: error:` sentence like every other error (no
    usage block: the sentence names the flag and points at --help), its --help saying each
    flag's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"autotune: error: {message}; see `{self.prog} --help`.\n")


# -- the output convention ------------------------------------------------------------------


def deprecated(old: str, new: str) -> None:
    """The note an old spelling earns: it works for this release, not the next."""
    print(f"autotune: note: {old} is deprecated and goes in the next release; use {new}.",
          file=sys.stderr)  # fmt: skip


def add_output_dir(parser: argparse._ActionsContainer, default: str) -> None:
    parser.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help=f"the folder this command writes its files in (default: {default})",
    )


def print_result(text: str) -> None:
    """The command's result on stdout, every byte of it. `print` does not retry a short
    write: a large result written into a full pipe that a signal interrupts part-way
    (SIGCHLD, or the kernel's task-work notice) loses all but its first 64 KiB, silently,
    with exit status 0; and a stdout another process made non-blocking refuses writes."""
    stdout = sys.stdout
    try:
        fd = stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # replaced: no file
        stdout.write(f"{text}\n")
        return
    stdout.flush()
    data = memoryview(f"{text}\n".encode())
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            select.select([], [fd], [])


def add_json(parser: argparse._ActionsContainer, what: str, old_path: bool = False) -> None:
    """`--json`: the result on stdout, machine-readable, instead of the text for people.
    `old_path`: the command once took `--json PATH`, which still saves there."""
    help_text = f"print {what} as JSON on stdout instead of the text summary"
    if not old_path:
        parser.add_argument("--json", action="store_true", help=help_text)
        return
    parser.add_argument(
        "--json",
        nargs="?",
        const=True,
        default=False,
        metavar="PATH",
        help=f"{help_text} (`--json PATH`, deprecated, saves it to PATH instead)",
    )


def add_quiet(
    parser: argparse._ActionsContainer, help_text: str = "no progress, only the result"
) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help=help_text)


def json_choice(args: argparse.Namespace) -> tuple[bool, Path | None]:
    """(print JSON on stdout, the file a deprecated `--json PATH` saves it to)."""
    if isinstance(args.json, bool):
        return args.json, None
    if args.json == "-":
        deprecated("--json -", "--json")
        return True, None
    deprecated("--json PATH", "--output-dir DIR, or --json > PATH")
    return False, Path(args.json)


def old_spelling(args: argparse.Namespace, old: str, flag: str, note: tuple[str, str]) -> Any:
    """The value of an old spelling `old` (a namespace key) with its note, refused beside
    --output-dir; None when it was not given."""
    value = getattr(args, old)
    if value is None:
        return None
    if args.output_dir is not None:
        raise UsageError(f"{flag} is the old spelling of --output-dir; pass only one.")
    deprecated(*note)
    return value


def new_run_dir(command: str) -> Path:
    """reports/<command>-<date>-<time>, a folder no earlier run has used."""
    import time

    stem = REPORTS / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = stem, 1
    while candidate.exists():
        n += 1
        candidate = stem.with_name(f"{stem.name}-{n}")
    return candidate


def check_writable_dir(directory: Path, what: str) -> None:
    """A directory that exists and takes files, or can be created; else one UsageError."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{what} cannot be written: {existing} is a file; choose another path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"{what} cannot be written: {existing} is not writable; choose another path."
        )


# -- flag types that no spec field declares ------------------------------------------------


def whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(
                f"must be a whole number of at least {least}, not {text!r}"
            )
        return value

    return parse


def real(expected: str, within: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: a finite number `within` its range (`expected` names it)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and within(value)):
            raise argparse.ArgumentTypeError(f"must be {expected}, not {text!r}")
        return value

    return parse


positive_int = whole(1)
count = whole(0)
positive = real("a number above 0", lambda value: value > 0)
non_negative = real("a number of at least 0", lambda value: value >= 0)
share = real("a share from 0 to 1", lambda value: 0 <= value <= 1)
inner_share = real("a number above 0 and below 1", lambda value: 0 < value < 1)
