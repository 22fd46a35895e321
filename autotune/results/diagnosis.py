"""A diagnosis as saved: the thresholds, the evidence each check cites, the verdict, and
the whole result of `autotune diagnose`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune.results.codec import SCHEMA_VERSION, Record
from autotune.results.probes import ProbeResult
from autotune.results.runs import BatchSummary


@dataclass(frozen=True, slots=True)
class Thresholds(Record):
    """Every number a verdict rule compares against; each is configurable."""

    scaling_fraction: float = 1 / 3  # parallelism-bound: speedup ≥ 1 + f·(ratio − 1)
    flat_gain: float = 0.20  # saturated: speedup < 1 + flat_gain
    max_error_rate: float = 0.05
    client_cpu_fraction: float = 0.85  # of one core
    client_loop_lag_ms: float = 50.0  # mean of the per-sample worst lag
    limiter_wait_share: float = 0.20
    rate_limited_share: float = 0.01  # 429s per rollout: one stray 429 is not a limit
    verifier_busy_fraction: float = 0.80
    verifier_capacity_use: float = 0.80  # throughput ÷ verifier capacity
    verify_wait_growth: float = 2.0
    tool_share: float = 0.5  # environment-bound: share of a rollout's time in tool calls
    littles_law_match: float = 0.60  # observed model-latency growth ÷ predicted
    server_waiting: float = 0.5  # mean requests waiting in the server's queue
    kv_cache_full: float = 0.90
    gpu_busy_pct: float = 80.0
    timeout_share: float = 0.02  # timed-out model calls per rollout in the high probe
    dispersion_growth: float = 2.0  # latency p95/p50 at the high probe ÷ at the low one
    # tail-bound (batch steps): the tail is at least this share of a step (lower bound of
    # its 95% interval over the steps) while the server runs at most this share of its
    # capacity during it (upper bound)
    tail_share: float = 0.20
    tail_busy_share: float = 0.5
    # A speedup within this share of the parallelism-bound threshold is on it: the
    # interval must clear the threshold by this much, or no probe length could decide.
    threshold_margin: float = 0.03

    def parallelism_bound_speedup(self, ratio: float) -> float:
        return 1 + self.scaling_fraction * (ratio - 1)

    def undecided_zone(self, ratio: float) -> tuple[float, float]:
        """The speedups that lie on the parallelism-bound threshold, within its margin."""
        threshold = self.parallelism_bound_speedup(ratio)
        return threshold / (1 + self.threshold_margin), threshold * (1 + self.threshold_margin)


@dataclass(frozen=True, slots=True)
class Evidence(Record):
    """One measured number beside the threshold it was compared with."""

    name: str
    value: float
    threshold: float
    comparison: str  # ">=" or "<" or ">"
    met: bool
    meaning: str
    unit: str = ""  # how `quantity` rounds it: share, ×, ms, count, or "" (3 digits)

    def summary(self) -> str:
        """The number against its threshold, e.g. `speedup = ×3.76 (threshold >= ×2.00)`."""
        return f"{self._compared()})"

    def text(self) -> str:
        mark = "yes" if self.met else "no"
        return f"{self._compared()}: {mark}) — {self.meaning}"

    def _compared(self) -> str:
        return (
            f"{self.name} = {quantity(self.value, self.unit)} "
            f"(threshold {self.comparison} {quantity(self.threshold, self.unit)}"
        )


def quantity(value: float, unit: str = "") -> str:
    """A measured number rounded to what it means: a share as a percentage, a ratio to
    two decimals, milliseconds and counts whole, anything else to three digits."""
    if math.isnan(value):
        return "—"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if unit == "share":
        percent = value * 100
        return f"{percent:.0f}%" if abs(percent) >= 10 or percent == 0 else f"{percent:.2g}%"
    if unit == "×":
        return f"×{value:.2f}"
    if unit == "ms":
        return f"{value:,.0f} ms"
    if unit == "count" or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


@dataclass(frozen=True, slots=True)
class Verdict(Record):
    verdict: str
    leaning: bool  # True between "barely moved" and "scaled": a sweep should decide
    speedup: float
    parallelism_ratio: float
    evidence: list[Evidence]
    next_step: str
    notes: list[str] = field(default_factory=list)
    # How sure: the speedup's 95% interval, whether it lies clear of the threshold that
    # separates this verdict from the next, and that in words; for `inconclusive`, the
    # verdicts the interval lies between.
    speedup_interval: tuple[float, float] | None = None
    clear_of_threshold: bool | None = None
    confidence: str = ""
    between: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DiagnoseTarget(Record):
    """What was diagnosed: a server (URL, model) or a user's collector command."""

    base_url: str | None
    model: str | None
    simulated: bool
    api: str | None = None
    stream: bool | None = None
    command: str | None = None
    # The simulator's real seconds per simulated second; every figure saved is already
    # in simulated time (what the simulated server would show in real time).
    time_scale: float | None = None


@dataclass(frozen=True, slots=True)
class DiagnoseWorkload(Record):
    input: str | None
    tasks: int
    num_repeats: int = 1  # rollouts of each task in a row (GRPO groups)
    verifier: str | None = None
    verifier_workers: int | None = None


@dataclass(frozen=True, slots=True)
class DiagnoseSettings(Record):
    low: int
    high: int
    min_s: float
    max_s: float
    target_halfwidth: float
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True, slots=True)
class DiagnoseResult(Record):
    """A diagnosis: the probe pair, the verdict from them, and how they were made."""

    kind: ClassVar[str] = "diagnose"
    created_at: float
    verdict: Verdict
    probes: list[ProbeResult]
    target: DiagnoseTarget
    workload: DiagnoseWorkload
    settings: DiagnoseSettings
    machine: dict[str, str]
    batch: BatchSummary | None = None  # --batch-groups: the training-step probe
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}
