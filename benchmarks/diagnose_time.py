"""How long `autotune diagnose` with no arguments takes to print a verdict.

Target (issue: diagnose): within 60 s on a 2-core machine, simulated server start-up
included. Runs the real command line in a subprocess, as a user would, R times.

    python benchmarks/diagnose_time.py [--rounds 3] [--check]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

TARGET_S = 60.0


def one_run() -> tuple[float, str]:
    """Seconds to a verdict, and the verdict with its interval, stop reasons and time scale."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "diagnose", "--json", "--quiet"],
        check=True,
        capture_output=True,
    )
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args()
    times = []
    for round_number in range(1, args.rounds + 1):
        elapsed, verdict = one_run()
        times.append(elapsed)
        print(f"round {round_number}: {elapsed:6.1f} s  verdict {verdict}")
    worst = max(times)
    print(
        f"median {statistics.median(times):.1f} s, worst {worst:.1f} s, target < {TARGET_S:.0f} s:"
        f" {'PASS' if worst < TARGET_S else 'FAIL'}"
    )
    return 1 if args.check and worst >= TARGET_S else 0


if __name__ == "__main__":
    raise SystemExit(main())
