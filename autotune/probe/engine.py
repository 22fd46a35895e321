"""The engine probe: autotune's rollout engine at one parallelism against one server.

The engine cycles through the probe's tasks for as long as `steady_window` needs, with
the server's /metrics, NVML and the client's own CPU sampled alongside.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from autotune.backends import ModelBackend
from autotune.engine import Engine
from autotune.probe.window import ProbeSettings, steady_window, warm_until
from autotune.results import STAGES, ProbeResult, StageLatency, stage_durations
from autotune.stats import batch_means_rate, mean
from autotune.store import RolloutSink
from autotune.telemetry import Sample, Sampler, summarise
from autotune.telemetry.client import ClientSampler
from autotune.telemetry.gpu import GpuSampler
from autotune.telemetry.prometheus import PrometheusSampler
from autotune.telemetry.recorder import TelemetryRecorder
from autotune.verifiers import Verifier
from autotune.workload import Task, WorkItem

CHECK_EVERY_S = 0.25
TOKEN_MISMATCH_THRESHOLD = 0.10


class _Meter:
    """Engine observer that keeps what steady-state estimation needs, compactly."""

    def __init__(self) -> None:
        self.done_at: list[float] = []
        self.timings: list[dict[str, float | None]] = []
        self.tokens: list[int] = []
        self.failed_at: list[tuple[float, str]] = []
        self.latency_sum = 0.0

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None:
        self.done_at.append(time.time())
        self.timings.append(timings)
        self.tokens.append(output_tokens)
        self.latency_sum += (timings["verify_end"] or 0.0) - (timings["queued"] or 0.0)

    @property
    def mean_latency_s(self) -> float:
        return self.latency_sum / len(self.done_at) if self.done_at else 0.0

    def rollout_failed(self, failure_class: str) -> None:
        self.failed_at.append((time.time(), failure_class))


def _cycle(tasks: Sequence[Task]) -> Iterator[WorkItem]:
    """The probe's tasks over and over; each pass is a new rollout index."""
    for rollout_index in itertools.count():
        for task in tasks:
            yield WorkItem(task, rollout_index)


def metrics_url(base_url: str) -> str:
    """vLLM serves /metrics at the root, beside /v1."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


async def run_probe(
    settings: ProbeSettings,
    tasks: Sequence[Task],
    backend: ModelBackend,
    verifier: Verifier,
    session: aiohttp.ClientSession,
    base_url: str,
) -> ProbeResult:
    """Measure one parallelism in steady state."""
    meter = _Meter()
    engine = Engine(
        backend, verifier, RolloutSink(None, resume=False), settings.parallelism, observer=meter
    )
    counters = backend.counters
    snapshots = [_snapshot(counters)]  # at the start, then at the end of warm-up and at stop
    # Scrapes get their own connection: at a parallelism near the pool's limit they would
    # otherwise queue behind model calls and time out exactly when the server is busiest.
    async with aiohttp.ClientSession() as metrics_session:
        samplers: list[Sampler] = [
            ClientSampler(),
            PrometheusSampler(metrics_session, metrics_url(base_url)),
            GpuSampler(),
        ]
        async with TelemetryRecorder(samplers, settings.telemetry_interval_s) as recorder:
            started = time.time()
            run = asyncio.create_task(engine.run(_cycle(tasks)))
            warm_at, stop_at, reason = await _watch(
                settings, meter, run, engine, started, lambda: snapshots.append(_snapshot(counters))
            )
            snapshots.append(_snapshot(counters))
            engine.stop()
            await _drain(run, meter)
    warm, stop = snapshots[1] if len(snapshots) > 2 else snapshots[0], snapshots[-1]
    return _result(
        settings,
        meter,
        verifier,
        recorder.samples,
        recorder.unavailable,
        (started, warm_at, stop_at),
        reason,
        tuple(b - a for a, b in zip(warm, stop, strict=True)),
    )


@dataclass(slots=True)
class EngineProbe:
    """Measures one running server at any parallelism, with the same tasks each time."""

    session: aiohttp.ClientSession
    backend: ModelBackend
    verifier: Verifier
    tasks: Sequence[Task]
    base_url: str
    settings: ProbeSettings

    async def measure(self, parallelism: int) -> ProbeResult:
        return await run_probe(
            replace(self.settings, parallelism=parallelism),
            self.tasks,
            self.backend,
            self.verifier,
            self.session,
            self.base_url,
        )


def _snapshot(counters: Any) -> tuple[float, float, float]:
    return (counters.rate_limited_responses, counters.retry_after_seen, counters.limiter_wait_s)


async def _drain(run: asyncio.Task[Any], meter: _Meter) -> None:
    """Let the rollouts in flight finish (they are not measured), but not for ever."""
    limit = 5.0 + 3 * meter.mean_latency_s
    done, _ = await asyncio.wait({run}, timeout=limit)
    if not done:
        run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    if done and run.exception() is not None:
        raise run.exception()  # type: ignore[misc]


async def _watch(
    settings: ProbeSettings,
    meter: _Meter,
    run: asyncio.Task[Any],
    engine: Engine,
    started: float,
    on_warm: Callable[[], None],
) -> tuple[float, float, str]:
    """Wait until `steady_window` has a window; returns (warm, stop, reason)."""
    warm = False
    while True:
        await asyncio.wait({run}, timeout=CHECK_EVERY_S)
        now = time.time()
        if run.done() or engine.stats.stopped_early:
            first = warm_until(meter.done_at, settings.parallelism, started, settings.warmup_s)
            return first or started, now, "server died"
        window = steady_window(
            meter.done_at, settings, started=started, now=now, mean_latency_s=meter.mean_latency_s
        )
        if (
            not warm
            and warm_until(meter.done_at, settings.parallelism, started, settings.warmup_s)
            is not None
        ):
            warm = True
            on_warm()
        if window is not None:
            return window.start, window.end, window.reason


def _result(
    settings: ProbeSettings,
    meter: _Meter,
    verifier: Verifier,
    samples: list[Sample],
    unavailable: dict[str, str],
    times: tuple[float, float, float],
    reason: str,
    counted: tuple[float, ...],
) -> ProbeResult:
    started, start, end = times  # probe start, end of warm-up, stop
    window = max(end - start, 1e-9)
    estimate = batch_means_rate(meter.done_at, start, end)
    in_window = [i for i, t in enumerate(meter.done_at) if start <= t < end]
    failures = [cls for t, cls in meter.failed_at if start <= t < end]
    if reason == "server died":  # the failures that killed the probe count too
        failures = [cls for t, cls in meter.failed_at if t >= start]
    errors: dict[str, int] = {}
    for cls in failures:
        errors[cls] = errors.get(cls, 0) + 1
    stage_values: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for i in in_window:
        for stage, seconds in stage_durations(meter.timings[i]):
            stage_values[stage].append(seconds)
    latency = {stage: StageLatency.of(values) for stage, values in stage_values.items()}
    tokens = sum(meter.tokens[i] for i in in_window)
    attempts = len(in_window) + len(failures)
    verify_busy = sum(stage_values["verify"])
    capacity = verifier.capacity
    mean_verify = mean(stage_values["verify"])
    telemetry = summarise(samples, start, end)
    client_tps = tokens / window
    token_check = _token_check(samples, start, end, client_tps)
    return ProbeResult(
        parallelism=settings.parallelism,
        rollouts_per_s=estimate.rate,
        rollouts_per_s_ci=(estimate.low, estimate.high),
        output_tokens_per_s=client_tps,
        error_rate=len(failures) / attempts if attempts else (1.0 if failures else 0.0),
        completed=len(in_window),
        failed=len(failures),
        measured_s=window,
        warmup_s=start - started,
        stop_reason=reason,
        latency_s=latency,
        errors_by_class=errors,
        rate_limited_responses=int(counted[0]),
        retry_after_seen=int(counted[1]),
        limiter_wait_share=min(1.0, counted[2] / (window * settings.parallelism)),
        verifier_capacity=capacity,
        verifier_busy_fraction=verify_busy / (window * (capacity or 1)),
        verifier_capacity_rps=(capacity or 1) / mean_verify if mean_verify else None,
        telemetry=telemetry,
        telemetry_unavailable=dict(unavailable),
        token_check=token_check,
        series=[{"t": s.t, "source": s.source, **s.values} for s in samples],
    )


def _token_check(
    samples: list[Sample], start: float, end: float, client_tps: float
) -> dict[str, float] | None:
    """Client output tokens/s against the server's own vllm:generation_tokens_total."""
    name = "vllm:generation_tokens_total"
    counter = [
        (s.t, s.values[name])
        for s in samples
        if s.source == "server" and start <= s.t <= end and name in s.values
    ]
    if len(counter) < 2 or counter[-1][0] <= counter[0][0]:
        return None
    server_tps = (counter[-1][1] - counter[0][1]) / (counter[-1][0] - counter[0][0])
    if server_tps <= 0 and client_tps <= 0:
        return None
    relative = abs(client_tps - server_tps) / max(server_tps, client_tps)
    return {
        "client_tokens_per_s": client_tps,
        "server_tokens_per_s": server_tps,
        "relative_difference": relative,
        "mismatch": float(relative > TOKEN_MISMATCH_THRESHOLD),
    }
