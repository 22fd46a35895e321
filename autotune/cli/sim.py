"""`autotune sim serve`: the embedded simulated vLLM-like server, with its own flags;
`autotune sim calibrate`: its step model fitted to a table of measured runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cli.common import (
    REPORTS,
    add_json,
    add_output_dir,
    add_quiet,
    epilog,
    print_result,
)

if TYPE_CHECKING:
    from autotune.hardware.calibrated import CalibratedProfile

PROFILE_FILE = "profile.json"


def add_parser(commands: Any) -> None:
    sim = commands.add_parser(
        "sim", help="the embedded simulated vLLM-like server", epilog=epilog()
    )
    sim_commands = sim.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")
    serve = sim_commands.add_parser(
        "serve",
        help="serve it (takes vLLM's flag names, or with --engine SGLang's or TensorRT-LLM's; "
        "see `autotune sim serve --help`)",
        add_help=False,
    )
    serve.set_defaults(handler=run_command)  # its flags: see split_sim_serve
    calibrate = sim_commands.add_parser(
        "calibrate",
        help="fit its step model to measured runs; `sim serve --profile` then uses the fit",
        description="Fit the simulator's step model to one configuration of a table of "
        "measured serving runs (InferenceX's columns), every TP of it at once, and measure "
        "the error the simulator then makes at each point.",
        epilog=epilog(),
    )
    calibrate.add_argument("table", type=Path, help="a CSV of runs in InferenceX's columns")
    calibrate.add_argument(
        "--where",
        required=True,
        metavar="KEY",
        help="the configuration, as COLUMN=VALUE pairs "
        "(hw=h100,model=gpt-oss-120b,image=v0.13.0,isl=1024,osl=1024)",
    )
    calibrate.add_argument(
        "--gpu", default=None, help="the GPU profile (default: the one the table's hw names)"
    )
    calibrate.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        metavar="N",
        help="the token budget of a step the runs were served with (default: vLLM's, 8192)",
    )
    add_output_dir(calibrate, f"{REPORTS / 'calibrate'}; the profile goes to DIR/{PROFILE_FILE}")
    add_json(calibrate, "the profile with its error at each point")
    add_quiet(calibrate, "not each point's error: only the fit's summary and where it went")
    calibrate.set_defaults(handler=run_calibrate)


def run_command(args: argparse.Namespace) -> int:
    from autotune.servers.sim.server import main as sim_main

    return sim_main(args.sim_args, prog="autotune sim serve")


def run_calibrate(args: argparse.Namespace) -> int:
    from autotune.config.knobs import KNOBS
    from autotune.errors import UsageError
    from autotune.hardware.measured import SurfaceError, parse_key
    from autotune.sweep.calibration import calibrate

    try:
        where = parse_key(args.where)
    except SurfaceError as error:
        raise UsageError(f"{str(error).replace('--replay-where', '--where')}.") from None
    budget = args.max_num_batched_tokens
    if budget is None:
        budget = KNOBS.max_num_batched_tokens
    elif budget < 1:
        raise UsageError("--max-num-batched-tokens must be at least 1.")
    output_dir = args.output_dir or REPORTS / "calibrate"
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / PROFILE_FILE
    profile = calibrate(args.table, where, path, args.gpu, budget)
    if args.json:
        print_result(path.read_text())
        return 0
    summary = profile.summary()
    lines = [] if args.quiet else _point_lines(profile)
    lines.append(
        f"{profile.model.name} on {profile.gpu.name}, {summary.points} points: throughput "
        f"error median {summary.throughput_median:.1%}, worst {summary.throughput_worst:.1%}; "
        f"TPOT error median {summary.tpot_median:.1%}, worst {summary.tpot_worst:.1%}"
    )
    lines.append(f"wrote {path}: serve it with `autotune sim serve --profile {path}`")
    print_result("\n".join(lines))
    return 0


def _point_lines(profile: CalibratedProfile) -> list[str]:
    """The table of each measured point against the simulator's, and their errors."""
    lines = [
        f"{'TP':>3} {'conc':>5} {'tokens/s/GPU measured':>22} {'simulated':>10} {'error':>7}"
        f" {'TPOT ms measured':>17} {'simulated':>10} {'error':>7}"
    ]
    for point in profile.points:
        lines.append(
            f"{point.tp:>3} {point.concurrency:>5} {point.measured_tokens_per_s_per_gpu:>22.1f}"
            f" {point.simulated_tokens_per_s_per_gpu:>10.1f} {point.throughput_error:>+7.1%}"
            f" {1e3 * point.measured_tpot_s:>17.2f} {1e3 * point.simulated_tpot_s:>10.2f}"
            f" {point.tpot_error:>+7.1%}"
        )
    return lines


def split_sim_serve(argv: list[str]) -> tuple[list[str], list[str]]:
    """(autotune's arguments, the simulator's) of `autotune [-v] sim serve FLAGS...`.

    The simulator parses its own flags (vLLM's names, its own range checks, its own
    --help); an argparse REMAINDER would lose those that start with `-` (`--port 8000`).
    A `--` right after `serve` is dropped, as a user may write it to mean "the rest is
    the simulator's".
    """
    for index, word in enumerate(argv[:-1]):
        if word == "sim" and argv[index + 1] == "serve":
            rest = argv[index + 2 :]
            return argv[: index + 2], rest[1:] if rest[:1] == ["--"] else rest
        if not word.startswith("-"):
            break
    return argv, []
