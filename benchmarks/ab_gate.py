"""How the A/B gate (`autotune bench ab`) behaves on this machine: never flagging a
version against itself, always flagging a planted slowdown.

Runs `autotune bench ab SUITE --baseline-ref HEAD` N times from this checkout (the same
code on both sides: any flag is a false alarm), then once with a 100 µs-per-rollout CPU
burn planted in a copy of the candidate's engine (it must exit 1). Prints every run's
pairs, ratio, interval, p-value and verdict per metric, and the wall time of each.

    python benchmarks/ab_gate.py [--suite benchmarks/suite.yaml] [--runs 20] [--no-planted]

Targets: 0 of N self runs flagged; the planted run flagged (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import plant_slowdown  # noqa: E402


def ab_run(suite: Path, workdir: Path, candidate: Path | None = None) -> tuple[int, Any, float]:
    """One `bench ab` against HEAD: (exit code, the comparison, seconds)."""
    out = workdir / "ab" / "comparison.json"
    command = [sys.executable, "-m", "autotune", "bench", "ab", str(suite.resolve())]
    command += ["--baseline-ref", "HEAD", "--repo", str(REPO)]
    command += ["--output-dir", str(workdir / "ab"), "--quiet"]
    env = {"PYTHONPATH": str(candidate)} if candidate else None
    started = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=workdir if candidate else REPO,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    if not out.exists():
        raise SystemExit(f"bench ab failed: {done.stderr.strip()[-400:]}")
    return done.returncode, json.loads(out.read_text()), elapsed


def line(label: str, code: int, comparison: Any, elapsed: float) -> str:
    cells = []
    for v in comparison["verdicts"]:
        low, high = v["interval"] or (float("nan"), float("nan"))
        cells.append(
            f"{v['case']}/{v['metric']} ×{v['ratio']:.3f} [{low:.3f}, {high:.3f}] "
            f"p={v['p_value']:.3g} {v['verdict']}"
        )
    pairs = comparison["ab"]["pairs"]
    return f"{label:>8}  exit {code}  {pairs:>2} pairs  {elapsed:5.0f} s  " + "; ".join(cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=REPO / "benchmarks" / "suite.yaml")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-planted", action="store_true")
    args = parser.parse_args()
    flagged = 0
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(1, args.runs + 1):
            workdir = Path(tmp) / f"self-{index}"
            workdir.mkdir()
            code, comparison, elapsed = ab_run(args.suite, workdir)
            flagged += code == 1
            times.append(elapsed)
            print(line(f"self {index}", code, comparison, elapsed), flush=True)
        planted_ok = True
        if not args.no_planted:
            workdir = Path(tmp) / "planted"
            workdir.mkdir()
            candidate = plant_slowdown(workdir / "code", micros=100)
            code, comparison, elapsed = ab_run(args.suite, workdir, candidate)
            planted_ok = code == 1
            print(line("planted", code, comparison, elapsed), flush=True)
    if times:
        print(
            f"self A/B: {flagged} of {args.runs} flagged; wall {min(times):.0f}–{max(times):.0f} s"
            f" a run. planted 100 µs/rollout: {'flagged' if planted_ok else 'MISSED'}."
        )
    ok = flagged == 0 and planted_ok
    print(f"targets (no self run flagged, the planted one flagged): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
