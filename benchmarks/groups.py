"""RL goodput of batch-synchronous collection and its remedies, on the simulator.

The simulated policy has a long tail (`--output-length-sigma 1`: p99/p50 of output
lengths ~10) and 40% uninformative groups (`--uninformative-share 0.4`). Each row is one
`collect --batch-groups B --num-repeats N` against a fresh simulator (so every row sees
the same samples): plain synchronous steps, over-sampling at R = 0.25, 0.5 and 1.0,
carry-over, and both. Goodput is informative groups a second; the busy share (the
server's running requests over the step ÷ the samples a step launches) shows why.

    python benchmarks/groups.py [--tasks 96] [--batch-groups 8] [--num-repeats 8]
                                [--time-scale 0.1] [--json] [--check]

Target: a remedy reaches >= 1.25x the plain goodput. Exit status is 0 unless --check is
given and the target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.config.rl_specs import BatchSpec
from autotune.results.stages import percentile
from autotune.rollout.collect_job import collect
from autotune.servers.launcher import ServerSpec

try:  # run as a script (benchmarks/ on sys.path) or as `python -m benchmarks.groups`
    import _common
except ImportError:  # pragma: no cover
    from benchmarks import _common  # type: ignore[no-redef]

TARGET_RATIO = 1.25
REMEDIES: list[tuple[str, float, bool]] = [
    ("plain", 0.0, False),
    ("over-sample 0.25", 0.25, False),
    ("over-sample 0.5", 0.5, False),
    ("over-sample 1.0", 1.0, False),
    ("carry-over", 0.0, True),
    ("both (0.5 + carry)", 0.5, True),
]


def sim_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--output-length-sigma", "1", "--uninformative-share", "0.4",
        "--natural-output-tokens", "128", "--max-num-seqs", "256",
        "--time-scale", str(args.time_scale),
    ]  # fmt: skip


async def one_row(
    args: argparse.Namespace, name: str, over_sample: float, carry: bool, out: Path
) -> dict[str, Any]:
    batch = BatchSpec(batch_groups=args.batch_groups, over_sample=over_sample, carry_over=carry)
    async with ServerSpec.sim(sim_flags(args)).process() as sim:
        assert sim.base_url is not None
        started = time.perf_counter()
        summary = await collect(
            CollectConfig(
                target=TargetConfig(base_url=sim.base_url),
                synthetic=SyntheticWorkload(
                    num_tasks=args.tasks, output_tokens_mean=4000, output_tokens_std=0
                ),
                num_repeats=args.num_repeats,
                parallelism=2 * args.batch_groups * args.num_repeats,  # what R = 1 launches
                verifier="synthetic",
                output=out / "rollouts.jsonl",
                progress=False,
                batch=batch,
            )
        )
        wall = time.perf_counter() - started
    steps, groups = summary.batch, summary.groups
    assert steps is not None and groups is not None
    lengths = [
        orjson.loads(line)["response"]["usage"]["output_tokens"]
        for line in (out / "rollouts.jsonl").read_bytes().splitlines()
    ]
    p50, p99 = percentile(lengths, 50), percentile(lengths, 99)
    return {
        "name": name,
        "goodput": steps.informative_groups_per_s,
        "step_p50_s": steps.step_s.p50,
        "tail_share": steps.tail_share,
        "busy_share": steps.busy_share,
        "busy_source": steps.busy_source,
        "cancelled_samples": steps.cancelled_samples,
        "cancelled_tokens": steps.cancelled_tokens,
        "staleness_mean": steps.staleness_mean,
        "staleness_max": steps.staleness_max,
        "uninformative_share": 1 - (groups.informative_share or 0.0),
        "length_p99_over_p50": p99 / p50 if p50 and p99 else None,
        "steps": len(steps.steps),
        "wall_s": wall,
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, over_sample, carry) in enumerate(REMEDIES):
            out = Path(tmp) / str(index)
            rows.append(await one_row(args, name, over_sample, carry, out))
    plain = rows[0]["goodput"]
    for row in rows:
        row["vs_plain"] = row["goodput"] / plain if plain else None
    best = max(rows[1:], key=lambda row: row["vs_plain"] or 0.0)
    return {
        "benchmark": "groups",
        "settings": {
            "tasks": args.tasks,
            "batch_groups": args.batch_groups,
            "num_repeats": args.num_repeats,
            "sim": sim_flags(args),
        },
        "rows": rows,
        "best": best["name"],
        "best_vs_plain": best["vs_plain"],
        "target_vs_plain": TARGET_RATIO,
        "passed": (best["vs_plain"] or 0.0) >= TARGET_RATIO,
        "machine": _common.machine(),
    }


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    settings = result["settings"]
    plain = result["rows"][0]
    lines = [
        f"SIMULATED: {settings['tasks']} prompts x {settings['num_repeats']} samples, steps of "
        f"{settings['batch_groups']} groups; output length p99/p50 "
        f"{_f(plain['length_p99_over_p50'], '.1f')}, uninformative groups "
        f"{_f(plain['uninformative_share'], '.0%')} (plain run)",
        "",
        f"{'remedy':<20}{'goodput/s':>10}{'x plain':>9}{'step p50':>10}{'tail':>7}{'busy':>7}"
        f"{'cancelled':>11}{'tokens':>9}{'stale':>7}{'max':>5}",
    ]
    for row in result["rows"]:
        lines.append(
            f"{row['name']:<20}{row['goodput']:>10.2f}{_f(row['vs_plain'], '.2f'):>9}"
            f"{_f(row['step_p50_s'], '.2f'):>9}s{_f(row['tail_share'], '.0%'):>7}"
            f"{_f(row['busy_share'], '.0%'):>7}{row['cancelled_samples']:>11,}"
            f"{_f(row['cancelled_tokens'], ','):>9}{_f(row['staleness_mean'], '.2f'):>7}"
            f"{_f(row['staleness_max'], 'd'):>5}"
        )
    verdict = "PASS" if result["passed"] else "FAIL"
    lines += [
        "",
        f"goodput: informative groups/s; busy: the server's running requests over the step "
        f"÷ the samples a step launches ({plain['busy_source']} gauge).",
        f"{verdict}: best remedy {result['best']} at x{result['best_vs_plain']:.2f} the plain "
        f"goodput (target >= x{result['target_vs_plain']:.2f})",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=96)
    parser.add_argument("--batch-groups", type=int, default=8)
    parser.add_argument("--num-repeats", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args()
    return _common.print_result(asyncio.run(measure(args)), args, render)


if __name__ == "__main__":
    raise SystemExit(main())
