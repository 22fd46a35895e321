"""The engine's cost per model call: multi-turn rollouts against single-turn ones.

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
median CPU µs per model call); exit status 1 with --check when it does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from autotune.config.collection import CollectConfig, TargetConfig
from autotune.rollout.collect_job import run_collect

try:  # run as a script (benchmarks/ on sys.path) or as `python -m benchmarks.multiturn_overhead`
    import _common
except ImportError:  # pragma: no cover
    from benchmarks import _common  # type: ignore[no-redef]

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
    cpu0 = _common.cpu_seconds()
    summary = run_collect(config)
    cpu = _common.cpu_seconds() - cpu0
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=3000, help="per multi-turn run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    client_core, server_core = _common.core_plan()
    _common.pin_self(client_core)
    runs: list[Run] = []
    with (
        _common.NullServer(core=server_core, tool_turns=TURNS) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        root = Path(tmp)
        (root / "out").mkdir()
        multi_tasks, single_tasks = root / "multi.jsonl", root / "single.jsonl"
        write_tasks(multi_tasks, args.rollouts)
        write_tasks(single_tasks, args.rollouts * TURNS)  # as many model calls as multi
        measure(server.base_url, single_tasks, root / "out", False, args.concurrency)  # warm
        for index in range(args.rounds):
            order = (False, True) if index % 2 == 0 else (True, False)
            for multi in order:
                tasks = multi_tasks if multi else single_tasks
                run = measure(server.base_url, tasks, root / "out", multi, args.concurrency)
                runs.append(run)
                print(
                    f"  round {index + 1}/{args.rounds}: {run.kind:6} {run.model_calls:,} model "
                    f"calls in {run.elapsed_s:.2f} s ({run.calls_per_s:,.0f}/s), "
                    f"{run.cpu_us_per_call:.0f} µs CPU a call, failed {run.failed}",
                    file=sys.stderr,
                )
    single = _common.median([r.cpu_us_per_call for r in runs if r.kind == "single"])
    multi = _common.median([r.cpu_us_per_call for r in runs if r.kind == "multi"])
    result = {
        "turns": TURNS,
        "cpu_us_per_model_call": {"single": single, "multi": multi},
        "model_calls_per_s": {
            kind: _common.median([r.calls_per_s for r in runs if r.kind == kind])
            for kind in ("single", "multi")
        },
        "multi_over_single": multi / single,
        "ok": multi <= single,
        "runs": [asdict(r) for r in runs],
        "machine": _common.machine(),
        "at": time.time(),
    }
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(
            f"CPU per model call: single-turn {single:.0f} µs, {TURNS}-turn {multi:.0f} µs "
            f"(×{multi / single:.2f}): {'ok' if multi <= single else 'MORE per call'}"
        )
    return 1 if args.check and multi > single else 0


if __name__ == "__main__":
    raise SystemExit(main())
