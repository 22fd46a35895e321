"""How efficiently `autotune sweep` finds the best configuration (issue: sweep, must-show 2).

On the simulated engine, measured in virtual time (probe-seconds are the seconds the
probes would have run on the server), it compares:

  grid      every configuration of the search space × every parallelism of the doubling
            ladder: its best point is the true optimum;
  auto_tune vLLM's auto_tune.sh manner: a grid over max_num_seqs × max_num_batched_tokens
            at a fixed TP and gpu_memory_utilization, each combination one benchmark run of
            1,000 prompts sent at once (request rate inf);
  study     autotune's search (TPE over server knobs, a doubling curve per trial), 30
            trials at most, over 5 seeds.

Target: the median study reaches ≥ 95% of the grid optimum within 30 trials, and spends
fewer probe-seconds than the full grid and than the auto_tune-style grid.

    python benchmarks/sweep_efficiency.py [--seeds 5] [--trials 30] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.config import Study
from autotune.errors import ServerStartupError
from autotune.probe import ProbeSettings
from autotune.probe.virtual import VirtualSimLauncher
from autotune.servers.sim.scheduler import SimEngine
from autotune.servers.sim.server import SimConfigError, load_config
from autotune.sweep.search import grid_values, open_study, optimise

FIXED_ARGS = ["--gpu", "h100-80gb", "--model", "llama-3.1-70b"]
PROMPT, OUTPUT = (512, 128), (256, 64)
SETTINGS = ProbeSettings(parallelism=1, warmup_s=1.0, min_s=3.0, max_s=30.0)
STUDY = {
    "name": "efficiency",
    "target": {"kind": "sim", "args": FIXED_ARGS},
    "search_space": {
        "parallelism": {"low": 4, "high": 1024},
        "tensor_parallel_size": {"choices": [2, 4, 8]},
        "gpu_memory_utilization": {"low": 0.80, "high": 0.95, "step": 0.05},
        "max_num_seqs": {"choices": [16, 32, 64, 128, 256, 512]},
        "max_num_batched_tokens": {"choices": [256, 512, 1024, 2048, 8192]},
    },
    "objective": {"metric": "rollouts_per_s"},
    "budget": {"trials": 30, "patience": 6},
}
AUTO_TUNE_TP, AUTO_TUNE_GMU, AUTO_TUNE_PROMPTS = 8, 0.9, 1000


def launcher(seed: int = 0) -> VirtualSimLauncher:
    return VirtualSimLauncher(FIXED_ARGS, SETTINGS, PROMPT, OUTPUT, seed)


async def grid(study: Study) -> tuple[float, dict[str, Any], float, int]:
    """Every configuration at every parallelism: (optimum, where, probe-seconds, configs)."""
    space = study.search_space
    knobs = space.server_knobs()
    ladder = []
    n = space.parallelism.low
    while n <= space.parallelism.high:
        ladder.append(n)
        n *= 2
    best, where, probe_s, configs = 0.0, {}, 0.0, 0
    for values in itertools.product(*(grid_values(s) for s in knobs.values())):
        config = dict(zip(knobs, values, strict=True))
        configs += 1
        try:
            async with launcher().running(config) as session:
                for parallelism in ladder:
                    point = await session.measure(parallelism)
                    probe_s += point.probe_s
                    if point.rollouts_per_s > best:
                        best, where = point.rollouts_per_s, {**config, "parallelism": parallelism}
        except ServerStartupError:
            continue
    return best, where, probe_s, configs


async def auto_tune_style(study: Study) -> tuple[float, float, int]:
    """(best throughput, probe-seconds, runs) of a max_num_seqs × max_num_batched_tokens grid."""
    knobs = study.search_space.server_knobs()
    best, probe_s, runs = 0.0, 0.0, 0
    for seqs, tokens in itertools.product(
        grid_values(knobs["max_num_seqs"]), grid_values(knobs["max_num_batched_tokens"])
    ):
        flags = [
            *FIXED_ARGS, "--tensor-parallel-size", str(AUTO_TUNE_TP),
            "--gpu-memory-utilization", str(AUTO_TUNE_GMU),
            "--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(tokens),
        ]  # fmt: skip
        try:
            config = load_config(flags)
        except SimConfigError:
            continue
        runs += 1
        async with SimEngine(replace(config.engine_config(), time_scale=0.0)) as engine:
            requests = [engine.submit(PROMPT[0], OUTPUT[0]) for _ in range(AUTO_TUNE_PROMPTS)]
            await asyncio.gather(*(r.finished for r in requests))
            makespan = engine.sim_time_s
        probe_s += makespan
        best = max(best, AUTO_TUNE_PROMPTS / makespan)
    return best, probe_s, runs


async def one_study(study: Study, seed: int, optimum: float) -> dict[str, Any]:
    seeded = study.model_copy(update={"seed": seed})
    with tempfile.TemporaryDirectory() as tmp:
        optuna_study = open_study(seeded, f"sqlite:///{Path(tmp) / 'study.db'}")
        progress: list[tuple[int, float, float]] = []  # trial, best so far, probe-s so far
        state = {"best": 0.0, "probe_s": 0.0}

        def on_trial(number: int, outcome: Any) -> None:
            state["probe_s"] += outcome.probe_s
            if outcome.infeasible_reason is None:
                state["best"] = max(state["best"], outcome.value)
            progress.append((number + 1, state["best"], state["probe_s"]))

        await optimise(seeded, optuna_study, launcher(seed), on_trial=on_trial)
    reached = next(((t, s) for t, b, s in progress if b >= 0.95 * optimum), (None, None))
    return {
        "seed": seed,
        "trials": len(progress),
        "best": state["best"],
        "fraction": state["best"] / optimum,
        "probe_s": state["probe_s"],
        "trials_to_95": reached[0],
        "probe_s_to_95": reached[1],
    }


async def main_async(args: argparse.Namespace) -> int:
    study = Study.model_validate(
        {**STUDY, "budget": {"trials": args.trials, "patience": STUDY["budget"]["patience"]}}
    )
    started = time.perf_counter()
    optimum, where, grid_s, configs = await grid(study)
    print(
        f"grid: {configs} configurations, optimum {optimum:.2f} rollouts/s at {where}, "
        f"{grid_s:,.0f} probe-s ({time.perf_counter() - started:.0f} s wall)"
    )
    auto_best, auto_s, runs = await auto_tune_style(study)
    print(
        f"auto_tune-style: {runs} runs at TP={AUTO_TUNE_TP}, best {auto_best:.2f} rollouts/s "
        f"({auto_best / optimum:.0%} of optimum), {auto_s:,.0f} probe-s"
    )
    rows = [await one_study(study, seed, optimum) for seed in range(args.seeds)]
    print()
    print(
        f"{'seed':>4} {'trials':>6} {'best':>8} {'of opt':>7} {'to 95%':>7} "
        f"{'probe-s to 95%':>15} {'probe-s total':>14}"
    )
    for row in rows:
        to95 = row["trials_to_95"] if row["trials_to_95"] is not None else "-"
        s95 = f"{row['probe_s_to_95']:,.0f}" if row["probe_s_to_95"] is not None else "-"
        print(
            f"{row['seed']:>4} {row['trials']:>6} {row['best']:>8.2f} {row['fraction']:>7.1%} "
            f"{to95!s:>7} {s95:>15} {row['probe_s']:>14,.0f}"
        )
    median_fraction = statistics.median(r["fraction"] for r in rows)
    median_probe_s = statistics.median(r["probe_s"] for r in rows)
    print()
    print(
        f"median study: {median_fraction:.1%} of the grid optimum, {median_probe_s:,.0f} probe-s "
        f"= {median_probe_s / grid_s:.1%} of the full grid, {median_probe_s / auto_s:.0%} of "
        f"the auto_tune-style grid"
    )
    ok = median_fraction >= 0.95 and median_probe_s < grid_s and median_probe_s < auto_s
    print(
        f"target (≥ 95% of optimum within {args.trials} trials, fewer probe-s than both "
        f"grids): {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok or not args.check else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
