"""A tiny page builder for self-contained HTML reports: every function returns a fragment,
and plain-text arguments are always escaped.
Why: docs/design/report.md.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Literal

from autotune.files import write_whole

__all__ = [
    "CSP",
    "CalloutKind",
    "callout",
    "definition_list",
    "format_value",
    "image",
    "page",
    "paragraph",
    "section",
    "svg",
    "table",
    "write_report",
]

#: No fetch of any kind; images only from data: URIs; styles only from the page itself.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

WIDE_TABLE = 10  # columns past which a table is set smaller

CalloutKind = Literal["verdict", "warning", "info"]
_CALLOUT_KINDS: tuple[str, ...] = ("verdict", "warning", "info")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_STYLE = """
:root { color-scheme: light; --ink: #1f2328; --muted: #59636e; --line: #d1d9e0;
  --soft: #f6f8fa; --accent: #0b5cad; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff; line-height: 1.5;
  font: 15px/1.5 -apple-system, "Segoe UI", "Helvetica Neue", Arial, "DejaVu Sans",
  sans-serif; }
.banner { background: #9a3412; color: #fff; font-weight: 700; letter-spacing: .02em;
  padding: .6rem 1.5rem; text-align: center; }
header, main, footer { max-width: 1100px; margin: 0 auto; padding: 0 1.5rem; }
header { padding-top: 1.5rem; }
header > :last-child { padding-bottom: .75rem; border-bottom: 1px solid var(--line); }
h1 { font-size: 1.7rem; margin: 0 0 .25rem; }
.subtitle { color: var(--muted); margin: 0 0 1rem; }
section { margin: 2rem 0; }
h2 { font-size: 1.25rem; margin: 0 0 .75rem; padding-bottom: .3rem;
  border-bottom: 1px solid var(--line); }
p { margin: .5rem 0; }
table { border-collapse: collapse; margin: .75rem 0; font-size: .85rem;
  font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; color: var(--muted); padding: 0 0 .3rem; }
th, td { border-bottom: 1px solid var(--line); padding: .3rem .5rem; text-align: left;
  vertical-align: top; overflow-wrap: break-word; }
th { background: var(--soft); font-weight: 600; border-bottom: 2px solid var(--line); }
table.wide { font-size: .75rem; }
table.wide th, table.wide td { padding: .25rem .35rem; }
tbody tr:nth-child(even) td { background: #fbfcfd; }
td.num, th.num { text-align: right; }
td.num { white-space: nowrap; }
figure { margin: 1rem 0; }
figure img, figure svg.plot { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); font-size: .9rem; }
.callout { border-left: 4px solid; border-radius: 4px; padding: .6rem 1rem; margin: .75rem 0; }
.callout.verdict { border-color: #1a7f37; background: #dafbe1; font-weight: 600; }
.callout.warning { border-color: #bf8700; background: #fff8c5; }
.callout.info { border-color: var(--accent); background: #ddf4ff; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1.25rem;
  margin: .75rem 0; }
dt { font-weight: 600; color: var(--muted); }
dd { margin: 0; overflow-wrap: anywhere; }
footer { color: var(--muted); font-size: .8rem; margin-top: 2rem; padding-bottom: 1.5rem; }
footer p { border-top: 1px solid var(--line); padding-top: .75rem; }
"""


def _text(value: object) -> str:
    """Escape text for element content and double-quoted attributes alike."""
    return escape(str(value), quote=True)


def format_value(value: object) -> str:
    """A cell's text: numbers readable at a glance (thousands separators, ~4 digits)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value)


def _header(name: str) -> str:
    """A column's name, free to wrap after each underscore (`max_num_batched_tokens` is
    one word to a browser), so a table of many such columns still fits the page."""
    return _text(name).replace("_", "_<wbr>")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def paragraph(text: str) -> str:
    """A paragraph of plain text (escaped)."""
    return f"<p>{_text(text)}</p>"


def section(heading: str, *parts: str) -> str:
    """A headed section holding fragments made by the other functions here."""
    return f"<section>\n<h2>{_text(heading)}</h2>\n" + "\n".join(parts) + "\n</section>"


def table(
    columns: Sequence[str], rows: Sequence[Sequence[object]], *, caption: str | None = None
) -> str:
    """A table; every cell is escaped, numbers are formatted and right-aligned."""
    width = len(columns)
    for index, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {index} has {len(row)} cells, the table has {width} columns")
    numeric = [
        bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows) for i in range(width)
    ]
    head = "".join(
        f'<th class="num">{_header(c)}</th>' if numeric[i] else f"<th>{_header(c)}</th>"
        for i, c in enumerate(columns)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{_text(format_value(v))}</td>'
            if _is_number(v)
            else f"<td>{_text(format_value(v))}</td>"
            for v in row
        )
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{_text(caption)}</caption>" if caption is not None else ""
    wide = ' class="wide"' if width > WIDE_TABLE else ""  # smaller type, so it fits the page
    return (
        f"<table{wide}>{cap}<thead><tr>{head}</tr></thead>\n<tbody>\n"
        + "\n".join(body)
        + "\n</tbody></table>"
    )


def image(png: bytes, alt: str, *, caption: str | None = None) -> str:
    """A PNG inlined as a data: URI, so the page needs no file beside it."""
    if not png.startswith(_PNG_SIGNATURE):
        raise ValueError("image() takes PNG bytes (they do not start with the PNG signature)")
    data = base64.b64encode(png).decode("ascii")
    cap = f"<figcaption>{_text(caption)}</figcaption>" if caption is not None else ""
    return f'<figure><img src="data:image/png;base64,{data}" alt="{_text(alt)}">{cap}</figure>'


def svg(markup: str, alt: str, *, caption: str | None = None) -> str:
    """An inline SVG plot made by report.plots: drawn by the page itself, so its parts
    (shaded spans, bands, labelled lines) are elements a reader's tools can find."""
    if not markup.startswith("<svg"):
        raise ValueError("svg() takes an <svg> element made by report.plots")
    cap = f"<figcaption>{_text(caption)}</figcaption>" if caption is not None else ""
    return f'<figure role="img" aria-label="{_text(alt)}">{markup}{cap}</figure>'


def callout(text: str, kind: CalloutKind = "info") -> str:
    """A highlighted box: the verdict a reader looks for first, a warning, or a note."""
    if kind not in _CALLOUT_KINDS:
        raise ValueError(f"callout kind must be one of {', '.join(_CALLOUT_KINDS)}, not {kind!r}")
    return f'<div class="callout {kind}">{_text(text)}</div>'


def definition_list(items: Sequence[tuple[str, str]]) -> str:
    """Name/value pairs (settings, machine identity) as a compact two-column list."""
    rows = "".join(f"<dt>{_text(name)}</dt><dd>{_text(value)}</dd>" for name, value in items)
    return f"<dl>{rows}</dl>"


def page(
    title: str,
    sections: Sequence[str],
    *,
    banner: str | None = None,
    subtitle: str | None = None,
) -> str:
    """A whole self-contained document; `banner` is shown above everything (e.g. SIMULATED)."""
    top = f'<div class="banner" role="note">{_text(banner)}</div>\n' if banner else ""
    sub = f'<p class="subtitle">{_text(subtitle)}</p>' if subtitle else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{_text(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"{top}<header><h1>{_text(title)}</h1>{sub}</header>\n<main>\n"
        + "\n".join(sections)
        + "\n</main>\n<footer><p>Generated by autotune. This page is self-contained: "
        "it loads nothing from the network.</p></footer>\n</body>\n</html>\n"
    )


def write_report(directory: Path, html: str) -> Path:
    """Write `directory/index.html` atomically (a reader never sees half a page)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "index.html"
    write_whole(target, html.encode("utf-8"))
    return target
