"""What the benchmarks share: machine identity and a median.

The null server, core pinning and CPU accounting live in `autotune.bench.overhead`, which
`autotune bench` uses too; they are re-exported here for the scripts in this folder.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from autotune.bench.overhead import NullServer, core_plan, cpu_seconds, pin_self

__all__ = ["NullServer", "core_plan", "cpu_seconds", "machine", "median", "pin_self"]


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
