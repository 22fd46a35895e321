"""Peak RSS of a 200,000-rollout collect on the null server; target: under 300 MB, no failures.

A run that holds tasks, rows or latency samples in proportion to its length runs out of
memory on the long jobs RL teams give it, so peak RSS must stay flat as the run grows.
The server runs in another process (not counted); this process's peak is read two ways:
the kernel's high-water mark (`ru_maxrss`) and psutil sampling every 50 ms as a
cross-check (sampling can miss a short spike; the kernel's figure cannot).

    python benchmarks/peak_rss.py [--tasks 200000] [--concurrency 64] [--json] [--check]

Targets: peak RSS < 300 MB (10^6 bytes) and no failed rollout. Exit status is 0 unless
--check is given and a target is missed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

TARGET_MB = 300.0
MB = 1e6


def ru_maxrss_bytes() -> int:
    """The kernel's high-water mark of this process's RSS (KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class RssSampler:
    """Samples this process's RSS on a thread; `peak` is the largest value seen."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self._process = psutil.Process(os.getpid())
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self.peak = self._process.memory_info().rss
        self.samples = 0

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.peak = max(self.peak, self._process.memory_info().rss)
            self.samples += 1

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One long run; the figures as a dict."""
    from autotune.collector.collect_job import run_collect
    from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig

    _, server_core = harness.pin_client()
    with harness.null_server(server_core) as server, tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "peak_rss.jsonl"
        config = CollectConfig(
            target=TargetConfig(base_url=server.base_url, model="null", stream=False),
            synthetic=SyntheticWorkload(num_tasks=args.tasks),
            parallelism=args.concurrency,
            verifier="exact",
            output=output,
            progress=False,
        )
        baseline = psutil.Process(os.getpid()).memory_info().rss  # after imports, before the run
        started = time.perf_counter()
        with RssSampler() as sampler:
            summary = run_collect(config)
        wall = time.perf_counter() - started
        output_bytes = output.stat().st_size if output.exists() else 0
    kernel_peak = ru_maxrss_bytes()
    return {
        "benchmark": "peak_rss",
        "schema_version": 1,
        "machine": harness.machine(),
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "completed": summary.completed,
        "failed": summary.failed,
        "elapsed_s": summary.elapsed_s,
        "wall_s": wall,
        "rollouts_per_s": summary.rollouts_per_s,
        "output_mb": output_bytes / MB,
        "baseline_rss_mb": baseline / MB,
        "peak_rss_mb": kernel_peak / MB,
        "sampled_peak_rss_mb": sampler.peak / MB,
        "samples": sampler.samples,
    }


def targets(r: dict[str, Any]) -> list[harness.Target]:
    """The higher of the two peaks, and no failed rollout."""
    peak = max(r["peak_rss_mb"], r["sampled_peak_rss_mb"])
    return [
        harness.Target("peak RSS", peak, TARGET_MB, "<", "MB", ".1f"),
        harness.Target("failed rollouts", r["failed"], 0, "=="),
    ]


def render(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"peak RSS over {r['tasks']:,} synthetic rollouts (exact verifier, JSONL output, "
            f"concurrency {r['concurrency']}, null server in another process)",
            f"  peak RSS (ru_maxrss)     {r['peak_rss_mb']:8.1f} MB",
            f"  peak RSS (psutil, 50 ms) {r['sampled_peak_rss_mb']:8.1f} MB"
            f"  ({r['samples']:,} samples)",
            f"  RSS before the run       {r['baseline_rss_mb']:8.1f} MB",
            f"  rollouts/s               {r['rollouts_per_s']:8,.0f}"
            f"  ({r['completed']:,} completed, {r['failed']:,} failed in {r['elapsed_s']:.1f} s)",
            f"  output file              {r['output_mb']:8.1f} MB",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__)
    parser.add_argument("--tasks", type=harness.count, default=200_000)
    parser.add_argument("--concurrency", type=harness.count, default=64)
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
