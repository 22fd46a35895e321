"""A benchmark's end: its targets, each measured figure against its bound, PASS or FAIL,
and the exit status `--check` asks for."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import operator
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from .tables import Table

Figures = dict[str, Any]  # what a benchmark measured, as --json prints it

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}


@dataclass(frozen=True, slots=True)
class Target:
    """A target: the measured figure against its bound (`measured comparison bound`).

    `unit`: "%" for shares (shown as percentages), "x" for ratios, else the unit written
    after the figure; `spec` overrides the figure's format. A target not measured (None)
    is missed."""

    name: str
    measured: Any  # a number, a bool or a word
    bound: Any
    comparison: str = ">="
    unit: str = ""
    spec: str | None = None

    @property
    def passed(self) -> bool:
        return self.measured is not None and COMPARISONS[self.comparison](self.measured, self.bound)

    def show(self, value: Any) -> str:
        if value is None or isinstance(value, str):
            return value or "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if self.unit == "%":
            return format(value, self.spec or ".1%")
        if self.unit == "x":
            return "x" + format(value, self.spec or ".2f")
        plain = isinstance(value, int) or abs(value) >= 1000
        text = format(value, self.spec or (",.0f" if plain else ".3g"))
        return f"{text} {self.unit}" if self.unit else text

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured": self.measured,
            "comparison": self.comparison,
            "bound": self.bound,
            "unit": self.unit,
            "passed": self.passed,
        }


def report_targets(targets: Sequence[Target], check: bool, judged: bool = True) -> int:
    """Prints each target with its measured figure and PASS or FAIL, then the tally; returns
    the exit status: 1 when `check` is asked for and a target was missed. Not `judged` (a
    dry run): the figures only, and 0."""
    if not targets:
        return 0
    rows = [
        (t.name, t.show(t.measured), f"{t.comparison} {t.show(t.bound)}", verdict(t.passed))
        for t in targets
    ]
    if not judged:
        rows = [(*row[:3], "-") for row in rows]
    heads = ("target", "measured", "bound")
    name, measured, bound = (max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads))
    table = Table(f"target:<{name} | measured:{measured + 2} | bound:{bound + 2} | :5", gap="  ")
    print("\n".join(["", *table.lines(rows)]))
    met = sum(t.passed for t in targets)
    if not judged:
        print(f"dry run: {met} of {len(targets)} targets met, not judged")
        return 0
    print(f"{verdict(met == len(targets))}: {met} of {len(targets)} targets met")
    return 1 if check and met < len(targets) else 0


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def run_bench(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    measure: Callable[[argparse.Namespace], Figures | Coroutine[Any, Any, Figures]],
    targets: Callable[[Figures], Sequence[Target]],
    render: Callable[[Figures], str],
) -> int:
    """A benchmark's main: its flags parsed, its figures measured (a coroutine run to its
    end), then `finish`ed against its targets; returns the exit status."""
    args = parser.parse_args(argv)
    result = measure(args)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return finish(result, targets(result), args, render)


def finish(
    result: Figures,
    targets: Sequence[Target],
    args: argparse.Namespace,
    render: Callable[[Figures], str],
) -> int:
    """The end of a benchmark: the figures as JSON (`--json`, the targets and whether all
    passed added) or rendered, then the targets' table; returns the exit status."""
    passed = all(t.passed for t in targets)
    result = {**result, "targets": [t.as_dict() for t in targets], "passed": passed}
    if getattr(args, "json", False):
        import orjson

        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return 1 if args.check and not passed else 0
    print(render(result))
    return report_targets(targets, args.check)
