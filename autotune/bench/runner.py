"""`autotune bench run`: every case of a suite, its warm-up first, then R measured
repetitions, a repetition slowed by a busy neighbour run again.
Why: docs/design/bench.md.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.bench.fingerprint import Fingerprint, digest, fingerprint, machine, server_identity
from autotune.bench.overhead import (
    PROMPT_CHARS,
    NullServer,
    bare_loop,
    core_plan,
    engine_run,
    pinned,
    side_by_side,
)
from autotune.bench.records import BenchResults, CaseResult, Metric
from autotune.bench.suite import Case, OverheadCase, ProbeCase, Suite
from autotune.config.collection import TargetConfig
from autotune.errors import AutotuneError, CollectionError, UsageError
from autotune.probe.realtime import run_probe
from autotune.processes.event_loop import run_async
from autotune.results.probes import ProbeResult
from autotune.rollout.pipeline import open_pipeline
from autotune.rollout.target import synthetic_defaults
from autotune.rollout.workload import Workload

# Bumped when what a metric means changes: results of another method are not comparable.
METHODS = {"probe": "probe/1", "overhead": "overhead/1"}
FIRST_REQUESTS = 300  # each client's untimed start in an overhead case
SIM_DEFAULT_ARGS = ("--time-scale", "0.05")  # before the case's own sim_args, which win
MAX_PROBE_TASKS = 5000
MAX_WAIT_SHARE = 0.25  # run-queue wait (client + server threads) per second of a probe
PATIENCE_S = 180.0  # how long a case waits out a busy machine before it gives up
RETRY_PAUSE_S = 2.0  # before measuring again after a disturbed repetition

Report = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class _Measured:
    fingerprint: Fingerprint
    metrics: dict[str, Metric]
    details: tuple[dict[str, Any], ...]


class _Progress:
    """A line a repetition: where the run is, its rate (it/s) and an ETA."""

    def __init__(self, suite: Suite, report: Report | None) -> None:
        self.total = sum(case.warmup + case.repetitions for case in suite.cases)
        self.done = 0
        self.started = time.monotonic()
        self.report = report

    def repetition(self, case: Case, index: int, figure: str) -> None:
        self.done += 1
        if self.report is None:
            return
        rate = self.done / max(time.monotonic() - self.started, 1e-9)
        eta = (self.total - self.done) / rate
        measured = index - case.warmup + 1
        which = "warm-up" if measured < 1 else f"{measured}/{case.repetitions}"
        self.report(
            f"{case.name} {which}: {figure}  "
            f"[{self.done}/{self.total} repetitions, {rate:.2f} it/s, ETA {eta:.0f} s]"
        )

    def note(self, line: str) -> None:
        if self.report is not None:
            self.report(line)

    def skip_rest(self, case: Case, done_before: int) -> None:
        """A case stopped early: its repetitions not run leave the total."""
        self.total -= case.warmup + case.repetitions - (self.done - done_before)


def run_suite(suite: Suite, report: Report | None = None) -> BenchResults:
    """Runs every case; a UsageError stops the run, any other error is kept on its case."""
    progress = _Progress(suite, report)
    created_at = time.time()
    cases: list[CaseResult] = []
    for case in suite.cases:
        started, done_before = time.monotonic(), progress.done
        error: str | None = None
        measured: _Measured | None = None
        try:
            if isinstance(case, OverheadCase):
                measured = _overhead_case(case, progress)
            else:
                measured = run_async(_probe_case(case, progress))
        except UsageError:
            raise
        except AutotuneError as failure:
            error = str(failure)
            progress.skip_rest(case, done_before)
            progress.note(f"{case.name}: could not run: {error}")
        cases.append(
            CaseResult(
                name=case.name,
                kind=case.kind,
                threshold=case.threshold,
                settings=case.settings(),
                fingerprint=measured.fingerprint if measured else None,
                metrics=measured.metrics if measured else {},
                details=measured.details if measured else (),
                warmup=case.warmup,
                wall_s=time.monotonic() - started,
                error=error,
            )
        )
    return BenchResults(
        suite=str(suite.path),
        created_at=created_at,
        alpha=suite.alpha,
        machine=machine(),
        cases=tuple(cases),
    )


@asynccontextmanager
async def _server(case: ProbeCase, target: TargetConfig) -> AsyncIterator[tuple[TargetConfig, int]]:
    """The target and the PID of the server we started for it (0 for one at a base_url).

    The embedded simulator is started here rather than by `connect`, so that its process
    is known and its waiting for a CPU can be read.
    """
    if target.base_url is not None:
        yield target, 0
        return
    from autotune.servers.launcher import ServerSpec

    if case.launch is not None:
        spec = ServerSpec.launch(case.launch, startup_timeout_s=case.startup_timeout_s)
    else:
        sim_args = [*SIM_DEFAULT_ARGS, *target.sim_args]
        spec = ServerSpec.sim(sim_args, startup_timeout_s=case.startup_timeout_s)
    async with spec.process() as server:
        assert server.pid is not None
        yield replace(target, base_url=spec.base_url), server.pid


def run_queue_wait_s(pids: list[int]) -> float | None:
    """Seconds the processes' threads have spent runnable but waiting for a CPU.

    From /proc/PID/task/*/schedstat (Linux); None where the kernel does not say.
    """
    total = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return None
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended meanwhile
    return total / 1e9


async def _probe_case(case: ProbeCase, progress: _Progress) -> _Measured:
    collect = case.collect
    tasks = Workload(collect.input, collect.synthetic, collect.limit).probe_tasks(MAX_PROBE_TASKS)
    synthetic = collect.synthetic if collect.input is None and case.launch is None else None
    target = synthetic_defaults(collect.target, synthetic, collect.num_repeats)
    work = digest({"tasks": [t.row for t in tasks], "extra_body": target.extra_body})
    async with (
        _server(case, target) as (target, server_pid),
        open_pipeline(replace(collect, target=target)) as pipe,
    ):
        server, model = await server_identity(
            pipe.session, pipe.target.base_url, pipe.target.model, pipe.target.simulated
        )

        async def probe() -> ProbeResult:
            return await run_probe(case.probe, tasks, pipe.backend, pipe.verifier, pipe.session,
                                   pipe.target.base_url)  # fmt: skip

        pids = [os.getpid(), *([server_pid] if server_pid else [])]
        kept, details = await _repeat(case, probe, pids, progress)
    uses_gpu = not pipe.target.simulated
    return _Measured(
        fingerprint(METHODS["probe"], work, model, server, uses_gpu=uses_gpu),
        {
            "rollouts_per_s": Metric("rollouts/s", tuple(p.rollouts_per_s for p in kept)),
            "output_tokens_per_s": Metric("tokens/s", tuple(p.output_tokens_per_s for p in kept)),
        },
        tuple(details),
    )


async def _repeat(
    case: ProbeCase,
    probe: Callable[[], Awaitable[ProbeResult]],
    pids: list[int],
    progress: _Progress,
) -> tuple[list[ProbeResult], list[dict[str, Any]]]:
    """The warm-up, then probes until `repetitions` undisturbed ones are kept.

    Returns the kept probes and a detail record of every measured one, kept or not.
    """
    for index in range(case.warmup):
        result = await probe()
        _check(case, index, result)
        progress.repetition(case, index, f"{result.rollouts_per_s:,.1f} rollouts/s")
    kept: list[ProbeResult] = []
    details: list[dict[str, Any]] = []
    discarded, lost_s = 0, 0.0
    while len(kept) < case.repetitions:
        waited, started = run_queue_wait_s(pids), time.monotonic()
        result = await probe()
        _check(case, case.warmup + len(details), result)
        share = _share(run_queue_wait_s(pids), waited, time.monotonic() - started)
        undisturbed = share is None or share <= MAX_WAIT_SHARE
        details.append({**_probe_details(result), "wait_share": share, "kept": undisturbed})
        if undisturbed:
            progress.repetition(
                case, case.warmup + len(kept), f"{result.rollouts_per_s:,.1f} rollouts/s"
            )
            kept.append(result)
            continue
        discarded += 1
        lost_s += time.monotonic() - started + RETRY_PAUSE_S
        if lost_s > PATIENCE_S:
            raise CollectionError(
                f"case {case.name}: the machine was too busy to measure ({discarded} "
                f"repetitions lost more than {MAX_WAIT_SHARE:.0%} of their time waiting for a "
                f"CPU, over {PATIENCE_S:.0f} s); run the suite again on a quieter machine."
            )
        progress.note(
            f"{case.name}: a repetition spent {share:.0%} of its time waiting for a CPU "
            f"(busy machine): discarded, measuring again in {RETRY_PAUSE_S:.0f} s"
        )
        await asyncio.sleep(RETRY_PAUSE_S)
    return kept, details


def _share(after: float | None, before: float | None, wall_s: float) -> float | None:
    if after is None or before is None:
        return None
    return (after - before) / max(wall_s, 1e-9)


def _check(case: ProbeCase, index: int, probe: ProbeResult) -> None:
    """A probe whose server died, or that finished nothing, measured nothing."""
    if probe.stop_reason != "server died" and probe.completed > 0:
        return
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(probe.errors_by_class.items()))
    what = "the server stopped answering" if probe.stop_reason == "server died" else (
        "no rollout completed"
    )  # fmt: skip
    raise CollectionError(
        f"case {case.name}: {what} in repetition {index + 1} ({errors or 'no error recorded'}); "
        "check the server and the case with `autotune diagnose` first."
    )


def _probe_details(probe: ProbeResult) -> dict[str, Any]:
    return {
        "rollouts_per_s": probe.rollouts_per_s,
        "rollouts_per_s_ci": list(probe.rollouts_per_s_ci),
        "completed": probe.completed,
        "failed": probe.failed,
        "error_rate": probe.error_rate,
        "measured_s": probe.measured_s,
        "stop_reason": probe.stop_reason,
        "model_latency_p50_s": probe.latency_s["model"].p50,
    }


def _overhead_case(case: OverheadCase, progress: _Progress) -> _Measured:
    client_core, server_core = core_plan()
    ratios: list[float] = []
    details: list[dict[str, Any]] = []
    with (
        pinned(client_core),
        NullServer(core=server_core) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        # Untimed: a fresh process's first requests import and build what later ones reuse.
        bare_loop(server.base_url, case.concurrency, FIRST_REQUESTS)
        engine_run(server.base_url, case.concurrency, FIRST_REQUESTS, Path(tmp))
        for index in range(case.warmup + case.repetitions):
            bare, engine = side_by_side(server.base_url, case.concurrency, case.requests, Path(tmp))
            runs = {"bare": bare, "engine": engine}
            failed = sum(run.failed for run in runs.values())
            if failed:
                raise CollectionError(
                    f"case {case.name}: {failed} requests to the null server failed; "
                    "run `python benchmarks/overhead.py` to see which client fails."
                )
            bare_cpu = runs["bare"].cpu_s / runs["bare"].requests
            engine_cpu = runs["engine"].cpu_s / runs["engine"].requests
            ratio = bare_cpu / engine_cpu
            progress.repetition(
                case,
                index,
                f"CPU per request: bare {bare_cpu * 1e6:.1f} µs, engine {engine_cpu * 1e6:.1f} µs"
                f" → {ratio:.3f}",
            )
            if index >= case.warmup:
                ratios.append(ratio)
                details.append(
                    {
                        "bare_cpu_us_per_request": bare_cpu * 1e6,
                        "engine_cpu_us_per_rollout": engine_cpu * 1e6,
                        "bare_req_per_s": runs["bare"].per_s,
                        "engine_rollouts_per_s": runs["engine"].per_s,
                    }
                )
    work = digest({"requests": case.requests, "prompt_chars": PROMPT_CHARS, "verifier": "exact"})
    return _Measured(
        fingerprint(METHODS["overhead"], work, "null", "null", uses_gpu=False),
        {"engine_over_bare": Metric("ratio", tuple(ratios))},
        tuple(details),
    )
