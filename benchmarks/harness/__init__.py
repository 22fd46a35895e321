"""What the benchmarks share: flags, servers, tables, and targets with their --check exit.

A script makes its parser with `bench_args` (`--json`, `--check`, and where it has them
`--seeds` and `--rounds`) and hands it to `run_bench` with three functions of its own:
`measure` (the figures, a dict; a coroutine is run), `targets` (its `Target`s, read off
the figures) and `render` (the figures as text, its tables `Table`s). `--json` prints the
figures, targets included; else the rendering, then `report_targets`: each target with
its measured figure and PASS or FAIL. With `--check` a missed target makes the exit
status 1. A script that prints as it goes calls `report_targets` itself at its end.

Servers: `pin_client` and `null_server` (the client on one core, the null server on
another), `sim_server` (a fresh simulator); `autotune_cli` runs the command line as a
user does. Imports of autotune stay inside the functions that need them. `gpu_server.py`
is gpu_check.py's model server, a script run under any Python with torch (it imports
nothing of this package).
"""

from .flags import bench_args, count, count0, positive, rl_flags
from .report import Figures, Target, finish, report_targets, run_bench, verdict
from .running import (
    REPO,
    autotune_cli,
    log,
    machine,
    median,
    null_server,
    pin_client,
    rotations,
    sim_server,
)
from .sim_table import OTHER_IMAGE, SIM_SCENARIOS, TRUTH_IMAGE, sim_table
from .tables import Col, Table, fmt

__all__ = [
    "OTHER_IMAGE",
    "REPO",
    "SIM_SCENARIOS",
    "TRUTH_IMAGE",
    "Col",
    "Figures",
    "Table",
    "Target",
    "autotune_cli",
    "bench_args",
    "count",
    "count0",
    "finish",
    "fmt",
    "log",
    "machine",
    "median",
    "null_server",
    "pin_client",
    "positive",
    "report_targets",
    "rl_flags",
    "rotations",
    "run_bench",
    "sim_server",
    "sim_table",
    "verdict",
]
