"""Diagnosis verdicts with a load change planted mid-run; target: no wrong decided verdict.

Can a load change in the middle of a diagnosis pass for the server's behaviour?
The simulator (20 times faster than real time) slows every engine step ×--factor from a
planted instant on (`--sim-arg=--slow-down-after`), as a machine does when another job
lands on its cores. Two servers: a wide one (ample slots: parallelism-bound) and a
narrow one (4 slots: model-bound). A first run without the change times the diagnosis's
blocks (low, high, low, high); the planted instants of --runs runs a place are then
spread over one of three places: before the first high block (the first low block's
second half to the high block's start), between the pairs, and inside the last block.
A decided verdict other than the server's own is wrong; `inconclusive` naming the change
is honest. Where a pair of blocks measured wholly on one side of the change decides the
speedup on its own, the verdict should be right, not inconclusive.

Beside each run, what the old probe order (one low probe, then one high) would have
said: the first low block and the first high block, classified on their own.

    python benchmarks/load_change.py [--runs 10] [--factors 2 3] [--json] [--check]

Targets: no run gives a wrong decided verdict; of the runs a one-sided pair decides, at
least half are right. Exit status is 0 unless --check is given and one is missed.
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

TIME_SCALE = 0.05  # the embedded simulator's default in diagnose
SERVERS = {  # name: (the simulator's flags, its verdict)
    "wide": ((), "parallelism-bound"),
    "narrow": (("--max-num-seqs", "4"), "model-bound"),
}
PLACES = ("before the first high block", "between the pairs", "in the last block")
LOW, HIGH = 5, 20


def run(sim_args: tuple[str, ...]) -> DiagnoseResult:
    collect = CollectConfig(
        target=TargetConfig(sim_args=sim_args),
        synthetic=SyntheticWorkload(num_tasks=400, output_tokens_mean=128, output_tokens_std=16),
        verifier="synthetic",
    )
    config = DiagnoseConfig(collect, low=LOW, high=HIGH, min_s=1.5, max_s=8.0)
    return run_async(diagnose(config))


def windows(result: DiagnoseResult) -> list[tuple[float, float]]:
    """The blocks' measured windows in time order (low, high, low, high ...), in real
    seconds from the diagnosis's first request (when the simulator's clock starts); a
    block's start and length are in simulated seconds, TIME_SCALE real ones each."""
    low = result.probes[0]
    first = min(low.blocks, key=lambda b: b.at)
    origin = first.at - low.phases[0][2]  # its first block began after its warm-up
    spans = sorted(
        (block.at, block.at + block.measured_s) for probe in result.probes for block in probe.blocks
    )
    return [((a - origin) * TIME_SCALE, (b - origin) * TIME_SCALE) for a, b in spans]


def planted_instants(blocks: list[tuple[float, float]], place: str, runs: int) -> list[float]:
    """`runs` instants spread over `place`, from the baseline's block windows."""
    (l1, h1, l2, h2) = blocks[:4]
    start, end = {
        PLACES[0]: ((l1[0] + l1[1]) / 2, h1[0]),
        PLACES[1]: (h1[1], l2[0]),
        PLACES[2]: (h2[0] + 0.1 * (h2[1] - h2[0]), h2[0] + 0.9 * (h2[1] - h2[0])),
    }[place]
    return [start + (end - start) * (i + 0.5) / runs for i in range(runs)]


def one_sided_pair_decides(result: DiagnoseResult, at: float) -> bool:
    """Whether a pair of blocks measured wholly on one side of the change at `at` (real
    seconds) decides the speedup on its own."""
    low, high = result.probes
    spans = windows(result)
    by_start = sorted(b.at for probe in result.probes for b in probe.blocks)
    below, above = result.settings.thresholds.undecided_zone(high.parallelism / low.parallelism)
    pairs = zip(
        sorted(low.blocks, key=lambda b: b.at),
        sorted(high.blocks, key=lambda b: b.at),
        strict=False,
    )
    for (lo, hi), speedup in zip(pairs, pair_speedups(low, high), strict=False):
        a, b = spans[by_start.index(lo.at)], spans[by_start.index(hi.at)]
        one_side = max(a[1], b[1]) <= at or min(a[0], b[0]) >= at
        if one_side and (speedup.low >= above or speedup.high < below):
            return True
    return False


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


def describe(result: DiagnoseResult, truth: str) -> dict[str, Any]:
    verdict, (low, high) = result.verdict, result.probes
    old = classify(first_blocks_alone(low), first_blocks_alone(high))
    decided = verdict.verdict != "inconclusive"
    return {
        "verdict": verdict.verdict + (" (leaning)" if verdict.leaning else ""),
        "speedup": round(verdict.speedup, 3),
        "interval": [round(x, 3) for x in verdict.speedup_interval or ()],
        "pairs": [f"×{p.ratio:.2f} (×{p.low:.2f}–×{p.high:.2f})" for p in pair_speedups(low, high)],
        "change_named": "load changed" in verdict.confidence,
        "wrong": decided and verdict.verdict != truth,
        "right": verdict.verdict == truth,
        "old_order": f"{old.verdict}{' (leaning)' if old.leaning else ''} ×{old.speedup:.2f}",
        "old_order_wrong": old.verdict not in (truth, "inconclusive"),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Per server, a run without the change, then --runs a place and factor with it."""
    servers = []
    for name, (flags, truth) in SERVERS.items():
        baseline = run(flags)
        blocks = windows(baseline)
        runs = []
        for factor in args.factors:
            for place in PLACES:
                for at in planted_instants(blocks, place, args.runs):
                    slow = ("--slow-down-after", f"{at:.3f}", "--slow-down-factor", f"{factor:g}")
                    result = run((*flags, *slow))
                    runs.append(
                        {
                            "factor": factor,
                            "place": place,
                            "planted_at_s": round(at, 3),
                            "one_sided_pair_decides": one_sided_pair_decides(result, at),
                            **describe(result, truth),
                        }
                    )
                    harness.log(f"  {name} ×{factor:g} at {at:.2f} s: {runs[-1]['verdict']}")
        servers.append(
            {
                "server": name,
                "truth": truth,
                "baseline": describe(baseline, truth),
                "blocks_s": [[round(a, 2), round(b, 2)] for a, b in blocks],
                "runs": runs,
            }
        )
    every = [r for server in servers for r in server["runs"]]
    decidable = [r for r in every if r["one_sided_pair_decides"]]
    return {
        "benchmark": "load_change",
        "servers": servers,
        "runs": len(every),
        "wrong_decided": sum(r["wrong"] for r in every),
        "one_sided_pair_decides": len(decidable),
        "right_where_a_pair_decides": sum(r["right"] for r in decidable),
        "right_share_where_a_pair_decides": (
            sum(r["right"] for r in decidable) / len(decidable) if decidable else None
        ),
        "old_order_wrong": sum(r["old_order_wrong"] for r in every),
        "machine": harness.machine(),
    }


def targets(figures: dict[str, Any]) -> list[harness.Target]:
    return [
        harness.Target(
            f"wrong decided verdicts (of {figures['runs']} runs)", figures["wrong_decided"], 0, "=="
        ),
        harness.Target(
            f"right where a one-sided pair decides ({figures['one_sided_pair_decides']} runs)",
            figures["right_share_where_a_pair_decides"],
            0.5,
            ">=",
            "%",
        ),
    ]


TABLE = harness.Table(
    "server:6 | factor:>6 | place:<27 | runs:>4 | right:>5 | inconclusive:>12 | wrong:>5 | "
    "a pair decides:>14 | right there:>11 | old order wrong:>15",
    gap="  ",
)


def render(figures: dict[str, Any]) -> str:
    lines = []
    rows = []
    for server in figures["servers"]:
        base = server["baseline"]
        lines.append(
            f"{server['server']} ({server['truth']}), no change: {base['verdict']} "
            f"×{base['speedup']} {base['interval']}; blocks at {server['blocks_s']} s"
        )
        for factor in sorted({r["factor"] for r in server["runs"]}):
            for place in PLACES:
                cell = [r for r in server["runs"] if r["factor"] == factor and r["place"] == place]
                decides = [r for r in cell if r["one_sided_pair_decides"]]
                rows.append(
                    (
                        server["server"],
                        f"×{factor:g}",
                        place,
                        len(cell),
                        sum(r["right"] for r in cell),
                        sum(r["verdict"] == "inconclusive" for r in cell),
                        sum(r["wrong"] for r in cell),
                        len(decides),
                        sum(r["right"] for r in decides),
                        sum(r["old_order_wrong"] for r in cell),
                    )
                )
    return "\n".join(
        [
            *lines,
            *TABLE.lines(rows),
            f"wrong decided verdicts: {figures['wrong_decided']} of {figures['runs']}; right "
            f"where a pair on one side of the change decides: "
            f"{figures['right_where_a_pair_decides']} of {figures['one_sided_pair_decides']}; "
            f"the old order wrong: {figures['old_order_wrong']} of {figures['runs']}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__)
    parser.add_argument("--runs", type=int, default=10, help="runs a place, factor and server")
    parser.add_argument("--factors", type=float, nargs="+", default=[2.0, 3.0])
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
