"""The drift watch against a planted slowdown; target: every slowed run warns in time, no other.

The workflow a team follows, on the simulator 20 times faster than real time: a
one-trial sweep over parallelism gives `recommendation.json`; then, for each seed, two
collects with `--expect` on it and `--fail-on drift`, each the recommendation's own
`autotune` line as the README says to paste it (the sweep's workload and server, at the
recommended parallelism; `--limit` keeps a run short), run one after the other so that
load on the machine hits both alike: one healthy, one whose simulated replica slows
every engine step by --factor from --change-after seconds on
(`--sim-arg=--slow-down-after`). A slowed run passes when it warns within five drift
windows of the change, names the model stage and exits 3; a healthy run passes when it
never warns and exits 0. Then --different runs on another workload (outputs twice as
long): each passes when it says its workload differs and never calls the shortfall drift
(exit 0).

    python benchmarks/drift.py [--seeds 20] [--different 5] [--factor 2] [--window 1]
                               [--change-after 5] [--keep DIR] [--json] [--check]

Targets: every slowed run, every healthy run and every run on another workload passes.
Exit status is 0 unless --check is given and a run failed.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import orjson

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

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


def recommend(root: Path) -> tuple[Path, dict[str, Any], str]:
    """Sweep once; the recommendation's path, its `recommended` entry and its `autotune`
    line."""
    study = root / "drift.yaml"
    study.write_text(STUDY % TIME_SCALE)
    swept = harness.autotune_cli(
        "sweep", str(study), "--studies-dir", str(root / "studies"),
        "--output-dir", str(root / "reports" / "drift"), "--quiet", timeout=600,
    )  # fmt: skip
    if swept.returncode != 0:
        raise SystemExit(f"the sweep failed:\n{swept.stderr}")
    path = root / "reports" / "drift" / "recommendation.json"
    saved = orjson.loads(path.read_bytes())
    return path, saved["recommended"], saved["snippets"]["autotune"]


def collect(
    args: argparse.Namespace,
    root: Path,
    name: str,
    seed: int,
    expect: Path,
    recommended: dict[str, Any],
    line: str,
    extra: list[str],
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """The recommendation's `autotune` line with `extra` flags, lasting about 2 ×
    --change-after at the predicted rate; its collect.json and the finished process."""
    tasks = math.ceil(recommended["predicted_throughput"] * 2 * args.change_after)
    report = root / name
    pasted = shlex.split(line)[1:]  # `autotune collect ...` as the README says to paste it
    done = harness.autotune_cli(
        *pasted, f"--sim-arg=--seed={seed}", *extra, "--limit", str(tasks),
        "--expect", str(expect), "--fail-on", "drift",
        "--drift-window", str(args.window), "--drift-windows", str(WINDOWS),
        "--stats-every", "0.5", "--output-dir", str(root / f"{name}-rollouts"),
        "--report", str(report), "--json", "-q", timeout=600,
    )  # fmt: skip
    if done.returncode not in (0, 3):
        raise SystemExit(f"collect {name} failed:\n{done.stderr}")
    return dict(orjson.loads((report / "collect.json").read_bytes())), done


def judge(
    result: dict[str, Any], done: subprocess.CompletedProcess[str], kind: str, change_after_s: float
) -> dict[str, Any]:
    """What one run shows: whether and when it warned, whom it blamed, and if it passed
    (`kind`: healthy, slowed or different, the workload)."""
    drift = result["drift"]
    summary = result["summary"]
    row: dict[str, Any] = {
        "warned": drift is not None,
        "exit": done.returncode,
        "rollouts_per_s": summary["rollouts_per_s"],
        "windows_compared": result["drift_windows_counted"],
        # the warning is in the summary (--json, the last stats line) as well as the report
        "in_summary": summary["drift"] == drift,
    }
    if drift is not None:
        windows_after = math.ceil((drift["t_s"] - change_after_s) / drift["window_s"])
        row |= {"t_s": drift["t_s"], "windows_after_change": windows_after, "stage": drift["stage"]}
    if kind == "slowed":
        row["passed"] = (
            drift is not None
            and 0 < row["windows_after_change"] <= IN_TIME
            and drift["stage"] == "model"
            and not drift["workload_differs"]
            and done.returncode == 3
        )
    elif kind == "healthy":
        row["passed"] = (
            drift is None and result["drift_windows_counted"] >= WINDOWS and done.returncode == 0
        )
    else:
        said = "this run's workload differs" in done.stderr
        row["said_workload_differs"] = said
        row["passed"] = (
            said and (drift is None or bool(drift["workload_differs"])) and done.returncode == 0
        )
    row["passed"] = row["passed"] and row["in_summary"]
    return row


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep, then every planned collect, judged; the figures as a dict."""
    with tempfile.TemporaryDirectory(prefix="autotune-drift-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        expect, recommended, line = recommend(root)
        harness.log(
            f"recommendation: parallelism {recommended['parallelism']}, "
            f"{recommended['predicted_throughput']:.1f} rollouts/s predicted"
        )
        slow = [
            f"--sim-arg=--slow-down-after={args.change_after}",
            f"--sim-arg=--slow-down-factor={args.factor}",
        ]
        runs = []
        longer = ["--output-tokens", "256,64"]  # after the line's own: the last one counts
        plan = [
            (seed, kind)
            for seed in range(args.seeds)
            for kind in (("slowed", "healthy") if seed % 2 == 0 else ("healthy", "slowed"))
        ] + [(seed, "different") for seed in range(args.different)]
        for seed, kind in plan:
            name = f"{kind}-{seed}"
            extra = {"slowed": slow, "healthy": [], "different": longer}[kind]
            found, done = collect(args, root, name, seed, expect, recommended, line, extra)
            row = judge(found, done, kind, args.change_after)
            # The machine's 1-minute load after the run: on a shared machine, what else ran.
            row["load_1m"] = round(os.getloadavg()[0], 2)
            runs.append({"seed": seed, "kind": kind, "slowed": kind == "slowed", **row})
            harness.log(f"  {name}: {row}")
    slowed_runs = [r for r in runs if r["kind"] == "slowed"]
    healthy_runs = [r for r in runs if r["kind"] == "healthy"]
    different_runs = [r for r in runs if r["kind"] == "different"]
    return {
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
        "different_said_so": sum(r["passed"] for r in different_runs),
        "different_runs": len(different_runs),
        "collect_line": line,
        "runs": runs,
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    """A target a kind of run: all of them passed (the slowed warned within IN_TIME
    windows naming the model stage; the healthy never warned; another workload said so)."""
    runs = result["runs"]
    return [
        harness.Target(
            f"{kind} runs that passed ({what})",
            sum(r["passed"] for r in runs if r["kind"] == kind),
            sum(r["kind"] == kind for r in runs),
            "==",
        )
        for kind, what in (
            ("slowed", f"warned within {IN_TIME} windows, naming the model stage"),
            ("healthy", "never warned"),
            ("different", "said the workload differs, no drift"),
        )
    ]


def render(result: dict[str, Any]) -> str:
    return (
        f"slowed ×{result['factor']:g} after {result['change_after_s']:g} s: "
        f"{result['slowed_warned_in_time_naming_model']}/{result['slowed_runs']} warned within "
        f"{IN_TIME} windows of {result['window_s']:g} s, naming the model stage; healthy: "
        f"{result['healthy_warned']}/{result['healthy_runs']} warned; another workload: "
        f"{result['different_said_so']}/{result['different_runs']} said so, none called it "
        "drift"
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, seeds=20)
    parser.add_argument(
        "--different", type=int, default=5, help="runs on another workload (outputs ×2)"
    )
    parser.add_argument("--factor", type=float, default=2.0, help="how much slower each step")
    parser.add_argument("--window", type=float, default=1.0, help="--drift-window, seconds")
    parser.add_argument("--change-after", type=float, default=5.0, help="seconds into a run")
    parser.add_argument("--keep", type=Path, help="keep every run's files here")
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
