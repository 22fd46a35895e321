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
import tempfile
import time
from pathlib import Path

TARGET_S = 60.0


def one_run() -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "diagnose.json"
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "autotune", "diagnose", "--json", str(out)],
            check=True,
            capture_output=True,
        )
        elapsed = time.perf_counter() - started
        return elapsed, json.loads(out.read_text())["verdict"]["verdict"]


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
