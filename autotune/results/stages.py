"""A rollout's stages and their latencies: the per-stage samples a run keeps, their
percentiles, a replica's counts, and the one table of latency SLOs.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from autotune.results.codec import Record

STAGES = ("queue", "model", "ttft", "tool", "verify_wait", "verify", "total")


def stage_durations(t: Mapping[str, float | None]) -> Iterator[tuple[str, float]]:
    """Each stage's seconds for one rollout, from its timestamps (ttft only if streamed;
    tool only for a multi-turn rollout, whose model stage is its time outside the tools)."""
    queued, start, first = t["queued"] or 0.0, t["model_start"] or 0.0, t["first_token"]
    model_end, verify_start = t["model_end"] or 0.0, t["verify_start"] or 0.0
    verify_end = t["verify_end"] or 0.0
    tool = t.get("tool")
    yield "queue", start - queued
    yield "model", model_end - start - (tool or 0.0)
    if first is not None:
        yield "ttft", first - start
    if tool is not None:
        yield "tool", tool
    yield "verify_wait", verify_start - model_end
    yield "verify", verify_end - verify_start
    yield "total", verify_end - queued


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class StageLatency(Record):
    """Latency of one stage, seconds."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None = None  # older files lack it; a p99 latency SLO reads it

    @classmethod
    def of(cls, values: Sequence[float]) -> StageLatency:
        mean = sum(values) / len(values) if values else None
        p50, p95, p99 = (percentile(values, q) for q in (50, 95, 99))
        return cls(len(values), mean, p50, p95, p99)


def no_latencies() -> dict[str, StageLatency]:
    """Every stage without a sample (what a probe that cannot time stages reports)."""
    return {stage: StageLatency.of([]) for stage in STAGES}


@dataclass(slots=True)
class StageSamples:
    """Per-stage latency samples, kept compact (8 bytes each) for long runs."""

    samples: dict[str, array] = field(
        default_factory=lambda: {stage: array("d") for stage in STAGES}
    )

    def add(self, stage: str, value: float) -> None:
        self.samples[stage].append(value)

    def summarise(self) -> dict[str, StageLatency]:
        return {stage: StageLatency.of(values) for stage, values in self.samples.items()}


@dataclass(frozen=True, slots=True)
class ReplicaStats(Record):
    """One replica's share of a run or a probe's window, when several serve the model:
    what the client saw, and what its own /metrics and GPUs said over the same time."""

    index: int
    url: str
    completed: int  # model calls answered
    failed: int  # model calls that failed (each retry counted)
    calls_per_s: float
    output_tokens_per_s: float
    mean_latency_s: float | None  # of a model call
    up: bool  # in rotation at the end
    times_down: int  # taken out of rotation this many times
    down_reason: str | None = None
    server: dict[str, float] = field(default_factory=dict)  # its /metrics, means and deltas
    gpus: list[int] = field(default_factory=list)  # the GPUs it runs on, when known
    gpu: dict[str, float] = field(default_factory=dict)  # NVML over those GPUs, means

    @property
    def prefix_cache_hit_share(self) -> float | None:
        """Prompt tokens served from the prefix cache ÷ prompt tokens looked up."""
        queries = self.server.get("prefix_cache_queries")
        if not queries:
            return None
        return self.server.get("prefix_cache_hits", 0.0) / queries


@dataclass(frozen=True, slots=True)
class LatencySlo:
    """A latency SLO a study may set: `field` on its objective and on the SweepResult, the
    `figure` a curve point (and a trial's lowest, `min_` before it) carries, the quantile
    that figure is (None: its spread is not kept, so its margin is a flat one), and its
    name in words. Every place that applies the SLOs reads them from LATENCY_SLOS."""

    field: str
    figure: str
    quantile: float | None
    label: str

    @property
    def rule(self) -> str:
        """The recommendation's `bound_by` where this SLO lowered it."""
        return f"{self.label} SLO"


LATENCY_SLOS = (
    LatencySlo("p95_latency_slo_s", "p95_latency_s", 0.95, "p95 latency"),
    LatencySlo("p99_latency_slo_s", "p99_latency_s", 0.99, "p99 latency"),
    LatencySlo("p95_ttft_slo_s", "p95_ttft_s", None, "p95 TTFT"),
)
