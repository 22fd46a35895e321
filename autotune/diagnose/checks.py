"""The checks table a verdict cites: each check's measured figure, its threshold and what
it means, with the pairs of low and high blocks they are measured on.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from autotune.results.diagnosis import Evidence, Thresholds
from autotune.results.probes import ProbeBlock, ProbeResult
from autotune.stats import (
    Rate,
    RatioInterval,
    paired_ratio_interval,
    ratio_interval,
)

RATE_LIMIT_CLASSES = frozenset({"rate_limited"})  # failure classes a rate limit causes


VERDICTS = (
    "parallelism-bound",
    "model-bound",
    "verifier-bound",
    "environment-bound",
    "tail-bound",
    "rate-limited",
    "client-bound",
    "unstable",
    "inconclusive",
)


Comparison = Literal[">=", ">"]


_OPERATORS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, ">": operator.gt}


def compare(
    name: str, value: float, comparison: Comparison, threshold: float, meaning: str, unit: str
) -> Evidence:
    met = _OPERATORS[comparison](value, threshold)
    return Evidence(name, float(value), float(threshold), comparison, met, meaning, unit)


@dataclass(frozen=True, slots=True)
class Pair:
    """What the checks read: the two probes and the thresholds. A check names its metric
    and the fields of its meaning, so the figures derived from both probes live here."""

    low: ProbeResult
    high: ProbeResult
    th: Thresholds

    def __getitem__(self, name: str) -> Any:
        """A meaning's fields, for `str.format_map`: `{high.parallelism}`, `{predicted:.2f}`."""
        return getattr(self, name)

    def read(self, metric: str) -> float | None:
        """A check's metric: a high-probe telemetry series and statistic
        (`"server/vllm:kv_cache_usage_perc max"`), or a figure of this pair by name; None
        where the probes did not measure it."""
        series, _, stat = metric.partition(" ")
        if not stat:
            return getattr(self, metric)
        value = self.high.telemetry.get(series, {}).get(stat)
        return None if value is None else float(value)

    @property
    def ratio(self) -> float:
        return self.high.parallelism / self.low.parallelism

    @property
    def speedup(self) -> float:
        if block_pairs(self.low, self.high):
            return speedup_interval(self.low, self.high).ratio
        low, high = self.low.rollouts_per_s, self.high.rollouts_per_s
        return high / low if low > 0 else 0.0

    @property
    def predicted(self) -> float:
        """Latency growth of a saturated stage: Little's law at a fixed in-flight count."""
        return self.ratio / max(self.speedup, 1e-9)

    @property
    def high_error_rate(self) -> float:
        return _other_error_rate(self.high)

    @property
    def low_error_rate(self) -> float:
        return _other_error_rate(self.low)

    @property
    def server_died(self) -> float:
        return float(self.high.stop_reason == "server died")

    @property
    def timeout_share(self) -> float:
        return self.high.timeouts / max(self.high.completed + self.high.failed, 1)

    @property
    def stuck_tool_calls(self) -> float | None:
        """Tool calls hanging when the high probe's blocks ended; None without tools."""
        if not (self.low.tool_calls or self.high.tool_calls or self.high.stuck_tool_calls):
            return None
        return float(self.high.stuck_tool_calls)

    @property
    def dispersion_growth(self) -> float:
        """How much wider the latency tail got at high parallelism; 0 when unmeasured. With
        paired blocks, the least growth of any pair: a tail the machine's load widened in
        one block does not count unless every pair shows it."""
        pairs = block_pairs(self.low, self.high)
        spreads = (
            [(low.latency_dispersion, high.latency_dispersion) for low, high in pairs]
            if pairs
            else [(self.low.latency_dispersion, self.high.latency_dispersion)]
        )
        growth = [after / before for before, after in spreads if before and after]
        return min(growth) if growth else 0.0

    @property
    def refusal_share(self) -> float:
        return self.high.rate_limited_responses / max(self.high.completed + self.high.failed, 1)

    @property
    def rate_limit_failures(self) -> int:
        errors = self.high.errors_by_class
        return sum(n for cls, n in errors.items() if cls in RATE_LIMIT_CLASSES)

    @property
    def limiter_wait_share(self) -> float:
        return self.high.limiter_wait_share

    @property
    def verifier_busy(self) -> float | None:
        """Only a pool of known size has a busy fraction worth reading."""
        return None if self.high.verifier_capacity is None else self.high.verifier_busy_fraction

    @property
    def verifier_capacity_use(self) -> float | None:
        capacity = self.high.verifier_capacity_rps
        return self.high.rollouts_per_s / capacity if capacity else None

    @property
    def verify_wait_growth(self) -> float | None:
        """None when rollouts hardly queued for a verifier (5 ms): a ratio of noise."""
        low_wait = self.low.latency_s["verify_wait"].mean or 0.0
        high_wait = self.high.latency_s["verify_wait"].mean or 0.0
        return high_wait / max(low_wait, 1e-4) if high_wait > 0.005 else None

    @property
    def verify_wait_ms(self) -> float:
        return (self.high.latency_s["verify_wait"].mean or 0.0) * 1000

    @property
    def model_growth(self) -> float | None:
        """Model latency growth ÷ what a saturated server predicts."""
        low_model, high_model = self.low.latency_s["model"].mean, self.high.latency_s["model"].mean
        return (high_model / low_model) / self.predicted if low_model and high_model else None

    @property
    def tool_s(self) -> tuple[float, float] | None:
        """Time in tool calls per rollout, low and high; None without a tool stage in both
        (single-turn rollouts have none), so neither tool check has evidence."""
        low_tool, high_tool = stage_mean(self.low, "tool"), stage_mean(self.high, "tool")
        return (low_tool, high_tool) if low_tool and high_tool else None

    @property
    def tool_growth(self) -> float | None:
        """Tool latency growth ÷ what a saturated environment predicts."""
        if self.tool_s is None:
            return None
        low_tool, high_tool = self.tool_s
        return (high_tool / low_tool) / self.predicted

    @property
    def tool_share(self) -> float | None:
        """The high probe's share of rollout time in tool calls."""
        if self.tool_s is None:
            return None
        high_tool = self.tool_s[1]
        return high_tool / (stage_mean(self.high, "total") or high_tool)

    @property
    def high_classes(self) -> str:
        return failure_classes(self.high)

    @property
    def low_spread(self) -> str:
        return _spread(self.low)

    @property
    def high_spread(self) -> str:
        return _spread(self.high)


@dataclass(frozen=True, slots=True)
class Check:
    """One rule as data: a metric read from the probes, compared with a threshold; its
    meaning says what the number shows."""

    name: str
    metric: str  # what `Pair.read` reads; also the check's key in a verdict's findings
    comparison: Comparison
    threshold: str | float  # a Thresholds field's name, or a fixed number
    meaning: str  # a `str.format` template over the Pair's fields
    unit: str = ""  # how Evidence rounds the number: share, ×, ms, count, or "" (3 digits)

    def judge(self, pair: Pair) -> Evidence | None:
        """The evidence, or None where the probes did not measure the metric."""
        value = pair.read(self.metric)
        if value is None:
            return None
        threshold = self.threshold
        if isinstance(threshold, str):
            threshold = getattr(pair.th, threshold)
        meaning = self.meaning.format_map(pair)
        return compare(self.name, value, self.comparison, threshold, meaning, self.unit)


# The checks behind each verdict, in the order its evidence lists them: name, metric,
# comparison, threshold, meaning and unit (see Check).
# fmt: off
CHECKS: dict[str, tuple[Check, ...]] = {
    "unstable": (
        Check("high probe error rate (rate limits aside)",
              "high_error_rate", ">", "max_error_rate",
              "share of rollouts at parallelism {high.parallelism} that failed ({high_classes})",
              "share"),
        Check("high probe stopped because the server died",
              "server_died", ">=", 1.0,
              "model calls stopped connecting during the probe", "count"),
        Check("low probe error rate (rate limits aside)",
              "low_error_rate", ">", "max_error_rate",
              "share of rollouts at parallelism {low.parallelism} that failed", "share"),
        Check("timed-out model calls per rollout in the high probe",
              "timeout_share", ">", "timeout_share",
              "{high.timeouts} calls at parallelism {high.parallelism} ran past their timeout "
              "(retried or failed): a symptom of too much parallelism", "share"),
        Check("tool calls hanging when the high probe ended",
              "stuck_tool_calls", ">", 0.0,
              "{high.stuck_tool_calls} tool calls at parallelism {high.parallelism} still had "
              "no answer after the rollouts in flight had several mean latencies to finish: "
              "the environment hangs", "count"),
        Check("rollout latency spread growth (p95/p50, high ÷ low)",
              "dispersion_growth", ">=", "dispersion_growth",
              "p95/p50 {low_spread} at parallelism {low.parallelism}, {high_spread} at "
              "{high.parallelism}: with falling throughput, a symptom of too much "
              "parallelism", "×"),
    ),
    "rate-limited": (
        Check("HTTP 429 responses per rollout in the high probe's window",
              "refusal_share", ">=", "rate_limited_share",
              "the endpoint refused {high.rate_limited_responses} requests for exceeding its "
              "rate and sent {high.retry_after_seen} Retry-After headers", "share"),
        Check("rollouts failed on rate limits in the high probe",
              "rate_limit_failures", ">", 0.0,
              "calls refused for exceeding the rate on every retry, whatever their share",
              "count"),
        Check("share of slot time waiting on the client's --rpm/--tpm limiter",
              "limiter_wait_share", ">=", "limiter_wait_share",
              "the client's own rate limit holds requests back", "share"),
    ),
    "client-bound": (
        Check("client CPU (cores) during the high probe",
              "client/cpu_fraction mean", ">=", "client_cpu_fraction",
              "the harness's own process is busy"),
        Check("client event-loop lag, ms (mean)",
              "client/loop_lag_ms mean", ">=", "client_loop_lag_ms",
              "the harness reacts late to finished I/O", "ms"),
    ),
    "verifier-bound": (
        Check("verifier workers busy (fraction)",
              "verifier_busy", ">=", "verifier_busy_fraction",
              "{high.verifier_capacity} workers verifying nearly all the time", "share"),
        Check("throughput ÷ verifier capacity",
              "verifier_capacity_use", ">=", "verifier_capacity_use",
              "capacity = workers ÷ mean verify time = {high.verifier_capacity_rps:.3g} "
              "rollouts/s", "share"),
        Check("verifier queue wait growth (high ÷ low)",
              "verify_wait_growth", ">=", "verify_wait_growth",
              "rollouts wait {verify_wait_ms:.0f} ms for a verifier", "×"),
    ),
    "model-bound": (
        Check("model latency growth ÷ Little's-law prediction",
              "model_growth", ">=", "littles_law_match",
              "model latency {low.latency_s[model].mean:.3g} s → {high.latency_s[model].mean:.3g}"
              " s; a saturated server predicts ×{predicted:.2f}"),
        Check("server requests waiting (mean)",
              "server/vllm:num_requests_waiting mean", ">=", "server_waiting",
              "the server queues requests it cannot schedule"),
        Check("server KV cache usage (max)",
              "server/vllm:kv_cache_usage_perc max", ">=", "kv_cache_full",
              "the KV cache is full", "share"),
        Check("server preemptions during the probe",
              "server/vllm:num_preemptions_total delta", ">", 0.0,
              "sequences were evicted for lack of KV cache", "count"),
        Check("GPU utilisation, % (mean)",
              "gpu/gpu_util_pct_mean mean", ">=", "gpu_busy_pct",
              "{high.gpu_window}: a kernel ran most of the time"),
    ),
    # Tools saturating (multi-turn rollouts): the time each rollout spends in tool calls
    # grows as Little's law predicts for a stage that caps throughput, and it is a large
    # share of the rollout. No tool stage (single-turn rollouts): no evidence.
    "environment-bound": (
        Check("tool latency growth ÷ Little's-law prediction",
              "tool_growth", ">=", "littles_law_match",
              "time in tools per rollout {low.latency_s[tool].mean:.3g} s → "
              "{high.latency_s[tool].mean:.3g} s; a saturated environment predicts "
              "×{predicted:.2f}"),
        Check("share of rollout time in tool calls (high probe)",
              "tool_share", ">=", "tool_share",
              "rollouts wait on the environment's tools more than on anything else"),
    ),
}


def judge(verdict: str, pair: Pair) -> dict[str, Evidence]:
    """The evidence of a verdict's checks that the probes measured, by metric, in order."""
    found = ((check.metric, check.judge(pair)) for check in CHECKS[verdict])
    return {metric: evidence for metric, evidence in found if evidence is not None}


def _other_error_rate(probe: ProbeResult) -> float:
    """The probe's error rate without the rollouts a rate limit sank."""
    errors = probe.errors_by_class
    total = sum(errors.values())
    if not total:
        return probe.error_rate
    other = sum(n for cls, n in errors.items() if cls not in RATE_LIMIT_CLASSES)
    return probe.error_rate * other / total


def _spread(probe: ProbeResult) -> str:
    dispersion, cv = probe.latency_dispersion, probe.latency_cv
    if dispersion is None:
        return "unmeasured"
    return f"{dispersion:.2f}" + (f" (CV {cv:.2f})" if cv is not None else "")


def failure_classes(probe: ProbeResult) -> str:
    if not probe.errors_by_class:
        return "no errors"
    return ", ".join(f"{k}: {v}" for k, v in sorted(probe.errors_by_class.items()))


def stage_mean(probe: ProbeResult, stage: str) -> float | None:
    """A stage's mean latency; None where the probe has no such stage (older results
    have no tool stage)."""
    latency = probe.latency_s.get(stage)
    return None if latency is None else latency.mean


def block_pairs(low: ProbeResult, high: ProbeResult) -> list[tuple[ProbeBlock, ProbeBlock]]:
    """Each low block with the high block measured after it, in time order; none unless
    both probes were measured in at least two alternating blocks, each with an interval
    of its own (a block too short for two batches has none: then the probes' pooled
    batches say more than pairs could)."""
    if len(low.blocks) < 2 or len(high.blocks) < 2:
        return []
    if not all(_has_interval(block) for block in (*low.blocks, *high.blocks)):
        return []
    lows = sorted(low.blocks, key=lambda block: block.at)
    highs = sorted(high.blocks, key=lambda block: block.at)
    return list(zip(lows, highs, strict=False))


def _has_interval(block: ProbeBlock) -> bool:
    return block.batches > 1 and math.isfinite(block.rollouts_per_s_ci[1])


@dataclass(frozen=True, slots=True)
class LoadChange:
    """Blocks of one parallelism that disagree beyond their intervals: the load changed
    while the probes ran. A pair of blocks measured across the change compares two
    loads, so the speedup rests on the pairs measured on one side of it. Where the change
    fell is known only as far as the blocks tell: `readings` holds, for every place the
    blocks allow (each block in turn as the one it fell in, the blocks before it under one
    load and those after under the other), the pairs (numbered from 1) wholly on one side
    and their speedup. The verdict's interval spans every reading's."""

    moved: list[tuple[int, float, float]]  # parallelism, its first and last block's rate
    readings: list[tuple[list[int], RatioInterval]]

    @property
    def interval(self) -> RatioInterval:
        """The speedup every placement allows: the hull of the readings' intervals (no
        placement fits, or one leaves no pair: 0 to infinity), centred on the reading
        with the most pairs."""
        if not self.readings:
            return RatioInterval(1.0, 0.0, math.inf)
        pairs, centre = max(self.readings, key=lambda reading: len(reading[0]))
        low = min(interval.low for _, interval in self.readings)
        high = max(interval.high for _, interval in self.readings)
        return RatioInterval(centre.ratio if pairs else 1.0, low, high)

    @property
    def pairs_used(self) -> list[int]:
        """The pairs some placement reads (numbered from 1)."""
        return sorted({number for pairs, _ in self.readings for number in pairs})

    def describe(self) -> str:
        moves = "; ".join(
            f"parallelism {parallelism} {first:.3g} → {last:.3g} rollouts/s"
            for parallelism, first, last in self.moved
        )
        used = ", ".join(map(str, self.pairs_used)) or "none"
        return (
            f"the load changed during the probes ({moves}, beyond their blocks' intervals); "
            f"the speedup rests on the pairs of blocks measured on one side of the change "
            f"(pair {used})"
        )


def load_change(low: ProbeResult, high: ProbeResult) -> LoadChange | None:
    """Where blocks of the same parallelism disagree beyond their intervals, where the
    change may have fallen and what the pairs on one side of it say; None where they
    agree (or the probes were not measured in pairs of blocks)."""
    pairs = block_pairs(low, high)
    moved = [_moved(probe) for probe in (low, high)]
    if not pairs or not any(moved):
        return None
    timeline = sorted(
        [(b.at, side, b) for side, probe in enumerate((low, high)) for b in probe.blocks],
        key=lambda entry: entry[0],
    )
    position = {id(block): i for i, (_, _, block) in enumerate(timeline)}
    readings = []
    for suspect in range(len(timeline)):
        before, after = timeline[:suspect], timeline[suspect + 1 :]
        if not _one_load_each_side(before, after):
            continue
        clean = [
            number
            for number, (lo, hi) in enumerate(pairs, start=1)
            if suspect not in (position[id(lo)], position[id(hi)])
            and (position[id(lo)] < suspect) == (position[id(hi)] < suspect)
        ]
        interval = (
            paired_ratio_interval([pair_rates(*pairs[number - 1]) for number in clean])
            if clean
            else RatioInterval(1.0, 0.0, math.inf)
        )
        readings.append((clean, interval))
    return LoadChange([m for m in moved if m is not None], readings)


def _moved(probe: ProbeResult) -> tuple[int, float, float] | None:
    """The probe's first and last block's rates where its blocks disagree."""
    blocks = sorted(probe.blocks, key=lambda block: block.at)
    if len(blocks) < 2 or blocks_agree(blocks):
        return None
    return probe.parallelism, blocks[0].rollouts_per_s, blocks[-1].rollouts_per_s


def blocks_agree(blocks: list[ProbeBlock]) -> bool:
    """Whether every interval meets every other (no block lies wholly above another)."""
    if len(blocks) < 2:
        return True
    lows, highs = zip(*(block.rollouts_per_s_ci for block in blocks), strict=True)
    return max(lows) <= min(highs)


def _one_load_each_side(
    before: list[tuple[float, int, ProbeBlock]], after: list[tuple[float, int, ProbeBlock]]
) -> bool:
    """Whether the blocks fit one load before the change and another after it: each
    parallelism's blocks agree on each side, and differ across it (a change of load
    moves every parallelism)."""
    for side in (0, 1):
        early = [block for _, s, block in before if s == side]
        late = [block for _, s, block in after if s == side]
        if not blocks_agree(early) or not blocks_agree(late):
            return False
        if early and late and blocks_agree(early + late):
            return False
    return True


def speedup_interval(low: ProbeResult, high: ProbeResult) -> RatioInterval:
    """High ÷ low throughput with its 95% interval: from the paired blocks where the
    probes alternated (those on one side of a load change, where one was detected:
    `load_change`), else from both probes' batch means."""
    change = load_change(low, high)
    if change is not None:
        return change.interval
    pairs = block_pairs(low, high)
    if pairs:
        return paired_ratio_interval([pair_rates(lo, h) for lo, h in pairs])

    def rate(probe: ProbeResult) -> tuple[float, float, int]:
        return (
            probe.rollouts_per_s,
            probe.rollouts_per_s_ci[1] - probe.rollouts_per_s,
            probe.batches,
        )

    return ratio_interval(rate(high), rate(low))


def pair_speedups(low: ProbeResult, high: ProbeResult) -> list[RatioInterval]:
    """Each pair of blocks' own speedup and interval, in time order."""
    return [ratio_interval(*pair_rates(lo, h)) for lo, h in block_pairs(low, high)]


def pair_rates(low: ProbeBlock, high: ProbeBlock) -> tuple[Rate, Rate]:
    """A pair's (high, low) rates: in output tokens where both blocks were timed in them
    (the same workload at two parallelisms: their ratio is the rollouts'), else in
    rollouts."""
    if low.token_rate is not None and high.token_rate is not None:
        return high.token_rate, low.token_rate
    return high.rate, low.rate
