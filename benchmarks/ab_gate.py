"""The A/B gate (`autotune bench ab`) here; target: no self run flagged, a planted slowdown flagged.

Runs `autotune bench ab SUITE --baseline-ref HEAD` N times from this checkout (the same
code on both sides: any flag is a false alarm), then once with a 100 µs-per-rollout CPU
burn planted in a copy of the candidate's engine (it must exit 1). Prints every run's
pairs, ratio, interval, p-value and verdict per metric, and the wall time of each.

    python benchmarks/ab_gate.py [--suite benchmarks/suite.yaml] [--runs 20] [--no-planted]
                                 [--check]

Targets: 0 of N self runs flagged; the planted run flagged (exit 1). Exit status is 0
unless --check is given and a target is missed.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

sys.path.insert(0, str(harness.REPO))

from tests.helpers import plant_slowdown

TABLE = harness.Table(
    "run:8 | exit:4 | pairs:5 | s:5.0f | case/metric ×ratio [interval] p verdict:<", gap="  "
)


def ab_run(suite: Path, workdir: Path, candidate: Path | None = None) -> tuple[int, Any, float]:
    """One `bench ab` against HEAD: (exit code, the comparison, seconds)."""
    out = workdir / "ab" / "comparison.json"
    command = ["bench", "ab", str(suite.resolve()), "--baseline-ref", "HEAD"]
    command += ["--repo", str(harness.REPO), "--output-dir", str(workdir / "ab"), "--quiet"]
    started = time.perf_counter()
    done = harness.autotune_cli(
        *command,
        cwd=workdir if candidate else harness.REPO,
        env={"PYTHONPATH": str(candidate)} if candidate else None,
    )
    elapsed = time.perf_counter() - started
    if not out.exists():
        raise SystemExit(f"bench ab failed: {done.stderr.strip()[-400:]}")
    return done.returncode, json.loads(out.read_text()), elapsed


def line(label: str, code: int, comparison: Any, elapsed: float) -> str:
    cells = []
    for v in comparison["verdicts"]:  # a metric not measured has no ratio, interval, p
        low, high = v["interval"] or (None, None)
        cells.append(
            f"{v['case']}/{v['metric']} ×{harness.fmt(v['ratio'], '.3f')} "
            f"[{harness.fmt(low, '.3f')}, {harness.fmt(high, '.3f')}] "
            f"p={harness.fmt(v['p_value'], '.3g')} {v['verdict']}"
        )
    pairs = comparison["ab"]["pairs"]
    return TABLE.row((label, code, pairs, elapsed, "; ".join(cells)))


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, json=False)
    parser.add_argument("--suite", type=Path, default=harness.REPO / "benchmarks" / "suite.yaml")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-planted", action="store_true")
    args = parser.parse_args(argv)
    flagged = 0
    times = []
    planted = None
    print(TABLE.header(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(1, args.runs + 1):
            workdir = Path(tmp) / f"self-{index}"
            workdir.mkdir()
            code, comparison, elapsed = ab_run(args.suite, workdir)
            flagged += code == 1
            times.append(elapsed)
            print(line(f"self {index}", code, comparison, elapsed), flush=True)
        if not args.no_planted:
            workdir = Path(tmp) / "planted"
            workdir.mkdir()
            candidate = plant_slowdown(workdir / "code", micros=100)
            code, comparison, elapsed = ab_run(args.suite, workdir, candidate)
            planted = code == 1
            print(line("planted", code, comparison, elapsed), flush=True)
    if times:
        print(f"self A/B wall: {min(times):.0f}–{max(times):.0f} s a run")
    targets = [harness.Target(f"self runs flagged (of {args.runs})", flagged, 0, "==")]
    if planted is not None:
        targets.append(harness.Target("planted 100 µs/rollout run flagged", planted, True, "=="))
    return harness.report_targets(targets, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
