"""`autotune report`: every output of a job rebuilt from its saved result."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autotune.cli.common import (
    add_json,
    add_output_dir,
    add_quiet,
    epilog,
    old_spelling,
    print_result,
)
from autotune.results.codec import to_json


def add_parser(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="render a report again from its saved results", epilog=epilog()
    )
    report.add_argument(
        "directory",
        type=Path,
        help="a folder a command wrote (its --output-dir), or the JSON file in it",
    )
    add_output_dir(report, "the folder read")
    report.add_argument("--out", type=Path, metavar="DIR", help="deprecated: use --output-dir")
    add_json(report, "the paths written")
    add_quiet(report, "no notes, only the result")
    report.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    from autotune.report.collect_report import write_outputs as collect_outputs
    from autotune.report.diagnose_report import write_outputs as diagnose_outputs
    from autotune.report.doctor_report import write_outputs as doctor_outputs
    from autotune.report.loop_report import write_outputs as loop_outputs
    from autotune.results.diagnosis import DiagnoseResult
    from autotune.results.doctor import DoctorResult
    from autotune.results.runs import CollectResult, LoopResult
    from autotune.results.saved import load_result
    from autotune.sweep.sweep_job import write_outputs as sweep_outputs

    result = load_result(args.directory)
    directory = old_spelling(args, "out", "--out", ("--out DIR", "--output-dir DIR"))
    directory = directory or args.output_dir
    if directory is None:
        directory = args.directory if args.directory.is_dir() else args.directory.parent
    if isinstance(result, DiagnoseResult):
        written = diagnose_outputs(result, directory)
    elif isinstance(result, CollectResult):
        written = collect_outputs(result, directory)
    elif isinstance(result, LoopResult):
        written = loop_outputs(result, directory)
    elif isinstance(result, DoctorResult):
        written = doctor_outputs(result, directory)
    else:
        written = sweep_outputs(result, directory)
    if args.json:
        print_result(to_json({"written": [str(path) for path in written]}).decode())
    else:
        print_result(str(written[-1]))
    return 0
