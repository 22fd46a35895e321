"""Seconds for `autotune diagnose` with no arguments to print a verdict; target: under 60 s.

Target (issue: diagnose): within 60 s on a 2-core machine, simulated server start-up
included, in the worst of R rounds. Runs the real command line in a subprocess, as a user
would. Exit status is 0 unless --check is given and the target is missed.

    python benchmarks/diagnose_time.py [--rounds 3] [--json] [--check]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

TARGET_S = 60.0


def one_run() -> tuple[float, str]:
    """Seconds to a verdict, and the verdict with its interval, stop reasons and time scale."""
    started = time.perf_counter()
    done = harness.autotune_cli("diagnose", "--json", "--quiet", check=True)
    elapsed = time.perf_counter() - started
    result = json.loads(done.stdout)
    verdict = result["verdict"]
    low, high = verdict["speedup_interval"]
    probes = ", ".join(
        f"p{p['parallelism']} {p['rollouts_per_s']:.3g}/s {p['stop_reason']}"
        for p in result["probes"]
    )
    return elapsed, (
        f"{verdict['verdict']} ×{verdict['speedup']:.2f} (×{low:.2f}–×{high:.2f}); {probes}; "
        f"time scale {result['target']['time_scale']}"
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds = []
    for round_number in range(1, args.rounds + 1):
        elapsed, verdict = one_run()
        rounds.append({"seconds": elapsed, "verdict": verdict})
        harness.log(f"round {round_number}: {elapsed:6.1f} s  verdict {verdict}")
    times = [r["seconds"] for r in rounds]
    return {
        "benchmark": "diagnose_time",
        "rounds": rounds,
        "median_s": statistics.median(times),
        "worst_s": max(times),
        "machine": harness.machine(),
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    worst = result["worst_s"]
    return [harness.Target("seconds to a verdict, worst round", worst, TARGET_S, "<", "s", ".1f")]


def render(result: dict[str, Any]) -> str:
    rows = [(index, r["seconds"], r["verdict"]) for index, r in enumerate(result["rounds"], 1)]
    return "\n".join(
        [
            *harness.Table("round:5 | s:7.1f | verdict:<", gap="  ").lines(rows),
            f"median {result['median_s']:.1f} s, worst {result['worst_s']:.1f} s",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, rounds=3)
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
