"""Accepted rollouts/s under a rate limit; target: with adaptive concurrency >= 80% of the limit.

`autotune collect --parallelism 64` runs against a sliding-window limit (tests/rate_limit.py)
that admits `--limit` requests in any one second, refuses the rest with 429 and
`Retry-After: 1`, and counts the refused attempts too, as many hosted APIs do. At a fixed
parallelism the refused calls retry together and keep the limit tripped; with adaptive
concurrency (collect's default) the engine halves its calls in flight on refusals, holds
retries to that limit and grows it back on successes, so what the endpoint accepts stays
near its limit. Each mode gets a fresh server; a run is capped at twice `--seconds`.

    python benchmarks/rate_limit.py [--limit 15] [--seconds 40] [--parallelism 64]
                                    [--json] [--check]

Target: with adaptive concurrency, accepted rollouts/s >= 80% of the limit. Exit status is
0 unless --check is given and the target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from autotune.collector.collect_job import collect
from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.processes.event_loop import run_async
from autotune.servers.launcher import ServerSpec, free_port

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

MIN_SHARE_OF_LIMIT = 0.80


async def one_run(args: argparse.Namespace, adaptive: bool, out_dir: Path) -> dict[str, Any]:
    """One collection against a fresh rate-limited server: what it got accepted."""
    port = free_port()
    command = [sys.executable, "-m", "tests.rate_limit", "--limit", str(args.limit)]
    spec = replace(ServerSpec.local([*command, "--port", str(port)], port), cwd=harness.REPO)
    output = out_dir / f"adaptive-{adaptive}.jsonl"
    config = CollectConfig(
        target=TargetConfig(base_url=f"http://127.0.0.1:{port}/v1"),
        synthetic=SyntheticWorkload(num_tasks=int(args.limit * args.seconds)),
        parallelism=args.parallelism,
        adaptive_concurrency=adaptive,
        output=output,
        progress=False,
    )
    async with spec.process():
        started = time.perf_counter()
        try:
            summary = await asyncio.wait_for(collect(config), 2 * args.seconds)
        except TimeoutError:  # a storm that never ends: what reached the file counts
            summary = None
        elapsed = time.perf_counter() - started
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/stats") as resp,
        ):
            server = await resp.json()
    completed = sum(1 for _ in output.open("rb")) if summary is None else summary.completed
    elapsed = elapsed if summary is None else summary.elapsed_s
    return {
        "adaptive_concurrency": adaptive,
        "finished": summary is not None,
        "completed": completed,
        "failed": None if summary is None else summary.failed,
        "elapsed_s": elapsed,
        "accepted_rollouts_per_s": completed / elapsed,
        "share_of_limit": completed / elapsed / args.limit,
        "server_admitted": server["admitted"],
        "server_refused": server["refused"],
        "concurrency_limit_min": None if summary is None else summary.concurrency_limit_min,
        "concurrency_limit_final": None if summary is None else summary.concurrency_limit_final,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Adaptive concurrency on, then off; the figures as a dict."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for adaptive in (True, False):
            run = run_async(one_run(args, adaptive, Path(tmp)))
            harness.log(
                f"  adaptive {'on ' if adaptive else 'off'}: {run['completed']:,} rollouts in "
                f"{run['elapsed_s']:.1f} s = {run['accepted_rollouts_per_s']:.2f}/s; the server "
                f"admitted {run['server_admitted']:,} and refused {run['server_refused']:,}"
            )
            runs.append(run)
    return {
        "benchmark": "rate_limit",
        "schema_version": 1,
        "machine": harness.machine(),
        "limit_per_s": args.limit,
        "parallelism": args.parallelism,
        "rollouts": int(args.limit * args.seconds),
        "runs": runs,
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    on = result["runs"][0]  # adaptive concurrency on
    name = "accepted rollouts/s, adaptive on / the limit"
    return [harness.Target(name, on["share_of_limit"], MIN_SHARE_OF_LIMIT, ">=", "%")]


TABLE = harness.Table(
    "adaptive concurrency:<22 | accepted/s:12.2f | of limit:10.0% | failed:8, | 429s:8, "
    "| limit min/end:15 | seconds:9.1f"
)


def render(result: dict[str, Any]) -> str:
    """The figures as a small table."""
    rows = [
        (
            "on" if run["adaptive_concurrency"] else "off",
            run["accepted_rollouts_per_s"],
            run["share_of_limit"],
            "capped" if run["failed"] is None else run["failed"],
            run["server_refused"],
            None
            if run["concurrency_limit_min"] is None
            else f"{run['concurrency_limit_min']}/{run['concurrency_limit_final']}",
            run["elapsed_s"],
        )
        for run in result["runs"]
    ]
    return "\n".join(
        [
            f"collect at parallelism {result['parallelism']}, {result['rollouts']:,} rollouts, "
            f"against {result['limit_per_s']:g} requests/s (sliding 1 s window, refusals "
            "counted)",
            *TABLE.lines(rows),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__)
    positive = harness.positive
    parser.add_argument("--limit", type=positive, default=15.0, help="requests per second")
    parser.add_argument(
        "--seconds", type=positive, default=40.0, help="a run's length at the limit"
    )
    parser.add_argument("--parallelism", type=harness.count, default=64)
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
