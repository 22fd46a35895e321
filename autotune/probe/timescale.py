"""A probe of an accelerated simulator, in the simulator's own time: `in_simulated_time`
scales rates and durations by the server's time scale. Why: docs/design/probes.md.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.results.probes import ProbeResult
from autotune.results.stages import StageLatency


def in_simulated_time(probe: ProbeResult, scale: float, origin: float) -> ProbeResult:
    """`probe` converted from wall-clock time at `scale` to simulated time; telemetry
    timestamps are stretched about `origin` (one instant for every probe of a job, so
    probes keep their order). Scale 0 (as fast as possible) or 1 leaves it as it is."""
    if scale <= 0 or scale == 1:
        return probe

    def seconds(value: float | None) -> float | None:
        return None if value is None else value / scale

    def stretched(s: StageLatency) -> StageLatency:
        return StageLatency(s.count, *(seconds(v) for v in (s.mean, s.p50, s.p95, s.p99)))

    latency = {stage: stretched(s) for stage, s in probe.latency_s.items()}
    check = probe.token_check
    if check is not None:
        check = {
            key: value * scale if key.endswith("_per_s") else value for key, value in check.items()
        }
    low, high = probe.rollouts_per_s_ci
    capacity = probe.verifier_capacity_rps
    groups = probe.groups
    if groups is not None:
        groups = replace(
            groups,
            informative_groups_per_s=groups.informative_groups_per_s * scale,
            informative_tokens_per_s=groups.informative_tokens_per_s * scale,
            completion_s=stretched(groups.completion_s),
        )
    blocks = [
        replace(
            block,
            at=origin + (block.at - origin) / scale,
            rollouts_per_s=block.rollouts_per_s * scale,
            rollouts_per_s_ci=(
                block.rollouts_per_s_ci[0] * scale,
                block.rollouts_per_s_ci[1] * scale,
            ),
            measured_s=block.measured_s / scale,
            latency_p50_s=seconds(block.latency_p50_s),
            latency_p95_s=seconds(block.latency_p95_s),
            output_tokens_per_s=None
            if block.output_tokens_per_s is None
            else block.output_tokens_per_s * scale,
            output_tokens_per_s_ci=None
            if block.output_tokens_per_s_ci is None
            else (block.output_tokens_per_s_ci[0] * scale, block.output_tokens_per_s_ci[1] * scale),
            rate_check=None if block.rate_check is None else block.rate_check.scaled(scale),
        )
        for block in probe.blocks
    ]
    return replace(
        probe,
        rollouts_per_s=probe.rollouts_per_s * scale,
        rollouts_per_s_ci=(low * scale, high * scale),
        output_tokens_per_s=probe.output_tokens_per_s * scale,
        measured_s=probe.measured_s / scale,
        warmup_s=probe.warmup_s / scale,
        latency_s=latency,
        verifier_capacity_rps=None if capacity is None else capacity * scale,
        token_check=check,
        series=[{**s, "t": origin + (s["t"] - origin) / scale} for s in probe.series],
        timeline=[(t / scale, rate * scale) for t, rate in probe.timeline],
        phases=[(name, start / scale, end / scale) for name, start, end in probe.phases],
        groups=groups,
        blocks=blocks,
    )
