"""`autotune doctor RUN`: a real RL run's telemetry read, where its step time goes, its
bound, and what each remedy would gain."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cli.common import (
    add_json,
    add_output_dir,
    add_quiet,
    epilog,
    positive,
    positive_int,
    print_result,
)
from autotune.errors import AutotuneError, UsageError

if TYPE_CHECKING:
    from autotune.doctor.remedies import Setup


def _split(text: str) -> tuple[int, int]:
    generating, _, training = text.partition(":")
    try:
        split = int(generating), int(training)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not G:T, e.g. 4:12") from None
    if min(split) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: both sides need at least one GPU")
    return split


def _generation(text: str) -> tuple[int, float]:
    gpus, _, seconds = text.partition("=")
    try:
        measured = int(gpus), float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not GPUS=SECONDS, e.g. 4=458") from None
    if measured[0] < 1 or measured[1] <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: GPUS and SECONDS must be positive")
    return measured


def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """What a log does not say and a remedy's prediction needs (doctor, loop --replay)."""
    setup = parser.add_argument_group("the run's setup, for the remedies' predictions")
    setup.add_argument(
        "--gpus",
        type=positive_int,
        metavar="N",
        help="the GPUs the run uses, generation and training together",
    )
    setup.add_argument(
        "--split",
        type=_split,
        metavar="G:T",
        help="asynchronous training's split: G generating, T training GPUs "
        "(default: the best of an eighth to a half generating)",
    )
    setup.add_argument(
        "--separate",
        action="store_true",
        help="the run already generates and trains on separate GPUs "
        "(default: colocated, as --gpus shared)",
    )
    setup.add_argument(
        "--generation-s",
        type=_generation,
        action="append",
        default=[],
        metavar="GPUS=SECONDS",
        help="generation's time measured on another GPU count (repeatable): "
        "it replaces the no-change-to-linear interval there",
    )
    setup.add_argument(
        "--params-b",
        type=positive,
        metavar="B",
        help="the model's parameters, billions (the weight sync's wire floor)",
    )
    setup.add_argument(
        "--link-gbps",
        type=positive,
        metavar="GBPS",
        help="the weight transfer's link, gigabits a second",
    )


def setup_of(args: argparse.Namespace) -> Setup:
    """The setup the flags describe; a split that needs more GPUs than --gpus is refused."""
    from autotune.doctor.remedies import Setup

    if args.split is not None and args.gpus is not None and sum(args.split) > args.gpus:
        raise UsageError(
            f"--split {args.split[0]}:{args.split[1]} needs {sum(args.split)} GPUs and "
            f"--gpus is {args.gpus}; pass a split within them."
        )
    return Setup(
        gpus=args.gpus,
        split=args.split,
        colocated=not args.separate,
        generation_s=dict(args.generation_s),
        params_b=args.params_b,
        link_gbps=args.link_gbps,
    )


def add_parser(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="read an RL run's own telemetry: where its step time goes, what would help",
        epilog=epilog(),
    )
    doctor.add_argument(
        "run",
        type=Path,
        metavar="RUN",
        help="the run's console log, JSONL metrics, W&B export (CSV or JSON), TensorBoard "
        "folder, or a Markdown table of runs",
    )
    doctor.add_argument(
        "--run",
        dest="run_index",
        type=positive_int,
        metavar="K",
        help="which run of a table of runs (default: the first)",
    )
    add_setup_arguments(doctor)
    doctor.add_argument(
        "--follow",
        action="store_true",
        help="read a log still being written: a line a step, until Ctrl-C",
    )
    add_json(doctor, "the diagnosis")
    add_output_dir(doctor, "none: the text only")
    add_quiet(doctor, "no notes, only the result")
    doctor.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    from autotune.doctor.doctor_job import doctor, follow, pick_run
    from autotune.report.doctor_report import doctor_text, write_outputs
    from autotune.results.codec import to_json

    setup = setup_of(args)
    if args.follow:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the following
            follow(args.run, print_result)
    run, notes = pick_run(args.run, args.run_index)
    result = doctor(run, setup, notes)
    print_result(to_json(result).decode() if args.json else doctor_text(result))
    if args.output_dir is not None:
        try:
            page = write_outputs(result, args.output_dir)[-1]
        except OSError as error:
            raise AutotuneError(
                f"could not write {args.output_dir} ({error.strerror}); the diagnosis above "
                "is complete: pass another --output-dir."
            ) from None
        if not args.quiet:
            print(f"report: {page}", file=sys.stderr)
    return 0
