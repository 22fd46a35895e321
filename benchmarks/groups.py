"""RL goodput of batch steps and their remedies on the simulator; target: a remedy >= 1.25x plain.

The simulated policy has a long tail (`--output-length-sigma 1`: p99/p50 of output
lengths ~10) and 40% uninformative groups (`--uninformative-share 0.4`). Each row is one
`collect --batch-groups B --num-repeats N` against a fresh simulator (so every row sees
the same samples): plain synchronous steps, over-sampling at R = 0.25, 0.5 and 1.0,
carry-over, and both. Goodput is informative groups a second; the busy share (the
server's running requests over the step ÷ its batch limit, max_num_seqs 256) shows why: a
remedy's gain follows the idle seats it fills.

    python benchmarks/groups.py [--tasks 96] [--batch-groups 8] [--num-repeats 8]
                                [--time-scale 0.1] [--json] [--check]

Target: the best remedy reaches >= 1.25x the plain goodput. Exit status is 0 unless
--check is given and the target is missed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from autotune.collector.collect_job import collect
from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.config.rl_specs import BatchSpec
from autotune.results.stages import percentile

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

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
    async with harness.sim_server(sim_flags(args)) as base_url:
        started = time.perf_counter()
        summary = await collect(
            CollectConfig(
                target=TargetConfig(base_url=base_url),
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
        "batch_limit": steps.capacity,
        "batch_limit_source": steps.capacity_source,
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
    plain, plain_busy = rows[0]["goodput"], rows[0]["busy_share"]
    for row in rows:
        row["vs_plain"] = row["goodput"] / plain if plain else None
        row["busy_vs_plain"] = row["busy_share"] / plain_busy if plain_busy else None
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
        "machine": harness.machine(),
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    name = f"goodput of the best remedy ({result['best']}) / plain"
    return [harness.Target(name, result["best_vs_plain"], TARGET_RATIO, ">=", "x")]


TABLE = harness.Table(
    "remedy:<20 | goodput/s:10.2f | x plain:9.2f | step p50:10 | tail:7.0% | busy:7.1% "
    "| busy x plain:14.2f | cancelled:11, | tokens:9, | stale:7.2f | max:5d",
    keys="name goodput vs_plain step_p50 tail_share busy_share busy_vs_plain cancelled_samples "
    "cancelled_tokens staleness_mean staleness_max",
)


def render(result: dict[str, Any]) -> str:
    settings = result["settings"]
    plain = result["rows"][0]
    f = harness.fmt
    rows = [{**row, "step_p50": f"{f(row['step_p50_s'], '.2f')}s"} for row in result["rows"]]
    return "\n".join(
        [
            f"SIMULATED: {settings['tasks']} prompts x {settings['num_repeats']} samples, steps "
            f"of {settings['batch_groups']} groups; output length p99/p50 "
            f"{f(plain['length_p99_over_p50'], '.1f')}, uninformative groups "
            f"{f(plain['uninformative_share'], '.0%')} (plain run)",
            "",
            *TABLE.lines(rows),
            "",
            f"goodput: informative groups/s; busy: the server's running requests over the step "
            f"({plain['busy_source']} gauge) ÷ its batch limit, {plain['batch_limit']} "
            f"({plain['batch_limit_source']}): the share of its seats a step keeps filled. A "
            "remedy's gain follows the idle seats it fills (busy x plain beside x plain); seats "
            "spent on samples cancelled at a step's end (tokens) train nothing, so the widest "
            "over-sampling gains less than it fills.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__)
    parser.add_argument("--tasks", type=int, default=96)
    harness.rl_flags(parser, batch_groups=8, num_repeats=8, time_scale=0.1)
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
