"""Engine CPU per model call, 3-turn vs single-turn rollouts; target: multi-turn no dearer.

One null server (its own core) answers every chat request that offers tools with a tool
call until the conversation holds two tool results, so a rollout with tools (`--tools
null`: each call answered at once, in-process) makes 3 model calls; the same tasks
without tools make one. The client, pinned to the other core, is bound by its own CPU,
so its CPU seconds per model call are what each model call costs the engine: the loop's
messages, output items, turn timings and the bigger row included. The two alternate for
R rounds (the order flipping each round) and the medians are compared.

    python benchmarks/multiturn_overhead.py [--rollouts 3000] [--concurrency 64]
                                            [--rounds 3] [--json] [--check]

Target: a multi-turn model call costs the engine no more than a single-turn one (the
median CPU µs per model call). Exit status is 0 unless --check is given and it does.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from autotune.bench.overhead import cpu_seconds
from autotune.collector.collect_job import run_collect
from autotune.config.collection import CollectConfig, TargetConfig

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

TURNS = 3
PROMPT = " ".join(["lorem ipsum dolor sit amet"] * 40)  # ~1 KB, as the overhead benchmark's
TOOL = {"type": "function", "name": "null", "parameters": {"type": "object", "properties": {}}}


@dataclass(frozen=True, slots=True)
class Run:
    kind: str  # "single" or "multi"
    rollouts: int
    model_calls: int
    failed: int
    elapsed_s: float
    cpu_s: float

    @property
    def cpu_us_per_call(self) -> float:
        return self.cpu_s / max(self.model_calls, 1) * 1e6

    @property
    def calls_per_s(self) -> float:
        return self.model_calls / self.elapsed_s


def write_tasks(path: Path, count: int) -> None:
    """`count` NeMo Gym rows that offer the null tool."""
    with path.open("wb") as handle:
        for index in range(count):
            params = {"input": f"[{index}] {PROMPT}", "tools": [TOOL], "max_output_tokens": 64}
            handle.write(orjson.dumps({"responses_create_params": params}) + b"\n")


def measure(base_url: str, tasks: Path, out_dir: Path, multi: bool, concurrency: int) -> Run:
    """One collect of `tasks`; its model calls counted from the rows' turns."""
    output = out_dir / "rollouts.jsonl"
    config = CollectConfig(
        target=TargetConfig(base_url=base_url, model="null", stream=False),
        input=tasks,
        parallelism=concurrency,
        tools="null" if multi else None,
        max_turns=TURNS,
        output=output,
        progress=False,
    )
    cpu0 = cpu_seconds()
    summary = run_collect(config)
    cpu = cpu_seconds() - cpu0
    calls = 0
    for line in output.read_bytes().splitlines():
        calls += len(orjson.loads(line)["_autotune"].get("turns") or [None])
    for written in out_dir.iterdir():  # the rows, the run record, the failures
        written.unlink()
    return Run(
        "multi" if multi else "single",
        summary.completed,
        calls,
        summary.failed,
        summary.elapsed_s,
        cpu,
    )


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    """A warm-up, then single-turn and multi-turn runs alternating; the figures as a dict."""
    _, server_core = harness.pin_client()
    runs: list[Run] = []
    with (
        harness.null_server(server_core, tool_turns=TURNS) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        root = Path(tmp)
        (root / "out").mkdir()
        multi_tasks, single_tasks = root / "multi.jsonl", root / "single.jsonl"
        write_tasks(multi_tasks, args.rollouts)
        write_tasks(single_tasks, args.rollouts * TURNS)  # as many model calls as multi
        measure(server.base_url, single_tasks, root / "out", False, args.concurrency)  # warm
        for index, order in enumerate(harness.rotations([False, True], args.rounds)):
            for multi in order:
                tasks = multi_tasks if multi else single_tasks
                run = measure(server.base_url, tasks, root / "out", multi, args.concurrency)
                runs.append(run)
                harness.log(
                    f"  round {index + 1}/{args.rounds}: {run.kind:6} {run.model_calls:,} model "
                    f"calls in {run.elapsed_s:.2f} s ({run.calls_per_s:,.0f}/s), "
                    f"{run.cpu_us_per_call:.0f} µs CPU a call, failed {run.failed}"
                )
    single = harness.median([r.cpu_us_per_call for r in runs if r.kind == "single"])
    multi = harness.median([r.cpu_us_per_call for r in runs if r.kind == "multi"])
    return {
        "benchmark": "multiturn_overhead",
        "turns": TURNS,
        "cpu_us_per_model_call": {"single": single, "multi": multi},
        "model_calls_per_s": {
            kind: harness.median([r.calls_per_s for r in runs if r.kind == kind])
            for kind in ("single", "multi")
        },
        "multi_over_single": multi / single,
        "runs": [asdict(r) for r in runs],
        "machine": harness.machine(),
        "at": time.time(),
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    name = f"CPU per model call, {TURNS}-turn / single-turn"
    return [harness.Target(name, result["multi_over_single"], 1.0, "<=", "x", ".3f")]


def render(result: dict[str, Any]) -> str:
    cpu = result["cpu_us_per_model_call"]
    return (
        f"CPU per model call: single-turn {cpu['single']:.0f} µs, {TURNS}-turn "
        f"{cpu['multi']:.0f} µs (×{result['multi_over_single']:.2f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, rounds=3)
    parser.add_argument("--rollouts", type=int, default=3000, help="per multi-turn run")
    parser.add_argument("--concurrency", type=int, default=64)
    return harness.run_bench(parser, argv, measure_all, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
