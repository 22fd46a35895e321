"""A collect watched while it runs: Prometheus metrics, a stats file, a drift watch.

    figures.py   the run's totals, read from the counters the engine keeps anyway
    metrics.py   `--metrics-port`: a prometheus_client collector over those figures
    samples.py   `--stats-every`, `--report`: one LiveSample per interval, JSON lines
    drift.py     pure: steady-state windows against an Expectation → one DriftWarning
    expect.py    the Expectation: a recommendation.json (its interval derived) or a rate
    monitor.py   wires them to one collect run (rollout/collect_job.py is its only caller)

Nothing here runs per rollout except, with a drift watch, one clock read and one append
per completion (and, with any live flag, two clock reads per model call in the connection
pool): scrapes and samples read the engine's own totals when they are asked for, so
metering leaves the hot loop as it was (benchmarks/overhead.py measures it "metered").
Layering: imported by rollout/collect_job.py; imports the engine, backends, pipeline, probe.window
and results, never a job.
"""

from autotune.live.expect import load_expectation
from autotune.live.monitor import LiveMonitor, open_monitor
from autotune.live.samples import stats_path

__all__ = ["LiveMonitor", "load_expectation", "open_monitor", "stats_path"]
