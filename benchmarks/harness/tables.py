"""Aligned tables of figures, their columns laid out as an f-string's format specs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_SPEC = re.compile(r"([<>]?)(\d*)(.*)")


@dataclass(frozen=True, slots=True)
class Col:
    """A table column: its header, width, the format of its values, and its alignment."""

    head: str
    width: int = 0
    spec: str = ""
    left: bool = False

    @classmethod
    def parse(cls, text: str) -> Col:
        """A column from "head:spec", the spec as in an f-string: alignment (right unless
        `<`), width, then the values' format: "goodput/s:10.2f", "remedy:<20", ":<28"."""
        head, _, spec = text.strip().rpartition(":")
        align, width, rest = _SPEC.fullmatch(spec).groups()  # type: ignore[union-attr]
        return cls(head, int(width or 0), rest, align == "<")


def fmt(value: Any, spec: str = "") -> str:
    """`value` in `spec`, "-" where there is none; a string as it is."""
    if isinstance(value, str):
        return value
    return "-" if value is None else format(value, spec)


class Table:
    """Aligned columns, laid out as "head:spec | head:spec | ..." (see Col.parse) or given
    as Cols, `gap` between them. A row is its values in the columns' order, or, with
    `keys` (a column's key a word), a mapping read at them."""

    def __init__(self, layout: str | Sequence[Col], gap: str = "", keys: str = "") -> None:
        self.columns = (
            [Col.parse(c) for c in layout.split("|")] if isinstance(layout, str) else list(layout)
        )
        self.gap = gap
        self.keys = keys.split()

    def row(self, values: Sequence[Any] | Mapping[str, Any]) -> str:
        """One line: each value in its column's format, width and alignment."""
        if isinstance(values, Mapping):
            values = [values.get(k) for k in self.keys]
        cells = [
            f"{fmt(v, c.spec):{'<' if c.left else '>'}{c.width}}"
            for c, v in zip(self.columns, values, strict=True)
        ]
        return self.gap.join(cells).rstrip()

    def header(self) -> str:
        return self.row([c.head for c in self.columns])

    def lines(self, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[str]:
        """The header and a line a row."""
        return [self.header(), *(self.row(values) for values in rows)]
