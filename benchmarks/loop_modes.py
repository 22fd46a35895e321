"""Trained samples/s of the RL loop's modes in two regimes, on the simulator.

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

Targets (--check): with training slower, async one batch ahead trains >= 1.25x the
samples/s of sync; in both regimes async reaches the pace the slower side sets
(B / (max(generation, training) + sync)) within 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.config.rl_specs import LoopSpec
from autotune.rl.loop_job import loop
from autotune.servers.launcher import ServerSpec

try:  # run as a script (benchmarks/ on sys.path) or as `python -m benchmarks.loop_modes`
    import _common
except ImportError:  # pragma: no cover
    from benchmarks import _common  # type: ignore[no-redef]

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
    async with ServerSpec.sim(flags).process() as server:
        assert server.base_url is not None
        spec = LoopSpec.model_validate(
            {"batch_groups": args.batch_groups, "steps": args.steps, **fields}
        )
        return await loop(_config(server.base_url, args), spec)


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
    passed = gain >= TARGET_GAIN and all(abs(p - 1) <= PACE_TOLERANCE for p in paces)
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
        "target_gain": TARGET_GAIN,
        "passed": passed,
        "machine": _common.machine(),
    }


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    settings = result["settings"]
    lines = [
        f"SIMULATED: steps of {settings['batch_groups']} groups x {settings['num_repeats']} "
        f"samples of 200 tokens; a batch generates in {settings['generation_s']:.2f} s; "
        f"sync {settings['sync_s']:g} s; {settings['steps']} steps a row",
    ]
    for regime in result["regimes"]:
        lines += [
            "",
            f"{regime['regime']}: training {regime['train_s']:.2f} s a step; async's pace set "
            f"by the slower side: {regime['expected_async']:.2f} samples/s",
            f"{'mode':<18}{'samples/s':>10}{'x sync':>8}{'trainer':>9}{'generator':>10}"
            f"{'sync':>6}{'stale p50/p95/max':>19}{'dropped':>9}{'aborted':>9}",
        ]
        for row in regime["rows"]:
            stale = (
                f"{_f(row['staleness_p50'], 'g')}/{_f(row['staleness_p95'], 'g')}/"
                f"{_f(row['staleness_max'], 'd')}"
            )
            lines.append(
                f"{row['name']:<18}{row['steady_samples_per_s']:>10.2f}"
                f"{_f(row['vs_sync'], '.2f'):>8}{row['trainer_idle']:>9.0%}"
                f"{row['generator_idle']:>10.0%}{row['sync_share']:>6.0%}{stale:>19}"
                f"{row['dropped']:>9,}{row['aborted']:>9,}"
            )
    verdict = "PASS" if result["passed"] else "FAIL"
    paces = ", ".join(f"{p:.3f}" for p in result["async_pace_ratios"])
    lines += [
        "",
        "samples/s: trained, steady (from the second step on); trainer/generator: idle "
        "shares; sync: the share of time paused for weight syncs (colocated: asleep too).",
        f"{verdict}: async (Q=B) x{result['async_gain_training_slower']:.2f} sync with "
        f"training slower (target >= x{result['target_gain']:.2f}); async pace / expected: "
        f"{paces} (target within {PACE_TOLERANCE:.0%})",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-groups", type=int, default=4)
    parser.add_argument("--num-repeats", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    return _common.print_result(asyncio.run(measure(args)), args, render)


if __name__ == "__main__":
    raise SystemExit(main())
