"""Result schemas: frozen, versioned, JSON-serialisable. Jobs and reports share them."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
STAGES = ("queue", "model", "ttft", "verify_wait", "verify", "total")


def machine_identity() -> dict[str, str]:
    """Where a result was measured (reports show it; bench compares its own fingerprint)."""
    import platform

    from autotune import __version__

    return {"host": platform.node(), "python": platform.python_version(), "autotune": __version__}


def stage_durations(t: Mapping[str, float | None]) -> Iterator[tuple[str, float]]:
    """Each stage's seconds for one rollout, from its timestamps (ttft only if streamed)."""
    queued, start, first = t["queued"] or 0.0, t["model_start"] or 0.0, t["first_token"]
    model_end, verify_start = t["model_end"] or 0.0, t["verify_start"] or 0.0
    verify_end = t["verify_end"] or 0.0
    yield "queue", start - queued
    yield "model", model_end - start
    if first is not None:
        yield "ttft", first - start
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
class StageLatency:
    """Latency of one stage, seconds."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> StageLatency:
        mean = sum(values) / len(values) if values else None
        return cls(len(values), mean, percentile(values, 50), percentile(values, 95))


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
class CollectSummary:
    """What a collection run did; `--json` prints exactly this."""

    completed: int
    failed: int
    skipped: int
    elapsed_s: float
    rollouts_per_s: float
    output_tokens_per_s: float
    input_tokens: int
    output_tokens: int
    mean_reward: float | None
    latency_s: dict[str, StageLatency]
    errors_by_class: dict[str, int]
    retries_by_class: dict[str, int]
    parallelism: int | None
    model: str
    base_url: str
    simulated: bool
    output: str | None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
