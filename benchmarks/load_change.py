"""Diagnosis verdicts with a load change planted mid-run; target: no wrong decided verdict.

Can a load change in the middle of a diagnosis pass for the server's behaviour?
The simulator (20 times faster than real time, ample capacity: parallelism-bound) slows
every engine step ×--factor from a planted instant on (`--sim-arg=--slow-down-after`), as
a machine does when another job lands on its cores. A first run without the change
times the diagnosis's blocks (low, high, low, high); the planted instants of --runs
runs are then spread evenly over its middle (10% to 90%), so the change falls before,
inside and between blocks. The server scales the same before and after the change, so
any decided verdict but `parallelism-bound` is wrong; `inconclusive` that names the
load change is right to give.

Beside each run, what the old probe order (one low probe, then one high) would have
said: the first low block and the first high block, classified on their own.

    python benchmarks/load_change.py [--runs 10] [--factor 2] [--json] [--check]

Target: no run gives a wrong decided verdict. Exit status is 0 unless --check is given
and one does.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.diagnose.checks import pair_speedups
from autotune.diagnose.classify import classify
from autotune.diagnose.diagnose_job import DiagnoseConfig, diagnose
from autotune.processes.event_loop import run_async
from autotune.results.diagnosis import DiagnoseResult
from autotune.results.probes import ProbeResult

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

TRUE_VERDICT = "parallelism-bound"
TIME_SCALE = 0.05  # the embedded simulator's default in diagnose


def run(sim_args: tuple[str, ...]) -> DiagnoseResult:
    collect = CollectConfig(
        target=TargetConfig(sim_args=sim_args),
        synthetic=SyntheticWorkload(num_tasks=400, output_tokens_mean=128, output_tokens_std=16),
        verifier="synthetic",
    )
    return run_async(diagnose(DiagnoseConfig(collect, low=5, high=20, min_s=1.5, max_s=8.0)))


def real_span_s(result: DiagnoseResult) -> float:
    """The diagnosis's real seconds from its first request to its last block's end."""
    return sum(end - start for probe in result.probes for _, start, end in probe.phases) * (
        TIME_SCALE
    )


def first_blocks_alone(probe: ProbeResult) -> ProbeResult:
    """The probe as the old order measured it: its first block, and nothing after."""
    block = min(probe.blocks, key=lambda b: b.at)
    return replace(
        probe,
        rollouts_per_s=block.rollouts_per_s,
        rollouts_per_s_ci=block.rollouts_per_s_ci,
        batches=block.batches,
        blocks=[],
    )


def describe(result: DiagnoseResult) -> dict[str, Any]:
    verdict, (low, high) = result.verdict, result.probes
    old = classify(first_blocks_alone(low), first_blocks_alone(high))
    decided = verdict.verdict != "inconclusive"
    return {
        "verdict": verdict.verdict + (" (leaning)" if verdict.leaning else ""),
        "speedup": round(verdict.speedup, 3),
        "interval": [round(x, 3) for x in verdict.speedup_interval or ()],
        "pairs": [f"×{p.ratio:.2f} (×{p.low:.2f}–×{p.high:.2f})" for p in pair_speedups(low, high)],
        "drift_named": "load changed" in verdict.confidence
        or any("between its blocks" in note for note in verdict.notes),
        "wrong": decided and verdict.verdict != TRUE_VERDICT,
        "old_order": f"{old.verdict}{' (leaning)' if old.leaning else ''} ×{old.speedup:.2f}",
        "old_order_wrong": old.verdict not in (TRUE_VERDICT, "inconclusive"),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """A run without the change, then --runs with it planted across its span."""
    baseline = run(())
    span = real_span_s(baseline)
    runs = []
    for index in range(args.runs):
        at = span * (0.1 + 0.8 * index / max(args.runs - 1, 1))
        result = run(("--slow-down-after", f"{at:.3f}", "--slow-down-factor", f"{args.factor:g}"))
        runs.append({"planted_at_s": round(at, 2), **describe(result)})
        harness.log(f"  change at {at:.2f} s: {runs[-1]['verdict']}")
    return {
        "benchmark": "load_change",
        "baseline": describe(baseline),
        "real_span_s": round(span, 2),
        "runs": runs,
        "wrong_decided": sum(r["wrong"] for r in runs),
        "inconclusive_with_drift_named": sum(
            r["verdict"] == "inconclusive" and r["drift_named"] for r in runs
        ),
        "old_order_wrong": sum(r["old_order_wrong"] for r in runs),
        "machine": harness.machine(),
    }


def targets(figures: dict[str, Any]) -> list[harness.Target]:
    name = f"wrong decided verdicts (of {len(figures['runs'])} runs)"
    return [harness.Target(name, figures["wrong_decided"], 0, "==")]


TABLE = harness.Table(
    "change at:9 | verdict:<28 | interval:<16 | drift named:<11 | pairs of blocks; old order:<",
    gap="  ",
)


def render(figures: dict[str, Any]) -> str:
    baseline = figures["baseline"]
    rows = [
        (
            f"{r['planted_at_s']:.2f}s",
            r["verdict"],
            "×{:.2f}–×{:.2f}".format(*r["interval"]) if r["interval"] else "-",
            "yes" if r["drift_named"] else "no",
            f"{', '.join(r['pairs'])}; {r['old_order']}",
        )
        for r in figures["runs"]
    ]
    runs = len(figures["runs"])
    return "\n".join(
        [
            f"no change: {baseline['verdict']} ×{baseline['speedup']} {baseline['interval']}; "
            f"the diagnosis spans {figures['real_span_s']} s",
            *TABLE.lines(rows),
            f"wrong decided verdicts: {figures['wrong_decided']} of {runs}; inconclusive with "
            f"the load change named: {figures['inconclusive_with_drift_named']}; the old order "
            f"wrong: {figures['old_order_wrong']} of {runs}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--factor", type=float, default=2.0)
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
