"""What a probe records: its blocks and pooled result at one parallelism, and a curve's
point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autotune.results.codec import Record
from autotune.results.runs import GroupSummary
from autotune.results.stages import ReplicaStats, StageLatency, no_latencies


@dataclass(frozen=True, slots=True)
class RateCheck(Record):
    """A block timed in output tokens, checked against the completions counted over the
    same window: both estimate its rollouts/s, each as (rate, low, high) of its 95%
    interval. The block reports the narrower where they agree; where they disagree beyond
    their intervals, the counted rate with an interval spanning both."""

    from_tokens: tuple[float, float, float]
    counted: tuple[float, float, float] | None  # None: too few completions to time
    completions: int
    used: str  # "tokens" | "completions" | "neither: they disagree"

    def scaled(self, factor: float) -> RateCheck:
        """The same check with every rate times `factor` (another clock's seconds)."""

        def times(rate: tuple[float, float, float]) -> tuple[float, float, float]:
            return rate[0] * factor, rate[1] * factor, rate[2] * factor

        counted = None if self.counted is None else times(self.counted)
        return RateCheck(times(self.from_tokens), counted, self.completions, self.used)

    @property
    def agree(self) -> bool:
        if self.counted is None:
            return True
        return self.from_tokens[1] <= self.counted[2] and self.counted[1] <= self.from_tokens[2]

    @property
    def relative_difference(self) -> float | None:
        """|tokens − counted| ÷ the larger, where both exist."""
        if self.counted is None:
            return None
        a, b = self.from_tokens[0], self.counted[0]
        return abs(a - b) / max(a, b) if max(a, b) > 0 else 0.0

    @property
    def why(self) -> str | None:
        """Why the two differ by more than a tenth, or None where they do not."""
        if self.counted is None:
            return (
                f"{self.completions} completions in the window, too few to count a rate "
                "beside the token rate"
            )
        difference = self.relative_difference or 0.0
        if difference <= 0.10:
            return None
        tokens, counted = self.from_tokens, self.counted
        both = (
            f"the token rate gave {tokens[0]:.3g} rollouts/s ({tokens[1]:.3g}–{tokens[2]:.3g}) "
            f"and {self.completions} completions {counted[0]:.3g} ({counted[1]:.3g}–"
            f"{counted[2]:.3g})"
        )
        if self.agree:
            return f"{both}: {difference:.0%} apart, within their intervals"
        return (
            f"{both}: they disagree beyond their intervals, so the block's interval spans "
            "both (a server streaming several tokens a piece without saying so, or a load "
            "change inside the window)"
        )


@dataclass(frozen=True, slots=True)
class ProbeBlock(Record):
    """One block of a probe measured on its own: diagnose measures the low and the high
    parallelism in turn, so a block and the other parallelism's next block form a pair
    measured under the same conditions."""

    at: float  # when its measured window began (epoch seconds; ordering the blocks)
    rollouts_per_s: float
    rollouts_per_s_ci: tuple[float, float]
    batches: int
    measured_s: float
    latency_p50_s: float | None  # the whole rollout's, over the block's window
    latency_p95_s: float | None
    # Where rollouts were too long to time by completions: the output tokens/s the block
    # was timed in (its rollouts/s is this ÷ the tokens a finished rollout had).
    output_tokens_per_s: float | None = None
    output_tokens_per_s_ci: tuple[float, float] | None = None
    stop_reason: str = ""  # why its window ended: precision, time cap, ... (see Window)
    rate_check: RateCheck | None = None  # where it was timed in tokens

    @property
    def rate(self) -> tuple[float, float, int]:
        """(rate, halfwidth of its 95% interval, batches): what `stats` pairs."""
        return self.rollouts_per_s, self.rollouts_per_s_ci[1] - self.rollouts_per_s, self.batches

    @property
    def token_rate(self) -> tuple[float, float, int] | None:
        """The same in output tokens/s, where the block was timed in tokens."""
        if self.output_tokens_per_s is None or self.output_tokens_per_s_ci is None:
            return None
        rate = self.output_tokens_per_s
        return rate, self.output_tokens_per_s_ci[1] - rate, self.batches

    @property
    def latency_dispersion(self) -> float | None:
        if not self.latency_p50_s or self.latency_p95_s is None:
            return None
        return self.latency_p95_s / self.latency_p50_s


@dataclass(frozen=True, slots=True)
class ProbeResult(Record):
    """Everything one probe measured at one parallelism. Probes that cannot see a stage
    (a user's command, the virtual engine) leave its fields at their defaults."""

    parallelism: int
    rollouts_per_s: float
    rollouts_per_s_ci: tuple[float, float]
    output_tokens_per_s: float
    error_rate: float
    completed: int
    failed: int
    measured_s: float
    warmup_s: float
    stop_reason: str  # converged | time cap | server died | rows timed | whole run timed | ...
    latency_s: dict[str, StageLatency] = field(default_factory=no_latencies)
    errors_by_class: dict[str, int] = field(default_factory=dict)
    rate_limited_responses: int = 0
    retry_after_seen: int = 0
    limiter_wait_share: float = 0.0
    verifier_capacity: int | None = None
    verifier_busy_fraction: float | None = None
    verifier_capacity_rps: float | None = None
    telemetry: dict[str, dict[str, float]] = field(default_factory=dict)  # "source/metric"
    telemetry_unavailable: dict[str, str] = field(default_factory=dict)
    server_engine: str | None = None  # the engine its metrics showed (vllm, sglang, trtllm)
    token_check: dict[str, float] | None = None
    series: list[dict[str, Any]] = field(default_factory=list)
    batches: int = 10  # of the rate's batch-means interval (its degrees of freedom + 1)
    latency_cv: float | None = None  # rollout latency's standard deviation ÷ its mean
    timeouts: int = 0  # model calls that timed out in the window, retried or failed
    # Seconds since the probe began: rollouts/s in short bins, and the spans of its
    # phases ("warm-up", "measured", "drain"); an extended probe's runs follow each other.
    timeline: list[tuple[float, float]] = field(default_factory=list)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    replicas: list[ReplicaStats] = field(default_factory=list)  # several replicas only
    # With --num-repeats above 1: the GRPO groups that ended inside the window.
    groups: GroupSummary | None = None
    # Each measure of an engine probe, in order: diagnose pairs them across parallelisms.
    blocks: list[ProbeBlock] = field(default_factory=list)
    # Multi-turn rollouts: tool calls made in the windows, those answered with an error
    # status, and those still hanging when a block's drain gave up on them.
    tool_calls: int = 0
    tool_errors: int = 0
    stuck_tool_calls: int = 0
    # Model calls retried, by failure class, over the probe's whole run (warm-up and
    # drain too): which faults the server showed, though every retry succeeded.
    retries_by_class: dict[str, int] = field(default_factory=dict)

    @property
    def probe_s(self) -> float:
        """How long the probe ran (simulated seconds on the virtual engine)."""
        return self.warmup_s + self.measured_s

    @property
    def latency_dispersion(self) -> float | None:
        """p95 ÷ p50 of the whole rollout's latency: a long tail is a symptom of too much
        parallelism (queueing, retries), as the NeMo Gym guide lists."""
        total = self.latency_s.get("total")
        if total is None or not total.p50 or total.p95 is None:
            return None
        return total.p95 / total.p50

    @property
    def gpu_window(self) -> str:
        """The window the probe's GPU utilisation covers, and how many NVML readings made
        it: what a figure of it says beside the number."""
        readings = self.telemetry.get("gpu/gpu_util_pct_mean", {}).get("samples")
        count = "" if readings is None else f"{readings:.0f} "
        blocks = len(self.blocks) or 1
        return (
            f"mean of {count}NVML readings over the measured {self.measured_s:.1f} s of the "
            f"probe at parallelism {self.parallelism} ({blocks} block{'s' * (blocks > 1)})"
        )


@dataclass(frozen=True, slots=True)
class CurvePoint(Record):
    """One measured point of a configuration's throughput curve (a probe, in short)."""

    parallelism: int
    rollouts_per_s: float
    output_tokens_per_s: float
    error_rate: float
    p95_latency_s: float | None
    probe_s: float
    stop_reason: str
    p50_latency_s: float | None = None
    p95_ttft_s: float | None = None  # streamed requests only
    # The probe's 95% interval of rollouts/s; None when it had too few batches for one.
    rollouts_per_s_ci: tuple[float, float] | None = None
    completed: int | None = None  # rollouts counted in the window
    batches: int | None = None  # of the interval: its degrees of freedom + 1
    # Prompt tokens the server found in its prefix cache ÷ those it looked up, over the
    # window (vLLM's prefix_cache_hits/queries counters); None where it exposes none.
    prefix_cache_hit_share: float | None = None
    p99_latency_s: float | None = None  # rollout latency's; a p99 SLO reads it

    @classmethod
    def of(cls, result: ProbeResult) -> CurvePoint:
        low, high = result.rollouts_per_s_ci
        total = result.latency_s["total"]
        ttft = result.latency_s.get("ttft")
        queries = result.telemetry.get("server/vllm:prefix_cache_queries_total", {})
        hits = result.telemetry.get("server/vllm:prefix_cache_hits_total", {})
        looked_up = queries.get("delta")
        return cls(
            parallelism=result.parallelism,
            rollouts_per_s=result.rollouts_per_s,
            output_tokens_per_s=result.output_tokens_per_s,
            error_rate=result.error_rate,
            p95_latency_s=total.p95,
            p99_latency_s=total.p99,
            probe_s=result.probe_s,
            stop_reason=result.stop_reason,
            p50_latency_s=total.p50,
            p95_ttft_s=ttft.p95 if ttft is not None else None,
            rollouts_per_s_ci=(low, high) if math.isfinite(high) and high > 0 else None,
            completed=result.completed,
            batches=result.batches,
            prefix_cache_hit_share=hits.get("delta", 0.0) / looked_up if looked_up else None,
        )

    def metric(self, name: str) -> float:
        """The objective's figure: rollouts_per_s or output_tokens_per_s."""
        figure = self.output_tokens_per_s if name == "output_tokens_per_s" else self.rollouts_per_s
        return float(figure)

    def metric_interval(self, name: str) -> tuple[float, float] | None:
        """The objective's 95% interval: the rate's, scaled to the metric (tokens per rollout
        are measured over the same window); None when the probe gave none."""
        if self.rollouts_per_s_ci is None or self.rollouts_per_s <= 0:
            return None
        scale = self.metric(name) / self.rollouts_per_s
        return self.rollouts_per_s_ci[0] * scale, self.rollouts_per_s_ci[1] * scale
