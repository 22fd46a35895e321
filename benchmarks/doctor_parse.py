"""Reading a long RL log with `autotune doctor`; target: 10,000 verl steps in < 2 s, < 200 MB.

The log is verl's one-metric-a-line console format (the longer of its two), 83 metrics a
step as verl 0.7 prints them, numbers varying from step to step. Each round reads and
dissects it in a fresh process (`autotune.doctor`: detection, parsing, the steady state
and the bound), so its peak RSS is that process's own high-water mark.

    python benchmarks/doctor_parse.py [--steps 10000] [--rounds 3] [--json] [--check]

Targets: the median round under 2 s, its peak RSS under 200 MB. Exit status is 0 unless
--check is given and a target is missed.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

TARGET_S = 2.0
TARGET_MB = 200.0
# A verl 0.7 step's metrics, as its console prints them.
METRICS = (
    "global_seqlen/min",
    "global_seqlen/max",
    "global_seqlen/minmax_diff",
    "global_seqlen/balanced_min",
    "global_seqlen/balanced_max",
    "global_seqlen/mean",
    "actor/entropy",
    "perf/mfu/actor_infer",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/pg_clipfrac_lower",
    "actor/kl_coef",
    "actor/grad_norm",
    "perf/mfu/actor",
    "perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "perf/cpu_memory_used_gb",
    "actor/lr",
    "training/global_step",
    "training/epoch",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "critic/returns/mean",
    "critic/returns/max",
    "critic/returns/min",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "response_length_non_aborted/mean",
    "response_length_non_aborted/max",
    "response_length_non_aborted/min",
    "response_length_non_aborted/clip_ratio",
    "response/aborted_ratio",
    "prompt_length/mean",
    "prompt_length/max",
    "prompt_length/min",
    "prompt_length/clip_ratio",
    "num_turns/min",
    "num_turns/max",
    "num_turns/mean",
    "timing_s/start_profile",
    "timing_s/agent_loop/num_preempted/min",
    "timing_s/agent_loop/num_preempted/max",
    "timing_s/agent_loop/num_preempted/mean",
    "timing_s/agent_loop/generate_sequences/min",
    "timing_s/agent_loop/generate_sequences/max",
    "timing_s/agent_loop/generate_sequences/mean",
    "timing_s/agent_loop/tool_calls/min",
    "timing_s/agent_loop/tool_calls/max",
    "timing_s/agent_loop/tool_calls/mean",
    "timing_s/agent_loop/slowest/generate_sequences",
    "timing_s/agent_loop/slowest/tool_calls",
    "timing_s/agent_loop/slowest/prompt_length",
    "timing_s/agent_loop/slowest/response_length",
    "timing_s/agent_loop/slowest/num_preempted",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/update_weights",
    "timing_s/step",
    "timing_s/stop_profile",
    "timing_per_token_ms/gen",
    "timing_per_token_ms/adv",
    "timing_per_token_ms/ref",
    "timing_per_token_ms/update_actor",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/throughput",
)
READ = """
import resource, sys, time
from pathlib import Path
started = time.perf_counter()
from autotune.doctor.anatomy import dissect
from autotune.doctor.formats import read_run
imported = time.perf_counter()
anatomy = dissect(read_run(Path(sys.argv[1])))
done = time.perf_counter()
print(len(anatomy.steps), anatomy.verdict, done - imported, imported - started,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def write_log(path: Path, steps: int, seed: int = 0) -> int:
    """A verl console log of `steps` steps, one metric a line; its size in bytes."""
    rng = random.Random(seed)
    with path.open("w") as log:
        for step in range(1, steps + 1):
            log.write(f"(TaskRunner pid=15930, ip=10.4.1.33) step:{step}\n")
            gen = 24.5 * rng.uniform(0.8, 1.2)
            for name in METRICS:
                value = gen if name == "timing_s/gen" else rng.uniform(0.0, 100.0)
                if name == "timing_s/step":
                    value = gen + 69.0 * rng.uniform(0.9, 1.1)
                log.write(f" - {name}:{value!r}\n")
    return path.stat().st_size


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "verl.log"
        size = write_log(log, args.steps)
        rounds = []
        for _ in range(args.rounds):
            out = subprocess.run(
                [sys.executable, "-c", READ, str(log)],
                capture_output=True, text=True, check=True, cwd=harness.REPO,
            )  # fmt: skip
            steps, verdict, read_s, import_s, peak = out.stdout.split()
            rounds.append({"steps": int(steps), "verdict": verdict, "read_s": float(read_s),
                           "import_s": float(import_s), "peak_mb": int(peak) / 1e6})  # fmt: skip
    return {
        "benchmark": "doctor_parse",
        "machine": harness.machine(),
        "steps": args.steps,
        "log_mb": size / 1e6,
        "rounds": rounds,
        "read_s": harness.median([r["read_s"] for r in rounds]),
        "peak_mb": max(r["peak_mb"] for r in rounds),
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    return [
        harness.Target("steps read", result["rounds"][0]["steps"], result["steps"], "=="),
        harness.Target("read and dissected (median)", result["read_s"], TARGET_S, "<", "s", ".2f"),
        harness.Target("peak RSS", result["peak_mb"], TARGET_MB, "<", "MB", ".0f"),
    ]


def render(result: dict[str, Any]) -> str:
    lines = [
        f"a verl log of {result['steps']:,} steps, {result['log_mb']:.1f} MB, one metric a line"
    ]
    for i, r in enumerate(result["rounds"], 1):
        lines.append(
            f"  round {i}: read and dissected in {r['read_s']:.2f} s (imports {r['import_s']:.2f} s"
            f" before), peak RSS {r['peak_mb']:.0f} MB, {r['steps']:,} steps, {r['verdict']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, rounds=3)
    parser.add_argument("--steps", type=harness.count, default=10_000)
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
