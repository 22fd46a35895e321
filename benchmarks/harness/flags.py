"""A benchmark's flags: `bench_args` (the common ones), `rl_flags`, and checked types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def _at_least(low: float, kind: Callable[[str], Any], strict: bool = False) -> Callable[[str], Any]:
    """An argparse type: `kind` of the text, at least `low` (over it when `strict`)."""

    def parse(text: str) -> Any:
        value = kind(text)
        if value < low or (strict and value == low):
            least = "over" if strict else "at least"
            raise argparse.ArgumentTypeError(f"{text}: must be {least} {low:g}")
        return value

    parse.__name__ = kind.__name__  # what argparse names in its error message
    return parse


count = _at_least(1, int)  # 1, 2, ...
count0 = _at_least(0, int)  # 0, 1, ...
positive = _at_least(0, float, strict=True)  # a float over 0


def bench_args(
    doc: str | None,
    *,
    json: bool = True,
    check: bool = True,
    seeds: int | None = None,
    rounds: int | None = None,
) -> argparse.ArgumentParser:
    """The parser every benchmark starts from: its docstring's first line as the description,
    `--json` and `--check`, and where a default is given `--seeds N` and `--rounds R`."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    if seeds is not None:
        parser.add_argument("--seeds", type=count0, default=seeds, help="runs: seeds 0 to N-1")
    if rounds is not None:
        parser.add_argument(
            "--rounds", type=count, default=rounds, help="rounds, the arms alternating in each"
        )
    if json:
        parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    if check:
        parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return parser


def rl_flags(
    parser: argparse.ArgumentParser, batch_groups: int, num_repeats: int, time_scale: float
) -> None:
    """The flags of an RL benchmark on the simulator, with its defaults: steps of
    `--batch-groups` groups of `--num-repeats` samples, at the simulator's `--time-scale`."""
    parser.add_argument("--batch-groups", type=int, default=batch_groups, help="groups a step")
    parser.add_argument("--num-repeats", type=int, default=num_repeats, help="samples a group")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=time_scale,
        help="the simulator's real seconds a simulated second",
    )
