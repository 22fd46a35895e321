"""What the benchmarks share: machine identity and a median.

The null server, core pinning and CPU accounting live in `autotune.bench.overhead`, which
`autotune bench` uses too; they are re-exported here for the scripts in this folder.
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from typing import Any

import orjson

from autotune.bench.overhead import NullServer, core_plan, cpu_seconds, pin_self

__all__ = [
    "NullServer",
    "core_plan",
    "cpu_seconds",
    "machine",
    "median",
    "pin_self",
    "print_result",
]


def machine() -> dict[str, Any]:
    """Enough of the machine's identity to tell whether two results are comparable."""
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def print_result(
    result: dict[str, Any], args: argparse.Namespace, render: Callable[[dict[str, Any]], str]
) -> int:
    """Prints the figures (`--json` or the table) and returns the exit status: 1 when
    `--check` was asked for and the target was missed."""
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render(result))
    return 1 if args.check and not result["passed"] else 0
