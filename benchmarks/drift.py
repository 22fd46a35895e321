"""The drift watch against a planted slowdown: does it warn, in time, and only then?

The workflow a team follows, on the simulator 20 times faster than real time: a
one-trial sweep over parallelism gives `recommendation.json`; then, for each seed, two
collects at the recommended parallelism with `--expect` on it, run one after the other
so that load on the machine hits both alike: one healthy, one whose simulated replica
slows every engine step by --factor from --change-after seconds on
(`--sim-arg=--slow-down-after`). A slowed run passes when it warns within five drift
windows of the change and names the model stage; a healthy run passes when it never warns.

    python benchmarks/drift.py [--seeds 20] [--factor 2] [--window 1] [--change-after 5]
                               [--keep DIR] [--json]

Exit status 0 when every run passed.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
TIME_SCALE = "0.05"
WINDOWS = 3  # --drift-windows: warn after three windows in a row below
IN_TIME = 5  # must-show: within five windows of the change
STUDY = """\
name: drift
target: {kind: sim, args: [--time-scale, "%s"]}
workload:
  verifier: synthetic
  synthetic: {num_tasks: 2000, prompt_tokens: [256, 64], output_tokens: [128, 32]}
search_space:
  parallelism: {low: 2, high: 20}
probe: {min_s: 1.5, max_s: 6}
budget: {trials: 1}
"""


def autotune(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def recommend(root: Path) -> tuple[Path, dict[str, Any]]:
    """Sweep once; the recommendation's path and its `recommended` entry."""
    study = root / "drift.yaml"
    study.write_text(STUDY % TIME_SCALE)
    swept = autotune(
        "sweep", str(study), "--studies-dir", str(root / "studies"),
        "--output-dir", str(root / "reports" / "drift"), "--quiet", timeout=600,
    )  # fmt: skip
    if swept.returncode != 0:
        raise SystemExit(f"the sweep failed:\n{swept.stderr}")
    path = root / "reports" / "drift" / "recommendation.json"
    return path, orjson.loads(path.read_bytes())["recommended"]


def collect(
    args: argparse.Namespace,
    root: Path,
    name: str,
    seed: int,
    expect: Path,
    recommended: dict[str, Any],
    slow: list[str],
) -> dict[str, Any]:
    """One collect lasting about 2 × --change-after at the predicted rate; its collect.json."""
    tasks = math.ceil(recommended["predicted_throughput"] * 2 * args.change_after)
    report = root / name
    done = autotune(
        "collect", f"--sim-arg=--time-scale={TIME_SCALE}", f"--sim-arg=--seed={seed}", *slow,
        "--seed", str(seed), "--synthetic", str(tasks), "--output-tokens", "128,32",
        "--parallelism", str(recommended["parallelism"]), "--expect", str(expect),
        "--drift-window", str(args.window), "--drift-windows", str(WINDOWS),
        "--stats-every", "0.5", "--output-dir", str(root / f"{name}-rollouts"),
        "--report", str(report), "--json", "-q", timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"collect {name} failed:\n{done.stderr}")
    return dict(orjson.loads((report / "collect.json").read_bytes()))


def judge(result: dict[str, Any], slowed: bool, change_after_s: float) -> dict[str, Any]:
    """What one run shows: whether and when it warned, whom it blamed, and if it passed."""
    drift = result["drift"]
    row: dict[str, Any] = {
        "warned": drift is not None,
        "rollouts_per_s": result["summary"]["rollouts_per_s"],
        "windows_compared": result["drift_windows_counted"],
    }
    if drift is not None:
        windows_after = math.ceil((drift["t_s"] - change_after_s) / drift["window_s"])
        row |= {"t_s": drift["t_s"], "windows_after_change": windows_after, "stage": drift["stage"]}
    if slowed:
        row["passed"] = (
            drift is not None
            and 0 < row["windows_after_change"] <= IN_TIME
            and drift["stage"] == "model"
        )
    else:
        row["passed"] = drift is None and result["drift_windows_counted"] >= WINDOWS
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--factor", type=float, default=2.0, help="how much slower each step")
    parser.add_argument("--window", type=float, default=1.0, help="--drift-window, seconds")
    parser.add_argument("--change-after", type=float, default=5.0, help="seconds into a run")
    parser.add_argument("--keep", type=Path, help="keep every run's files here")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="autotune-drift-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        expect, recommended = recommend(root)
        print(
            f"recommendation: parallelism {recommended['parallelism']}, "
            f"{recommended['predicted_throughput']:.1f} rollouts/s predicted",
            file=sys.stderr,
        )
        slow = [
            f"--sim-arg=--slow-down-after={args.change_after}",
            f"--sim-arg=--slow-down-factor={args.factor}",
        ]
        runs = []
        for seed in range(args.seeds):
            for slowed in (seed % 2 == 0, seed % 2 == 1):  # alternate which goes first
                name = f"{'slowed' if slowed else 'healthy'}-{seed}"
                found = collect(args, root, name, seed, expect, recommended, slow if slowed else [])
                row = judge(found, slowed, args.change_after)
                # The machine's 1-minute load after the run: on a shared machine, what else ran.
                row["load_1m"] = round(os.getloadavg()[0], 2)
                runs.append({"seed": seed, "slowed": slowed, **row})
                print(f"  {name}: {row}", file=sys.stderr)
    slowed_runs = [r for r in runs if r["slowed"]]
    healthy_runs = [r for r in runs if not r["slowed"]]
    result = {
        "benchmark": "drift",
        "time_scale": float(TIME_SCALE),
        "factor": args.factor,
        "window_s": args.window,
        "change_after_s": args.change_after,
        "recommended": recommended,
        "slowed_warned_in_time_naming_model": sum(r["passed"] for r in slowed_runs),
        "slowed_runs": len(slowed_runs),
        "healthy_warned": sum(r["warned"] for r in healthy_runs),
        "healthy_runs": len(healthy_runs),
        "runs": runs,
    }
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(
            f"slowed ×{args.factor:g} after {args.change_after:g} s: "
            f"{result['slowed_warned_in_time_naming_model']}/{len(slowed_runs)} warned within "
            f"{IN_TIME} windows of {args.window:g} s, naming the model stage; healthy: "
            f"{result['healthy_warned']}/{len(healthy_runs)} warned"
        )
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
