"""`--help` that says each flag's default: autotune's own parser and the simulator's.

Stdlib only, so the simulator (servers/, which imports nothing above it) shares it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def default_text(value: Any) -> str | None:
    """A default as a user would type it (`256,64`, `600`, `reports`); None when there is
    nothing worth saying (unset, off, empty)."""
    if value is None or value is False or value is argparse.SUPPRESS:
        return None
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return ",".join(str(item) for item in value) if value else None
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Path):
        return str(value)
    return str(value)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's help with `(default: X)` after every flag that takes a value and has a
    default, unless its help already says one (argparse's own ArgumentDefaultsHelpFormatter
    also prints `default: None` and `default: False`, which tell a user nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = default_text(action.default)
        if shown is None or action.nargs == 0 or "default" in text:
            return action.help
        if not action.option_strings and action.nargs not in ("?", "*"):
            return action.help
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()
