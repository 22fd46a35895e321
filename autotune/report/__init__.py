"""Outputs built from saved results only: terminal text and self-contained HTML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from autotune.errors import UsageError

# The saved-result file of each job, and the module that renders its report.
SAVED_FILES = {"diagnose": "diagnose.json", "sweep": "sweep.json"}


def load_saved(path: Path) -> tuple[dict[str, Any], Path]:
    """A saved result (a report directory, or the JSON file itself) and its directory."""
    if path.is_dir():
        found = [path / name for name in SAVED_FILES.values() if (path / name).exists()]
        if not found:
            raise UsageError(
                f"{path} holds no diagnose.json or sweep.json; pass a --report directory."
            )
        path = found[0]
    try:
        result = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist; pass a report directory.") from None
    except orjson.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(result, dict) or result.get("kind") not in SAVED_FILES:
        raise UsageError(f"{path} is not a saved autotune result.")
    return result, path.parent


def render_saved(result: dict[str, Any], directory: Path) -> Path:
    """Write index.html for a saved result; returns its path."""
    if result["kind"] == "sweep":
        from autotune.report import sweep_report

        return sweep_report.write(result, directory)
    from autotune.report import diagnose_report

    return diagnose_report.write(result, directory)
