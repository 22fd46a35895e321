"""Accepted throughput under a rate limit, adaptive concurrency on and off.

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

from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.rollout.collect_job import collect, run_async
from autotune.servers.launcher import ServerSpec, free_port

try:  # run as a script (benchmarks/ on sys.path) or as `python -m benchmarks.rate_limit`
    import _common
except ImportError:  # pragma: no cover
    from benchmarks import _common  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
MIN_SHARE_OF_LIMIT = 0.80


async def one_run(args: argparse.Namespace, adaptive: bool, out_dir: Path) -> dict[str, Any]:
    """One collection against a fresh rate-limited server: what it got accepted."""
    port = free_port()
    command = [sys.executable, "-m", "tests.rate_limit", "--limit", str(args.limit)]
    spec = replace(ServerSpec.local([*command, "--port", str(port)], port), cwd=REPO)
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
            print(
                f"  adaptive {'on ' if adaptive else 'off'}: {run['completed']:,} rollouts in "
                f"{run['elapsed_s']:.1f} s = {run['accepted_rollouts_per_s']:.2f}/s; the server "
                f"admitted {run['server_admitted']:,} and refused {run['server_refused']:,}",
                file=sys.stderr,
            )
            runs.append(run)
    on = runs[0]["share_of_limit"]
    return {
        "benchmark": "rate_limit",
        "schema_version": 1,
        "machine": _common.machine(),
        "limit_per_s": args.limit,
        "parallelism": args.parallelism,
        "rollouts": int(args.limit * args.seconds),
        "runs": runs,
        "targets": {"min_share_of_limit": MIN_SHARE_OF_LIMIT},
        "passed": on >= MIN_SHARE_OF_LIMIT,
    }


def render(result: dict[str, Any]) -> str:
    """The figures as a small table."""
    lines = [
        f"collect at parallelism {result['parallelism']}, {result['rollouts']:,} rollouts, "
        f"against {result['limit_per_s']:g} requests/s (sliding 1 s window, refusals counted)",
        f"{'adaptive concurrency':22}{'accepted/s':>12}{'of limit':>10}{'failed':>8}"
        f"{'429s':>8}{'limit min/end':>15}{'seconds':>9}",
    ]
    for run in result["runs"]:
        low, end = run["concurrency_limit_min"], run["concurrency_limit_final"]
        limits = "-" if low is None else f"{low}/{end}"
        failed = "capped" if run["failed"] is None else f"{run['failed']:,}"
        lines.append(
            f"{'on' if run['adaptive_concurrency'] else 'off':22}"
            f"{run['accepted_rollouts_per_s']:>12.2f}{run['share_of_limit']:>10.0%}{failed:>8}"
            f"{run['server_refused']:>8,}{limits:>15}{run['elapsed_s']:>9.1f}"
        )
    verdict = "PASS" if result["passed"] else "FAIL"
    lines.append(
        f"target: adaptive on >= {result['targets']['min_share_of_limit']:.0%} of the limit "
        f"{verdict}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=15.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=40.0, help="a run's length at the limit")
    parser.add_argument("--parallelism", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    if args.limit <= 0 or args.seconds <= 0 or args.parallelism < 1:
        parser.error("--limit, --seconds and --parallelism must be positive")
    return _common.print_result(measure(args), args, render)


if __name__ == "__main__":
    raise SystemExit(main())
