"""A collect watched while it runs: Prometheus metrics, a stats file, a drift watch, all
read from the totals the engine keeps, so nothing runs per rollout.
The modules, and why: docs/design/live.md.
"""

from autotune.live.expect import load_expectation
from autotune.live.monitor import LiveMonitor, open_monitor
from autotune.live.samples import stats_path

__all__ = ["LiveMonitor", "load_expectation", "open_monitor", "stats_path"]
