"""The engine's own overhead: autotune's engine against a bare aiohttp loop on a null
server, measured side by side on one core so that their ratio holds across machines.
Why: docs/design/bench.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from autotune.servers.launcher import ServerProcess, ServerSpec

PROMPT_CHARS = 1024  # the synthetic workload's mean prompt: 256 tokens at ~4 characters each
BARE_SLICE = 200  # requests a bare loop posts before `side_by_side` checks for the end


def core_plan() -> tuple[int | None, int | None]:
    """(client core, server core): two distinct allowed cores, or Nones where we can't pin."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    return allowed[0], allowed[1]


def pin_self(core: int | None) -> None:
    """Pin this process to one core (no-op where affinity is not supported)."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


@contextlib.contextmanager
def pinned(core: int | None) -> Iterator[None]:
    """This process on one core for the block, then back on the cores it had.

    `autotune bench` starts other servers after an overhead case; they must not inherit
    a one-core affinity.
    """
    if core is None or not hasattr(os, "sched_getaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    pin_self(core)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads, ns resolution)."""
    return time.process_time()


class NullServer(ServerProcess):
    """`python -m autotune.servers.null` on a free port, pinned to `core` when given.

    A ServerProcess like any other server autotune starts, used synchronously:
    `with NullServer(core=1) as server:` waits for its `/health`; leaving stops its
    process group (SIGTERM, then SIGKILL).
    """

    def __init__(
        self, core: int | None = None, startup_timeout_s: float = 60.0, tool_turns: int = 1
    ) -> None:
        super().__init__(
            ServerSpec.null(core=core, startup_timeout_s=startup_timeout_s, tool_turns=tool_turns)
        )

    @property
    def base_url(self) -> str:
        return self.spec.base_url or ""


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run of either client."""

    kind: str  # "bare", "engine", or "metered" (the engine with autotune/live/ on)
    requests: int
    failed: int
    elapsed_s: float
    per_s: float  # the engine's own rollouts/s for the engine; completed / elapsed for bare
    cpu_s: float  # this process's CPU seconds over the run: ~wall_s means client-bound
    wall_s: float  # the whole call, start-up and shut-down included


def _payload() -> dict[str, Any]:
    words = ("lorem", "ipsum", "dolor", "sit", "amet", "tempor", "magna", "aliqua")
    text = " ".join(words[i % len(words)] for i in range(PROMPT_CHARS // 4))[:PROMPT_CHARS]
    return {"model": "null", "messages": [{"role": "user", "content": text}], "max_tokens": 256}


async def _bare_loop(url: str, concurrency: int, total: int) -> Run:
    payload = _payload()
    headers = {"Content-Type": "application/json"}
    remaining = total
    failed = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal remaining, failed
        while remaining > 0:
            remaining -= 1
            try:
                async with session.post(url, data=orjson.dumps(payload), headers=headers) as resp:
                    answer = orjson.loads(await resp.read())
                    if resp.status != 200 or not answer.get("choices"):
                        failed += 1
            except (aiohttp.ClientError, orjson.JSONDecodeError):
                failed += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return Run("bare", total, failed, elapsed, (total - failed) / elapsed, cpu, elapsed)


def _scrape_every_second(port: int | None, stop: threading.Event) -> None:
    """GET /metrics once a second until `stop` (a scrape that finds nothing listening yet,
    or any more, is skipped)."""
    url = f"http://127.0.0.1:{port}/metrics"
    while not stop.wait(1.0):
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as answer:
            answer.read()


def bare_loop(base_url: str, concurrency: int, total: int) -> Run:
    """The ceiling: aiohttp+uvloop posting chat completions as fast as it can."""
    loop_factory = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_bare_loop(base_url + "/chat/completions", concurrency, total))


def engine_run(
    base_url: str,
    concurrency: int,
    total: int,
    out_dir: Path,
    metered: bool = False,
    group_size: int = 1,
    track_groups: bool = True,
) -> Run:
    """autotune's engine: synthetic tasks, `exact` verifier, rows written to a JSONL file.

    `metered`: with everything a production run watches on (autotune/live/): /metrics
    scraped every second by a thread (Prometheus' default is 15 s), a stats line every
    second, and a drift watch with one-second windows. `group_size` above 1: the same
    requests as GRPO groups of that many samples a prompt, their figures kept unless
    `track_groups` is off."""
    from autotune.collector.collect_job import run_collect
    from autotune.config.collection import (
        CollectConfig,
        LiveConfig,
        SyntheticWorkload,
        TargetConfig,
    )

    output = out_dir / "overhead.jsonl"
    live = LiveConfig()
    if metered:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        live = LiveConfig(metrics_port=port, stats_every_s=1.0, expect_rate=1.0, drift_window_s=1.0)
    config = CollectConfig(
        target=TargetConfig(base_url=base_url, model="null", stream=False),
        synthetic=SyntheticWorkload(num_tasks=max(1, total // group_size)),
        num_repeats=group_size,
        track_groups=track_groups,
        parallelism=concurrency,
        verifier="exact",
        output=output,
        progress=False,
        live=live,
    )
    stop = threading.Event()
    scraper = threading.Thread(target=_scrape_every_second, args=(live.metrics_port, stop))
    if metered:
        scraper.start()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    try:
        summary = run_collect(config)
    finally:
        stop.set()
        if metered:
            scraper.join()
        for path in (output, output.with_name(f"{output.stem}_stats.jsonl")):
            path.unlink(missing_ok=True)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return Run(
        "metered"
        if metered
        else "engine"
        if group_size == 1
        else "grouped"
        if track_groups
        else "repeated",
        int(summary.completed) + int(summary.failed),
        int(summary.failed),
        float(summary.elapsed_s),
        float(summary.rollouts_per_s),
        cpu,
        wall,
    )


def side_by_side(base_url: str, concurrency: int, total: int, out_dir: Path) -> tuple[Run, Run]:
    """(bare, engine): the engine runs `total` rollouts in one thread while the bare loop
    runs in another, in slices of BARE_SLICE requests, until the engine is done (a slice
    under way then finishes and counts); each one's `cpu_s` is its own thread's. An error
    in either thread is raised here, as the client raised it."""
    done = threading.Event()
    runs: dict[str, Run] = {}
    errors: list[BaseException] = []

    def bare() -> None:
        cpu0, t0 = time.thread_time(), time.perf_counter()
        requests = failed = 0
        while not done.is_set():
            run = bare_loop(base_url, concurrency, BARE_SLICE)
            requests, failed = requests + run.requests, failed + run.failed
        elapsed, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        runs["bare"] = Run(
            "bare", requests, failed, elapsed, (requests - failed) / elapsed, cpu, elapsed
        )

    def engine() -> None:
        cpu0 = time.thread_time()
        try:
            run = engine_run(base_url, concurrency, total, out_dir)
        finally:
            done.set()
        runs["engine"] = dataclasses.replace(run, cpu_s=time.thread_time() - cpu0)

    def keeping_errors(client: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                client()
            except BaseException as error:  # re-raised in the caller's thread below
                done.set()
                errors.append(error)

        return run

    threads = [threading.Thread(target=keeping_errors(c)) for c in (bare, engine)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return runs["bare"], runs["engine"]
