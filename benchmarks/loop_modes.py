"""Trained samples/s of the RL loop's modes on the simulator; target: async >= 1.25x sync.

Each row is one `autotune loop` against a fresh simulator (fixed output lengths, so every
batch takes the same generation time): synchronous, colocated (the server asleep while
the trainer trains, on a GPU it shares: `--gpu-memory-utilization 0.45`), and the
asynchronous mode with one and two batches ahead, a staleness bound of one version, and
the abort and wait pause modes. Two regimes: training slower than generation (T = 1.5 x
a batch's generation time) and the reverse (T = 0.25 x). The table shows where the
asynchronous mode gains over the synchronous one, by how much, and what each bound costs
in staleness and dropped samples.

    python benchmarks/loop_modes.py [--steps 6] [--batch-groups 4] [--num-repeats 4]
                                    [--time-scale 0.5] [--json] [--check]

Targets: with training slower, async one batch ahead trains >= 1.25x the samples/s of
sync; in both regimes async reaches the pace the slower side sets (B / (max(generation,
training) + sync)) within 10%. Exit status is 0 unless --check is given and a target is
missed.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.config.rl_specs import LoopSpec
from autotune.rl.loop_job import loop

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

SYNC_S = 0.2
TARGET_GAIN = 1.25
PACE_TOLERANCE = 0.10
SHARED_GPU = ("--gpu-memory-utilization", "0.45")
# (row name, loop fields beyond the regime's, extra simulator flags)
ROWS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("sync", {"mode": "sync"}, ()),
    ("colocated", {"mode": "colocated"}, SHARED_GPU),
    ("async Q=B keep", {"mode": "async"}, ()),
    ("async Q=2B keep", {"mode": "async", "max_ahead": 2}, ()),
    ("async Q=2B K=1", {"mode": "async", "max_ahead": 2, "max_staleness": 1}, ()),
    ("async Q=2B abort", {"mode": "async", "max_ahead": 2, "pause_mode": "abort"}, ()),
    ("async Q=2B wait", {"mode": "async", "max_ahead": 2, "pause_mode": "wait"}, ()),
]


def _config(base_url: str, args: argparse.Namespace) -> CollectConfig:
    return CollectConfig(
        target=TargetConfig(base_url=base_url),
        synthetic=SyntheticWorkload(num_tasks=64, output_tokens_mean=200, output_tokens_std=0),
        num_repeats=args.num_repeats,
        verifier="synthetic",
        progress=False,
    )


async def _run(args: argparse.Namespace, fields: dict[str, Any], sim: tuple[str, ...]) -> Any:
    flags = ["--time-scale", str(args.time_scale), *sim]
    async with harness.sim_server(flags) as base_url:
        spec = LoopSpec.model_validate(
            {"batch_groups": args.batch_groups, "steps": args.steps, **fields}
        )
        return await loop(_config(base_url, args), spec)


async def generation_s(args: argparse.Namespace) -> float:
    """A batch's generation time: a loop that neither trains nor syncs waits this long."""
    summary = await _run(args, {"train_s": 0}, ())
    return statistics.median(step.wait_s for step in summary.steps)


def _pace(summary: Any) -> float:
    """Steady trained samples/s: from the second step's training start to the last's."""
    steps = summary.steps[1:]
    span = steps[-1].train_start - steps[0].train_start
    return sum(s.samples for s in steps[:-1]) / span if span > 0 else 0.0


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    generation = await generation_s(args)
    regimes = []
    for regime, factor in (("training slower", 1.5), ("generation slower", 0.25)):
        train_s = round(generation * factor, 3)
        rows = []
        for name, fields, sim in ROWS:
            fields = dict(fields)
            if "max_ahead" in fields:
                fields["max_ahead"] *= args.batch_groups
            summary = await _run(args, {**fields, "train_s": train_s, "sync_s": SYNC_S}, sim)
            rows.append(
                {
                    "name": name,
                    "samples_per_s": summary.trained_samples_per_s,
                    "steady_samples_per_s": _pace(summary),
                    "trainer_idle": summary.trainer_idle_share,
                    "generator_idle": summary.generator_idle_share,
                    "sync_share": summary.sync_share,
                    "staleness_p50": summary.staleness_p50,
                    "staleness_p95": summary.staleness_p95,
                    "staleness_max": summary.staleness_max,
                    "dropped": summary.dropped_stale_samples,
                    "aborted": summary.aborted_samples,
                    "pause_ms": (summary.pause_s.mean or 0.0) * 1000,
                }
            )
        sync = rows[0]["steady_samples_per_s"]
        for row in rows:
            row["vs_sync"] = row["steady_samples_per_s"] / sync if sync else None
        samples = args.batch_groups * args.num_repeats
        pace = samples / (max(generation, train_s) + SYNC_S)
        regimes.append({"regime": regime, "train_s": train_s, "expected_async": pace, "rows": rows})
    slower = regimes[0]["rows"]
    gain = slower[2]["vs_sync"] or 0.0
    paces = [r["rows"][2]["steady_samples_per_s"] / r["expected_async"] for r in regimes]
    return {
        "benchmark": "loop_modes",
        "settings": {
            "batch_groups": args.batch_groups,
            "num_repeats": args.num_repeats,
            "steps": args.steps,
            "time_scale": args.time_scale,
            "sync_s": SYNC_S,
            "generation_s": generation,
        },
        "regimes": regimes,
        "async_gain_training_slower": gain,
        "async_pace_ratios": paces,
        "machine": harness.machine(),
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    gain = result["async_gain_training_slower"]
    return [
        harness.Target("async (Q=B) / sync, training slower", gain, TARGET_GAIN, ">=", "x"),
        *(
            harness.Target(
                f"{regime['regime']}: async (Q=B) off the expected pace",
                abs(pace - 1),
                PACE_TOLERANCE,
                "<=",
                "%",
            )
            for regime, pace in zip(result["regimes"], result["async_pace_ratios"], strict=True)
        ),
    ]


TABLE = harness.Table(
    "mode:<18 | samples/s:10.2f | x sync:8.2f | trainer:9.0% | generator:10.0% | sync:6.0% "
    "| stale p50/p95/max:19 | dropped:9, | aborted:9,",
    keys="name steady_samples_per_s vs_sync trainer_idle generator_idle sync_share stale "
    "dropped aborted",
)


def render(result: dict[str, Any]) -> str:
    settings = result["settings"]
    f = harness.fmt
    lines = [
        f"SIMULATED: steps of {settings['batch_groups']} groups x {settings['num_repeats']} "
        f"samples of 200 tokens; a batch generates in {settings['generation_s']:.2f} s; "
        f"sync {settings['sync_s']:g} s; {settings['steps']} steps a row",
    ]
    for regime in result["regimes"]:
        rows = [
            {
                **row,
                "stale": f"{f(row['staleness_p50'], 'g')}/{f(row['staleness_p95'], 'g')}/"
                f"{f(row['staleness_max'], 'd')}",
            }
            for row in regime["rows"]
        ]
        lines += [
            "",
            f"{regime['regime']}: training {regime['train_s']:.2f} s a step; async's pace set "
            f"by the slower side: {regime['expected_async']:.2f} samples/s",
            *TABLE.lines(rows),
        ]
    paces = ", ".join(f"{p:.3f}" for p in result["async_pace_ratios"])
    lines += [
        "",
        "samples/s: trained, steady (from the second step on); trainer/generator: idle "
        "shares; sync: the share of time paused for weight syncs (colocated: asleep too).",
        f"async (Q=B) pace / expected: {paces}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__)
    parser.add_argument("--steps", type=int, default=6)
    harness.rl_flags(parser, batch_groups=4, num_repeats=4, time_scale=0.5)
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
