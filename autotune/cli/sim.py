"""`autotune sim serve`: the embedded simulated vLLM-like server, with its own flags."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli.common import epilog


def add_parser(commands: Any) -> None:
    sim = commands.add_parser(
        "sim", help="the embedded simulated vLLM-like server", epilog=epilog()
    )
    sim_commands = sim.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")
    serve = sim_commands.add_parser(
        "serve",
        help="serve it (takes vLLM's flag names; see `autotune sim serve --help`)",
        add_help=False,
    )
    serve.set_defaults(handler=run_command)  # its flags: see split_sim_serve


def run_command(args: argparse.Namespace) -> int:
    from autotune.servers.sim.server import main as sim_main

    return sim_main(args.sim_args, prog="autotune sim serve")


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
