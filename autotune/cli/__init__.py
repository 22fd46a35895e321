"""Command line: parse, build one validated config, call one job, print. Every error a
user can cause leaves as one `autotune: error:` sentence with a non-zero exit code.
Why, and the codes: docs/design/cli.md and docs/design/errors.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from autotune import __version__
from autotune.cli import bench, collect, diagnose, doctor, loop, merge, report, sim, sweep
from autotune.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Parser,
    Terminated,
    epilog,
    terminate,
)
from autotune.errors import AutotuneError, UsageError

__all__ = ["build_parser", "main"]

# What an interrupted (Ctrl-C) or terminated (SIGTERM) job leaves behind, by command.
_KEPT_ON_INTERRUPT = {
    "sweep": "every finished trial is kept in the study storage (rerun the same command to resume)",
    "diagnose": "nothing was written",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="autotune",
        description="Measure and tune RL rollout collection throughput.",
        epilog=epilog("a command's gate failed (see its --help)"),
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="job", required=True, metavar="COMMAND")
    for command in (collect, diagnose, loop, sweep, doctor, report, merge, bench, sim):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    own, sim_flags = sim.split_sim_serve(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(own)
    args.sim_args = sim_flags
    quiet = getattr(args, "quiet", False)  # only the result: warnings and errors still show
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="autotune: %(message)s",
        stream=sys.stderr,
    )
    handler: Callable[[argparse.Namespace], int] = args.handler
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return handler(args)
    except UsageError as error:
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except AutotuneError as error:
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # the reader (`| head`) has gone: the rest is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as interrupt:
        terminated = isinstance(interrupt, Terminated)
        kept = (
            collect.kept_on_interrupt(args)
            if args.job == "collect"
            else _KEPT_ON_INTERRUPT.get(args.job)
        )
        what = "terminated" if terminated else "interrupted"
        print(f"autotune: {what}{f'; {kept}' if kept else ''}.", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
