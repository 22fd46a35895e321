"""How well `autotune sweep` finds a grid's optimum on the simulator; target: median >= 99% of it.

Issue 14, must-show 1: how efficiently the study finds the best configuration. On the
simulated engine, measured in virtual time (probe-seconds are the seconds the probes
would have run on the server), every scenario compares:

  grid       every configuration of the search space × every parallelism of the doubling
             ladder (up to twice the configuration's max_num_seqs: past it requests only
             queue), each rung measured long (a window of eight rollout latencies, at
             least 30 s): its best point is the true optimum, and its value for each
             configuration is the truth a study's choice is judged by;
  auto_tune  vLLM's auto_tune.sh manner: a grid over max_num_seqs × max_num_batched_tokens
             at a fixed TP and gpu_memory_utilization 0.9, each combination one run of
             1,000 prompts sent at once (request rate inf). It is run at every TP of the
             space: a user must guess one, so the table shows the smallest TP that fits
             (a typical guess) and the best TP (what it costs to have guessed right);
  study      autotune's search (TPE over server knobs, a curve per trial, pruning,
             rejection before launch), at most 30 trials, 5 seeds. A study is judged by
             the grid's value of the configuration it chose, not by its own (noisy)
             figure; its probe-seconds count the search, not the validation run after it.

Scenarios: a 70B model on H100s (TP 2/4/8), and Qwen2.5-7B on L40S cards (TP 1/2/4/8)
whose 28 attention heads cannot be split 8 ways, so its best TP is not the largest one
offered (in the simulator's model a server's throughput grows with its TP, so only a TP
the model cannot use keeps the optimum below the largest).

Target, those scenarios: median study ≥ 99% and worst seed ≥ 95% of the grid optimum,
within 30 trials, with median probe-seconds at most a third of the auto_tune-style grid
at the best TP.

GPU-budget scenarios (issue 13): Llama-3.1-8B and Llama-3.1-70B on 8 simulated H100s
(`resources: {gpus: 8}`), GRPO groups of 8 rollouts sharing a prompt, searching the
split of the GPUs into engines × TP, max_num_seqs, prefix caching and parallelism. The
engines share one virtual clock and calls are routed as the HTTP backend routes them
(probe.virtual). The grid is every split × max_num_seqs × caching × parallelism; the
table shows each split's best and what caching bought there. There is no auto_tune row:
it never changes the number of engines. Target: median study ≥ 95% of the grid optimum
within 30 trials. A study's first trial is the configuration known to hold the most
requests at once, which here is often the optimum already; `--no-seed-trial` measures
the search without it.

    python benchmarks/sweep_efficiency.py [--seeds 5] [--trials 30] [--scenario NAME] [--check]
                                          [--no-seed-trial]

All four scenarios take about 5 minutes on two cores (the budget ones about 1 each). Exit
status is 0 unless --check is given and a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.config.study import Study
from autotune.engine_model.scheduler import SimEngine
from autotune.engine_model.state import engine_config
from autotune.errors import ServerStartupError
from autotune.hardware.deployment import SimConfigError
from autotune.probe import ProbeSettings
from autotune.probe.virtual import VirtualSimLauncher
from autotune.results.trials import TrialOutcome
from autotune.servers.sim.server import load_config
from autotune.sweep.feasibility import knobs_of, parameters
from autotune.sweep.search import grid_values, open_study, optimise

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

Target = harness.Target

PROMPT, OUTPUT = (512, 128), (256, 64)
SETTINGS = ProbeSettings(parallelism=1, warmup_s=1.0, min_s=3.0, max_s=30.0)
GRID_LATENCIES = 8.0  # a grid rung's window, in rollout latencies (four batches)
AUTO_TUNE_GMU, AUTO_TUNE_PROMPTS = 0.9, 1000
MEDIAN_TARGET, WORST_TARGET, COST_TARGET = 0.99, 0.95, 1 / 3
BUDGET_MEDIAN_TARGET = 0.95  # the GPU-budget scenarios' target
SHORT = {
    "num_engines": "engines",
    "tensor_parallel_size": "tp",
    "gpu_memory_utilization": "gmu",
    "max_num_seqs": "seqs",
    "max_num_batched_tokens": "tokens",
    "enable_prefix_caching": "caching",
}
CLASSIC_SPACE = {
    "gpu_memory_utilization": {"low": 0.80, "high": 0.95, "step": 0.05},
    "max_num_seqs": {"choices": [16, 32, 64, 128, 256, 512]},
    "max_num_batched_tokens": {"choices": [256, 512, 1024, 2048, 8192]},
}
BUDGET_SPACE = {
    "max_num_seqs": {"choices": [64, 128, 256, 512]},
    "enable_prefix_caching": {"choices": [True, False]},
}


@dataclass(frozen=True)
class Scenario:
    name: str
    args: list[str]
    tensor_parallel_sizes: list[int]  # searched as a knob; empty: split from `gpus`
    space: dict[str, Any]
    gpus: int | None = None  # a GPU budget: engines × TP searched within it
    num_repeats: int = 1  # rollouts per task (GRPO group size)
    low: int = 4
    high: int = 1024

    def study(self, trials: int, seed: int = 0) -> Study:
        space = dict(self.space)
        if self.tensor_parallel_sizes:
            space["tensor_parallel_size"] = {"choices": self.tensor_parallel_sizes}
        return Study.model_validate(
            {
                "name": "efficiency",
                "target": {"kind": "sim", "args": self.args},
                "workload": {
                    "synthetic": {"prompt_tokens": PROMPT, "output_tokens": OUTPUT},
                    "num_repeats": self.num_repeats,
                },
                "search_space": {"parallelism": {"low": self.low, "high": self.high}, **space},
                "resources": {"gpus": self.gpus} if self.gpus else None,
                "objective": {"metric": "rollouts_per_s"},
                "budget": {"trials": trials, "patience": 6},
                "probe": {"warmup_s": SETTINGS.warmup_s, "min_s": 3.0, "max_s": 30.0},
                "seed": seed,
            }
        )


def budget_scenario(name: str, model: str) -> Scenario:
    """`model` on a budget of 8 simulated H100s, GRPO groups of 8 rollouts a prompt."""
    args = ["--gpu", "h100-80gb", "--model", model]
    return Scenario(name, args, [], BUDGET_SPACE, gpus=8, num_repeats=8, low=16, high=4096)


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            "70b-h100",
            ["--gpu", "h100-80gb", "--model", "llama-3.1-70b"],
            [2, 4, 8],
            CLASSIC_SPACE,
        ),
        Scenario(
            "7b-l40s", ["--gpu", "l40s", "--model", "qwen2.5-7b"], [1, 2, 4, 8], CLASSIC_SPACE
        ),
        budget_scenario("8b-budget", "llama-3.1-8b"),
        budget_scenario("70b-budget", "llama-3.1-70b"),
    )
}


def key(knobs: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """A configuration as a lookup key (Optuna may hand integer choices back as floats)."""
    return tuple(sorted((name, float(value)) for name, value in knobs.items()))


def launcher(scenario: Scenario, seed: int = 0) -> VirtualSimLauncher:
    return VirtualSimLauncher(scenario.args, SETTINGS, PROMPT, OUTPUT, seed, scenario.num_repeats)


async def grid(
    scenario: Scenario, study: Study
) -> tuple[dict[Any, float], dict[str, Any], float, list[dict[str, Any]]]:
    """Every configuration at every parallelism: (each configuration's best value, where
    the optimum is, probe-seconds, every configuration that started)."""
    space = study.search_space
    params = parameters(study)
    values: dict[Any, float] = {}
    best, where, probe_s, started = 0.0, {}, 0.0, []
    for combination in itertools.product(*(grid_values(s) for s in params.values())):
        config = knobs_of(dict(zip(params, combination, strict=True)))
        engines = int(config.get("num_engines", 1))
        top = min(space.parallelism.high, 2 * engines * int(config["max_num_seqs"]))
        try:
            async with launcher(scenario).running(config) as probe:
                n, latency, found = space.parallelism.low, None, 0.0
                while n <= top:
                    window = max(SETTINGS.max_s, GRID_LATENCIES * 2 * (latency or 0.0))
                    point = await probe.measure(n, replace(SETTINGS, max_s=window))
                    probe_s += point.probe_s
                    if point.rollouts_per_s > 0:
                        latency = n / point.rollouts_per_s
                    if point.rollouts_per_s > found:
                        found = point.rollouts_per_s
                    if point.rollouts_per_s > best:
                        best, where = point.rollouts_per_s, {**config, "parallelism": n}
                    n *= 2
        except ServerStartupError:
            continue
        values[key(config)] = found
        started.append(config)
    return values, where, probe_s, started


async def auto_tune_style(scenario: Scenario, study: Study, tp: int) -> tuple[float, float, int]:
    """(best throughput, probe-seconds, runs) of a max_num_seqs × max_num_batched_tokens
    grid at one TP, 1,000 prompts at once per combination."""
    knobs = study.search_space.server_knobs()
    best, probe_s, runs = 0.0, 0.0, 0
    for seqs, tokens in itertools.product(
        grid_values(knobs["max_num_seqs"]), grid_values(knobs["max_num_batched_tokens"])
    ):
        flags = [
            *scenario.args, "--tensor-parallel-size", str(tp),
            "--gpu-memory-utilization", str(AUTO_TUNE_GMU),
            "--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(tokens),
        ]  # fmt: skip
        try:
            config = load_config(flags)
        except SimConfigError:
            continue
        runs += 1
        async with SimEngine(replace(engine_config(config), time_scale=0.0)) as engine:
            requests = [engine.submit(PROMPT[0], OUTPUT[0]) for _ in range(AUTO_TUNE_PROMPTS)]
            await asyncio.gather(*(r.finished for r in requests))
            makespan = engine.sim_time_s
        probe_s += makespan
        best = max(best, AUTO_TUNE_PROMPTS / makespan)
    return best, probe_s, runs


async def one_study(
    scenario: Scenario, study: Study, seed: int, seed_first: bool = True
) -> dict[str, Any]:
    seeded = study.model_copy(update={"seed": seed})
    outcomes: list[TrialOutcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        optuna_study = open_study(seeded, f"sqlite:///{Path(tmp) / 'study.db'}")
        await optimise(
            seeded,
            optuna_study,
            launcher(scenario, seed),
            on_trial=lambda _, o: outcomes.append(o),
            seed_first=seed_first,
        )
    complete = [
        o for o in outcomes if o.infeasible_reason is None and o.pruned_reason is None and o.curve
    ]
    chosen = max(complete, key=lambda o: o.value)
    return {
        "seed": seed,
        "trials": len(outcomes),
        "launched": sum(o.probe_s > 0 for o in outcomes),
        "pruned": sum(o.pruned_reason is not None and o.probe_s > 0 for o in outcomes),
        "rejected": sum(o.infeasible_reason is not None and o.probe_s == 0 for o in outcomes),
        "chosen": chosen.knobs,
        "first": outcomes[0].knobs,
        "measured": chosen.value,
        "probe_s": sum(o.probe_s for o in outcomes),
    }


SPLIT_TABLE = harness.Table(
    "engines x TP:12 | best:8.2f | of opt:7.1% | vs 1 engine:11 | caching on:10.2f | off:8.2f "
    "| gain:6",
    gap=" ",
)


def split_table(
    truth: dict[Any, float], configs: list[dict[str, Any]], optimum: float
) -> tuple[str, dict[str, float]]:
    """Each split's best (the grid's), against the optimum and against the one-engine
    split, with caching on and off there; and each split's best by name."""
    by_split: dict[str, dict[bool, float]] = {}
    for config in configs:
        name = f"{config['num_engines']}x{config['tensor_parallel_size']}"
        caching = bool(config.get("enable_prefix_caching", True))
        seen = by_split.setdefault(name, {})
        seen[caching] = max(seen.get(caching, 0.0), truth[key(config)])
    best = {name: max(seen.values()) for name, seen in by_split.items()}
    one_engine = next((best[name] for name in best if name.startswith("1x")), None)
    rows = []
    for name, value in sorted(best.items(), key=lambda item: -item[1]):
        on, off = by_split[name].get(True, 0.0), by_split[name].get(False, 0.0)
        ratio = f"x{value / one_engine:.2f}" if one_engine else None
        gain = f"x{on / off:.2f}" if off > 0 else None
        rows.append((name, value, value / optimum, ratio, on, off, gain))
    return "\n".join(SPLIT_TABLE.lines(rows)), best


def split_verdict(best: dict[str, float]) -> str:
    """Which split won, and by how much over each other one."""
    winner = max(best, key=lambda name: best[name])
    engines, tp = winner.split("x")
    others = ", ".join(
        f"x{best[winner] / value:.2f} of {name}"
        for name, value in sorted(best.items(), key=lambda item: -item[1])
        if name != winner and value > 0
    )
    sizes = [int(name.split("x")[1]) for name in best]
    which = (
        "the most engines (the smallest TP that fits)"
        if int(tp) == min(sizes)
        else "the biggest TP"
        if int(tp) == max(sizes)
        else "neither the most engines nor the biggest TP"
    )
    return f"optimum split: {engines} engines x TP {tp}, {which}: {others}"


AUTO_TUNE_TABLE = harness.Table(
    "auto_tune-style at TP:22 | runs:5 | best:8.2f | of opt:7.1% | probe-s:9,.0f", gap=" "
)


async def run_scenario(scenario: Scenario, args: argparse.Namespace) -> list[Target]:
    """A scenario's grid, then (classic) the auto_tune-style grids and the studies, or (a
    GPU budget) the splits and the studies; its targets."""
    study = scenario.study(args.trials)
    sizes = f"TP {scenario.tensor_parallel_sizes}" if scenario.tensor_parallel_sizes else ""
    budget = f"{scenario.gpus} GPUs, groups of {scenario.num_repeats}" if scenario.gpus else ""
    print(f"\n== {scenario.name}: {' '.join(scenario.args)}, {sizes or budget}")
    started = time.perf_counter()
    truth, where, grid_s, configs = await grid(scenario, study)
    optimum = max(truth.values())
    print(
        f"grid: {len(truth)} configurations that start, optimum {optimum:.2f} rollouts/s at "
        f"{where}, {grid_s:,.0f} probe-s ({time.perf_counter() - started:.0f} s wall)"
    )
    if scenario.gpus:
        return await run_budget(scenario, study, args, truth, configs, optimum, grid_s)
    print("\n" + AUTO_TUNE_TABLE.header())
    per_tp = {}
    for tp in scenario.tensor_parallel_sizes:
        best, probe_s, runs = await auto_tune_style(scenario, study, tp)
        per_tp[tp] = (best, probe_s, runs)
        shown = (best, best / optimum) if runs else (None, None)
        print(AUTO_TUNE_TABLE.row((tp, runs, *shown, probe_s)))
    fits = [tp for tp, (_, _, runs) in per_tp.items() if runs]
    smallest = min(fits)
    best_tp = max(fits, key=lambda tp: per_tp[tp][0])
    print(
        f"smallest TP that fits: {smallest} ({per_tp[smallest][0] / optimum:.1%} of optimum, "
        f"{per_tp[smallest][1]:,.0f} probe-s); best TP: {best_tp} "
        f"({per_tp[best_tp][0] / optimum:.1%}, {per_tp[best_tp][1]:,.0f} probe-s)"
    )
    auto_s = per_tp[best_tp][1]
    rows = await studies(scenario, study, args)
    fractions, median_s, most_trials = study_table(rows, truth, optimum, auto_s=auto_s)
    median, worst = statistics.median(fractions), min(fractions)
    print(
        f"\nmedian {median:.1%}, worst {worst:.1%} of the optimum; at most {most_trials} "
        f"trials; median {median_s:,.0f} probe-s = {median_s / auto_s:.0%} of the auto_tune-"
        f"style grid at the best TP ({median_s / grid_s:.2%} of the full grid)"
    )
    name = scenario.name
    return [
        Target(f"{name}: median study / grid optimum", median, MEDIAN_TARGET, ">=", "%"),
        Target(f"{name}: worst seed / grid optimum", worst, WORST_TARGET, ">=", "%"),
        Target(f"{name}: trials, most of a seed", most_trials, args.trials, "<="),
        Target(
            f"{name}: median probe-s / auto_tune's at the best TP",
            median_s / auto_s,
            COST_TARGET,
            "<=",
            "%",
        ),
    ]


async def studies(
    scenario: Scenario, study: Study, args: argparse.Namespace
) -> list[dict[str, Any]]:
    return [
        await one_study(scenario, study, seed, seed_first=not args.no_seed_trial)
        for seed in range(args.seeds)
    ]


def study_table(
    rows: list[dict[str, Any]],
    truth: dict[Any, float],
    optimum: float,
    auto_s: float | None = None,
) -> tuple[list[float], float, int]:
    """Prints a row a seed: its search, the grid's value of its choice, its probe-seconds
    (against the auto_tune-style grid's `auto_s` where given, else with the first trial's
    true value: a GPU-budget study); returns each seed's share of the optimum, the median
    probe-seconds and the most trials."""
    layout = [
        "seed:4 | trials:6 | launched:8 | pruned:6 | rejected:8",
        *([] if auto_s else ["first trial:11.1%"]),
        "true value:10.2f | of opt:7.1% | probe-s:8,.0f",
        *(["of auto_tune:12.0%"] if auto_s else []),
        "chosen:<",
    ]
    table = harness.Table(" | ".join(layout), gap=" ")
    print("\n" + table.header())
    fractions = []
    for row in rows:
        true = truth.get(key(row["chosen"]), 0.0)
        first = truth.get(key(row["first"]), 0.0) / optimum  # the seeded configuration
        fractions.append(true / optimum)
        chosen = " ".join(f"{SHORT.get(k, k)}={v}" for k, v in row["chosen"].items())
        counts = [row[k] for k in ("seed", "trials", "launched", "pruned", "rejected")]
        figures = [
            *counts,
            *([] if auto_s else [first]),
            true,
            true / optimum,
            row["probe_s"],
            *([row["probe_s"] / auto_s] if auto_s else []),
            chosen,
        ]
        print(table.row(figures))
    median_s = statistics.median(r["probe_s"] for r in rows)
    return fractions, median_s, max(r["trials"] for r in rows)


async def run_budget(
    scenario: Scenario,
    study: Study,
    args: argparse.Namespace,
    truth: dict[Any, float],
    configs: list[dict[str, Any]],
    optimum: float,
    grid_s: float,
) -> list[Target]:
    """A GPU-budget scenario: the splits' table, then the studies against the grid."""
    table, best = split_table(truth, configs, optimum)
    print(f"\n{table}\n{split_verdict(best)}")
    rows = await studies(scenario, study, args)
    fractions, median_s, most_trials = study_table(rows, truth, optimum)
    median, worst = statistics.median(fractions), min(fractions)
    print(
        f"\nmedian {median:.1%}, worst {worst:.1%} of the optimum; at most {most_trials} "
        f"trials; median {median_s:,.0f} probe-s ({median_s / grid_s:.2%} of the full grid)"
    )
    name = scenario.name
    return [
        Target(f"{name}: median study / grid optimum", median, BUDGET_MEDIAN_TARGET, ">=", "%"),
        Target(f"{name}: trials, most of a seed", most_trials, args.trials, "<="),
    ]


async def main_async(args: argparse.Namespace) -> int:
    names = [args.scenario] if args.scenario else list(SCENARIOS)
    started = time.perf_counter()
    targets = [t for name in names for t in await run_scenario(SCENARIOS[name], args)]
    print(f"\n{len(names)} scenarios in {time.perf_counter() - started:.0f} s")
    return harness.report_targets(targets, args.check)


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, json=False, seeds=5)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--scenario", choices=list(SCENARIOS))
    parser.add_argument(
        "--no-seed-trial",
        action="store_true",
        help="studies start with the sampler's own draws, not the configuration known to hold "
        "the most requests at once (how much of a result the first trial alone makes)",
    )
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
