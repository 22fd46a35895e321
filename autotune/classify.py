"""Bottleneck verdicts from a low and a high parallelism probe: pure rules, no I/O.

Order of the rules: a probe that was throttled (`rate-limited`) or failed (`unstable`)
says nothing about scaling, and a saturated client (`client-bound`) hides the server, so
those are checked first. Refusals for exceeding a rate limit (HTTP 429, and rollouts that
failed on them) make it `rate-limited` however many rollouts they sank, unless the server
died: they are not the server failing, so `unstable` judges the other failures only.
Timeouts count as instability too, and so does a latency tail that grew far wider at
high parallelism (p95/p50) while throughput fell: the NeMo Gym guide lists both as
symptoms of too much parallelism. A wider tail while throughput still grows is what
continuous batching does, so it is a note beside the throughput verdict, not instability.

Diagnose measures the two parallelisms in alternating blocks (low, high, low, high):
each low block and the high block after it form a pair measured under the same
conditions, the speedup is the pairs' geometric mean, and a change of the machine's load
between pairs cancels in it. A decided verdict needs every pair to agree with it: a pair
whose own interval lies wholly on the other side of the threshold means the conditions
changed within the probes, and the verdict is `inconclusive` for that reason.
Then scaling decides, by the speedup's 95% interval, never by its point alone:
throughput that grew about as much as the NeMo Gym guide asks (2× for 4× parallelism)
all across the interval is `parallelism-bound`; an interval wholly below that is
saturated somewhere, and the stage whose saturation signals were measured (verifier
busy and queueing, or model latency growing as Little's law predicts, server queueing,
KV cache full, GPU busy) is named, `leaning` unless the interval says throughput barely
moved. Either way the interval must clear the threshold by a small margin: a speedup on
the threshold is neither, and no probe length could make it one. An interval that
straddles the threshold (or its margin) is `inconclusive`: the verdict names the two it
lies between and the next step. Every verdict says how sure it is.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from autotune.results.diagnosis import Evidence, Thresholds, Verdict
from autotune.results.probes import ProbeBlock, ProbeResult
from autotune.results.runs import BatchSummary
from autotune.results.stages import ReplicaStats
from autotune.stats import (
    Rate,
    RatioInterval,
    mean_interval,
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


def _compare(
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
        low_tool, high_tool = _mean(self.low, "tool"), _mean(self.high, "tool")
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
        return high_tool / (_mean(self.high, "total") or high_tool)

    @property
    def high_classes(self) -> str:
        return _classes(self.high)

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
        return _compare(self.name, value, self.comparison, threshold, meaning, self.unit)


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
              "vLLM queues requests it cannot schedule"),
        Check("server KV cache usage (max)",
              "server/vllm:kv_cache_usage_perc max", ">=", "kv_cache_full",
              "the KV cache is full", "share"),
        Check("server preemptions during the probe",
              "server/vllm:num_preemptions_total delta", ">", 0.0,
              "sequences were evicted for lack of KV cache", "count"),
        Check("GPU utilisation, % (mean)",
              "gpu/gpu_util_pct_mean mean", ">=", "gpu_busy_pct",
              "a kernel ran most of the time"),
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
# fmt: on


def _judge(verdict: str, pair: Pair) -> dict[str, Evidence]:
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


def _classes(probe: ProbeResult) -> str:
    if not probe.errors_by_class:
        return "no errors"
    return ", ".join(f"{k}: {v}" for k, v in sorted(probe.errors_by_class.items()))


def _mean(probe: ProbeResult, stage: str) -> float | None:
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


def speedup_interval(low: ProbeResult, high: ProbeResult) -> RatioInterval:
    """High ÷ low throughput with its 95% interval: from the paired blocks where the
    probes alternated, else from both probes' batch means."""
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


def classify(low: ProbeResult, high: ProbeResult, th: Thresholds | None = None) -> Verdict:
    """The verdict for a low/high probe pair, with the evidence that decided it and how
    sure it is."""
    pair = Pair(low, high, th or Thresholds())
    th, ratio, speedup = pair.th, pair.ratio, pair.speedup
    interval = speedup_interval(low, high)
    bounds = (interval.low, interval.high)
    scales_at, flat_at = th.parallelism_bound_speedup(ratio), 1 + th.flat_gain
    below, above = th.undecided_zone(ratio)
    margin = f"{th.threshold_margin:.0%}"
    shown = f"×{interval.low:.2f}–×{interval.high:.2f}"

    def verdict(
        word: str,
        evidence: list[Evidence],
        step: str,
        confidence: str,
        *,
        leaning: bool = False,
        clear: bool | None = None,
        between: tuple[str, ...] = (),
    ) -> Verdict:
        return Verdict(
            word,
            leaning,
            speedup,
            ratio,
            evidence,
            step,
            notes,
            speedup_interval=bounds,
            clear_of_threshold=clear,
            confidence=confidence,
            between=list(between),
        )

    unstable = _judge("unstable", pair)
    falling = interval.high < 1  # throughput fell at the higher parallelism, surely
    instability = _instability(unstable, falling)
    notes = _notes(low, high) + _drift_notes(low, high)
    spread = unstable.get("dispersion_growth")
    if spread is not None and spread.met and not falling:
        notes.append(
            f"latency: p95/p50 grew ×{spread.value:.2f} from parallelism {low.parallelism} "
            f"to {high.parallelism} ({pair.low_spread} → {pair.high_spread}) while "
            f"throughput did not fall: the tail of continuous batching, not instability. "
            "Take p95 into account if the rollouts have a latency budget."
        )
    limited = _judge("rate-limited", pair)
    if any(e.met for e in limited.values()) and high.stop_reason != "server died":
        return verdict(
            "rate-limited",
            [*limited.values(), *instability],
            _rate_limited_step(low, high, limited, instability),
            "decided by the refusals counted, not by the speedup: " + _met(limited.values()),
        )
    if instability and _environment_fails(high, unstable):
        return verdict(
            "unstable",
            list(unstable.values()),
            f"fix the environment first: at {high.parallelism} the run "
            + _symptoms(high, unstable, falling)
            + ", all of it in tool calls. Check the resources server's log and capacity; "
            "raise --tool-timeout only if its calls are slow by design.",
            "decided by the tool calls that failed or hung, not by the speedup: "
            + _met(unstable.values()),
        )
    if instability:
        return verdict(
            "unstable",
            list(unstable.values()),
            f"lower parallelism: at {high.parallelism} the run "
            + _symptoms(high, unstable, falling)
            + f"; at {low.parallelism} it "
            + (
                "also failed; check the server's log first."
                if unstable["low_error_rate"].met
                else f"held ({low.rollouts_per_s:.3g} rollouts/s). "
                "Check the server's log (out of memory?), then run `autotune sweep` "
                f"with parallelism at most {high.parallelism // 2}."
            ),
            "decided by the failures and latencies measured, not by the speedup: "
            + _met(unstable.values()),
        )
    # Not a row of CHECKS: its threshold grows with the ratio, and the interval decides.
    scaling = _compare(
        "speedup (high ÷ low throughput)",
        speedup,
        ">=",
        scales_at,
        f"parallelism ×{ratio:.2g}: {low.rollouts_per_s:.3g} → "
        f"{high.rollouts_per_s:.3g} rollouts/s; 95% interval {shown}",
        "×",
    )
    scales = interval.low >= above
    client = list(_judge("client-bound", pair).values())
    # Both, not either: a lagging loop in an idle process means the OS starved it (a
    # server on the same cores, say), which says nothing about the harness's own cost.
    if not scales and client and all(e.met for e in client):
        return verdict(
            "client-bound",
            [scaling, *client],
            "the harness itself is the limit, not the server: split the run across "
            "processes or machines (`--shard i/N`), use a cheaper verifier, or run "
            "the client on a less loaded machine.",
            "decided by the client's own CPU and event-loop lag; the speedup's 95% "
            f"interval is {shown}",
        )
    verifier = _judge("verifier-bound", pair)
    model = _judge("model-bound", pair)
    environment = _judge("environment-bound", pair)
    stage, evidence, step = _saturated_stage(low, high, verifier, model, environment)
    pairs = pair_speedups(low, high)
    against = _contradicting_pairs(pairs, interval, below, above)
    if against:
        speedups = ", ".join(f"×{p.ratio:.2f} (×{p.low:.2f}–×{p.high:.2f})" for p in against)
        return verdict(
            "inconclusive",
            [scaling, *evidence],
            "rerun when the machine is quiet: its load (another job, or the server's own) "
            "changed while the probes ran, and a pair of blocks measured under one load "
            "disagrees with the others. Each pair of blocks is measured under the same "
            "conditions, so the pairs agree wherever the server's scaling alone decides.",
            f"inconclusive — the machine's load changed during the probes: the speedup's "
            f"95% interval over every pair of blocks is {shown}, but {len(against)} of "
            f"{len(pairs)} pairs ({speedups}) lie wholly on the other side of the "
            f"parallelism-bound threshold ×{scales_at:.2f}",
            clear=False,
            between=("parallelism-bound", stage),
        )
    if scales:
        return verdict(
            "parallelism-bound",
            [scaling],
            f"raise parallelism above {high.parallelism}: throughput grew "
            f"×{speedup:.2f} for ×{ratio:.2g} parallelism. Run `autotune sweep` "
            "to find the knee and take 80% of the peak.",
            f"sure — the speedup's 95% interval {shown} lies above the parallelism-bound "
            f"threshold ×{scales_at:.2f} (by more than its {margin} margin)",
            clear=True,
        )
    if interval.high >= below:
        on_it = interval.low >= below and interval.high <= above
        return verdict(
            "inconclusive",
            [scaling, *evidence],
            (
                "run `autotune sweep`: the speedup sits on the threshold, where a longer "
                "probe cannot move it to either side; the whole curve shows where it bends."
                if on_it
                else "measure longer: rerun with a larger --max-s (each probe's cap) for a "
                "narrower interval, or run `autotune sweep` to measure the whole curve "
                "instead of two points."
            )
            + f" If it saturates, it is {stage}: {step}",
            f"inconclusive — the speedup's 95% interval {shown} "
            + (
                f"lies within {margin} of"
                if on_it
                else f"reaches across the {margin} margin around"
            )
            + f" the parallelism-bound threshold ×{scales_at:.2f}, so it lies between "
            f"parallelism-bound and {stage}",
            clear=False,
            between=("parallelism-bound", stage),
        )
    if interval.high < flat_at:
        return verdict(
            stage,
            [scaling, *evidence],
            step,
            f"sure — the speedup's 95% interval {shown} lies below the parallelism-bound "
            f"threshold ×{scales_at:.2f} (by more than its {margin} margin), and below "
            f"×{flat_at:.2f}: throughput barely moved",
            clear=True,
        )
    where = "lies between" if interval.low >= flat_at else "reaches from below"
    return verdict(
        stage,
        [scaling, *evidence],
        f"throughput grew ×{speedup:.2f}, between 'barely moved' "
        f"(< ×{flat_at:.2f}) and 'scales' (≥ ×{scales_at:.2f}); it leans to {stage}. "
        f"Run `autotune sweep` next. {step}",
        f"sure it is not parallelism-bound — the speedup's 95% interval {shown} lies below "
        f"×{scales_at:.2f}; it {where} 'barely moved' (×{flat_at:.2f}), so the "
        "saturation is partial",
        leaning=True,
        clear=True,
    )


def _met(evidence: Iterable[Evidence]) -> str:
    """The evidence that decided a verdict, each number against its threshold."""
    return "; ".join(e.summary() for e in evidence if e.met)


def _instability(unstable: dict[str, Evidence], falling: bool) -> list[Evidence]:
    """The evidence that makes a run `unstable`: failures and timeouts, or a latency tail
    that grew while throughput fell. A tail alone, throughput still growing, does not."""
    return [
        e for metric, e in unstable.items() if e.met and (metric != "dispersion_growth" or falling)
    ]


def _environment_fails(high: ProbeResult, unstable: dict[str, Evidence]) -> bool:
    """The instability is the tools' alone: calls hung or failed, and every failure was a
    tool's (no model call timed out, the server never died)."""
    stuck = unstable.get("stuck_tool_calls")
    hung = stuck is not None and stuck.met
    classes = high.errors_by_class
    model_trouble = unstable["timeout_share"].met or unstable["server_died"].met
    tools_only = all(name.startswith("tool_") for name in classes)
    return (hung or bool(classes)) and tools_only and not model_trouble


def _symptoms(high: ProbeResult, unstable: dict[str, Evidence], falling: bool) -> str:
    """What went wrong in the high probe, in a few words."""
    parts = []
    if unstable["high_error_rate"].met or unstable["server_died"].met:
        parts.append(f"failed ({_classes(high)})")
    if unstable["timeout_share"].met:
        parts.append(f"timed out {high.timeouts} times")
    stuck = unstable.get("stuck_tool_calls")
    if stuck is not None and stuck.met:
        parts.append(f"left {high.stuck_tool_calls} tool calls hanging")
    if unstable["dispersion_growth"].met and falling:
        parts.append("had latency spread far wider than at low parallelism, and fell in throughput")
    return " and ".join(parts) or f"failed ({_classes(high)})"


def _contradicting_pairs(
    pairs: list[RatioInterval], interval: RatioInterval, below: float, above: float
) -> list[RatioInterval]:
    """The pairs of blocks whose own interval lies wholly on the other side of the
    threshold's zone from a decided speedup interval (none when it is undecided)."""
    if interval.low >= above:
        return [p for p in pairs if p.high < below]
    if interval.high < below:
        return [p for p in pairs if p.low >= above]
    return []


def _drift_notes(low: ProbeResult, high: ProbeResult) -> list[str]:
    """Where blocks of one parallelism disagree beyond their intervals: the conditions
    changed between them, which pairing cancels (the verdict says so where it did not)."""
    notes = []
    for probe in (low, high):
        blocks = probe.blocks
        if len(blocks) < 2:
            continue
        slowest = min(blocks, key=lambda b: b.rollouts_per_s_ci[1])
        fastest = max(blocks, key=lambda b: b.rollouts_per_s_ci[0])
        if fastest.rollouts_per_s_ci[0] > slowest.rollouts_per_s_ci[1]:
            first, last = (fastest, slowest) if fastest.at < slowest.at else (slowest, fastest)
            notes.append(
                f"throughput at parallelism {probe.parallelism} moved from "
                f"{first.rollouts_per_s:.3g} to {last.rollouts_per_s:.3g} rollouts/s between "
                "its blocks, beyond their intervals: the machine's load or the server changed "
                "during the probes. The speedup compares blocks measured side by side, so a "
                "change between pairs cancels in it."
            )
    return notes


def _accepted_per_s(probe: ProbeResult) -> float:
    """Model calls the endpoint answered per second of the probe's window: one per
    completed rollout."""
    return probe.completed / probe.measured_s if probe.measured_s > 0 else 0.0


def _rate_limited_step(
    low: ProbeResult,
    high: ProbeResult,
    limited: dict[str, Evidence],
    instability: list[Evidence],
) -> str:
    """What to do about a rate limit, with the rate it was measured to accept.

    The higher of the two probes' accepted rates estimates the limit: at the high
    probe's fixed parallelism, refused calls retrying together can keep a limit that
    counts every attempt tripped, so it may accept far less than the limit allows.
    """
    best = max((low, high), key=_accepted_per_s)
    accepted = _accepted_per_s(best)
    if not limited["refusal_share"].met and not limited["rate_limit_failures"].met:
        # only the client's own limiter waited
        return (
            f"the client's own --rpm/--tpm limit holds requests back (about {accepted:.3g} "
            "requests/s accepted): raise it if the endpoint allows more."
        )
    refused = high.rate_limited_responses / high.measured_s if high.measured_s > 0 else 0.0
    step = (
        f"the endpoint accepts about {accepted:.3g} requests/s ({best.rollouts_per_s:.3g} "
        f"rollouts/s at parallelism {best.parallelism}; at {high.parallelism} it refused "
        f"{refused:.3g} requests/s with HTTP 429): raise the limit with the provider, or "
        f"set --rpm {max(1, int(accepted * 60 * 0.9))} (90% of it) so requests queue in the "
        "client instead of failing and backing off. `autotune collect` also backs its "
        "concurrency off on 429s by itself (adaptive concurrency)."
    )
    if instability:
        step += f" Other failures exceed the error limit too ({_classes(high)}): check the server."
    return step


def _saturated_stage(
    low: ProbeResult,
    high: ProbeResult,
    verifier: dict[str, Evidence],
    model: dict[str, Evidence],
    environment: dict[str, Evidence],
) -> tuple[str, list[Evidence], str]:
    """Which stage's saturation was measured (most evidence met); ties go to where
    latency grew most."""

    def growth(*stages: str) -> float:
        return sum((_mean(high, s) or 0.0) - (_mean(low, s) or 0.0) for s in stages)

    candidates = {  # stage: (evidence met, latency growth)
        "model-bound": (_count_met(model), growth("model")),
        "verifier-bound": (_count_met(verifier), growth("verify_wait", "verify")),
    }
    if environment:  # only rollouts that call tools have an environment stage
        candidates["environment-bound"] = (_count_met(environment), growth("tool"))
    saturated = max(candidates, key=lambda stage: candidates[stage])
    if saturated == "environment-bound":
        tool_s = _mean(high, "tool") or 0.0
        return (
            "environment-bound",
            list(environment.values()),
            f"the tools are the limit near {high.rollouts_per_s:.3g} rollouts/s (each rollout "
            f"spends {tool_s * 1000:.0f} ms in tool calls at parallelism {high.parallelism}): "
            "give the resources server more workers or replicas, or make its tools cheaper; "
            "more parallelism only lengthens the queue at the tools.",
        )
    if saturated == "verifier-bound":
        per_worker = 1 / high.latency_s["verify"].mean if high.latency_s["verify"].mean else 0.0
        return (
            "verifier-bound",
            list(verifier.values()),
            (
                f"add verifier workers (--verifier-workers, now {high.verifier_capacity}): "
                f"each adds about {per_worker:.3g} rollouts/s (one worker verifies one rollout "
                f"per {(high.latency_s['verify'].mean or 0) * 1000:.0f} ms), "
                "or make the verifier cheaper."
            ),
        )
    kv = model.get("server/vllm:kv_cache_usage_perc max")
    step = (
        f"the model server is saturated near {high.rollouts_per_s:.3g} rollouts/s: raise "
        "max_num_seqs (vLLM --max-num-seqs) if the GPU has room, or add a replica; "
        "run `autotune sweep` over the server's knobs."
    )
    if kv is not None and kv.met:
        step += (
            " The KV cache is full: raise --gpu-memory-utilization or "
            "--tensor-parallel-size before max_num_seqs."
        )
    return "model-bound", list(model.values()), step


def _count_met(evidence: dict[str, Evidence]) -> int:
    return sum(e.met for e in evidence.values())


def _notes(low: ProbeResult, high: ProbeResult) -> list[str]:
    notes = []
    for probe in (low, high):
        check = probe.token_check
        if check and check.get("mismatch"):
            notes.append(
                f"at parallelism {probe.parallelism} the client counted "
                f"{check['client_tokens_per_s']:.0f} output tokens/s but the server's "
                f"vllm:generation_tokens_total says {check['server_tokens_per_s']:.0f} "
                f"({check['relative_difference']:.0%} apart; over 10% and over the "
                "rate's own 95% interval)."
            )
        if probe.stop_reason.startswith("time cap"):
            lo, hi = probe.rollouts_per_s_ci
            notes.append(
                f"the probe at parallelism {probe.parallelism} hit its time cap before its "
                f"interval reached its precision target (95% CI {lo:.3g}–{hi:.3g} rollouts/s)."
            )
    for probe in (low, high):
        if probe.tool_errors:
            notes.append(
                f"at parallelism {probe.parallelism}, {probe.tool_errors} of "
                f"{probe.tool_calls} tool calls answered an error status; unless "
                "--tool-errors fail was given, each went back to the model as its output, as "
                "NeMo Gym's agent does, and the rollout went on."
            )
    for name, reason in high.telemetry_unavailable.items():
        notes.append(f"{name}: {reason}")
    return notes + _replica_notes(high)


REPLICA_FAILING_SHARE = 0.05  # of a replica's calls failed, while every other's stayed under
REPLICA_QUEUE = 1.0  # requests waiting on average: a replica with a queue the others lack
REPLICA_SLOWER = 1.5  # mean call latency this many times the other replicas' slowest


def _replica_notes(high: ProbeResult) -> list[str]:
    """Names the one replica that failed or was saturated while the others were not (a
    problem of every replica is the server's and the verdict's, not a replica's)."""
    replicas = high.replicas
    if len(replicas) < 2:
        return []

    def failing(replica: ReplicaStats) -> bool:
        calls = replica.completed + replica.failed
        share = replica.failed / calls if calls else 0.0
        return not replica.up or replica.times_down > 0 or share > REPLICA_FAILING_SHARE

    def queued(replica: ReplicaStats) -> bool:
        return replica.server.get("waiting", 0.0) >= REPLICA_QUEUE

    notes = []
    if len(bad := [r for r in replicas if failing(r)]) == 1:
        replica = bad[0]
        out = f"; taken out of rotation ({replica.down_reason})" if replica.down_reason else ""
        notes.append(
            f"replica {replica.url} failed {replica.failed:,} of "
            f"{replica.completed + replica.failed:,} calls at parallelism {high.parallelism}"
            f"{out}, the others none to speak of: the run's figures are those of the "
            "replicas left; check that server."
        )
    if len(full := [r for r in replicas if queued(r)]) == 1:
        replica = full[0]
        notes.append(
            f"replica {replica.url} is saturated at parallelism {high.parallelism}: "
            f"{replica.server['waiting']:.1f} requests waiting on average, the others none; "
            "it has fewer slots or a slower GPU than its peers (compare their "
            "--max-num-seqs and GPUs)."
        )
    timed = [(r.mean_latency_s, r) for r in replicas if r.mean_latency_s is not None and r.up]
    if len(timed) >= 2 and not full:
        slowest, replica = max(timed, key=lambda pair: pair[0])
        others = max(latency for latency, other in timed if other is not replica)
        if others and slowest >= REPLICA_SLOWER * others:
            notes.append(
                f"replica {replica.url} answers {slowest / others:.1f}× slower "
                f"than the other replicas at parallelism {high.parallelism}, so it gets "
                "fewer calls; it has a slower GPU, a smaller batch or other work on it."
            )
    return notes


def tail_bound(batch: BatchSummary, pair: Verdict, th: Thresholds | None = None) -> Verdict:
    """`tail-bound` when the batch steps spend a large share waiting on stragglers while
    the server idles (both sure over the steps: the tail share's interval above its
    threshold, the busy share's during the tail below its own), else the pair's verdict
    with this evidence beside it."""
    th = th or Thresholds()
    tails = [s.tail_share for s in batch.steps if s.tail_share is not None]
    idle = [s.tail_busy_share for s in batch.steps if s.tail_busy_share is not None]
    tail_ci, busy_ci = mean_interval(tails), mean_interval(idle)
    if tail_ci is None or busy_ci is None:
        return pair
    tail, busy = sum(tails) / len(tails), sum(idle) / len(idle)
    evidence = [
        Evidence(
            "tail share of a step (95% low)",
            tail_ci[0],
            th.tail_share,
            ">=",
            tail_ci[0] >= th.tail_share,
            "the step waits on its last 10% of samples for this share of its time",
            "share",
        ),
        Evidence(
            "server busy during the tail (95% high)",
            busy_ci[1],
            th.tail_busy_share,
            "<",
            busy_ci[1] < th.tail_busy_share,
            f"running requests ÷ {batch.capacity} ({batch.busy_source}'s count) while "
            "the stragglers finish",
            "share",
        ),
    ]
    if not all(e.met for e in evidence):
        return replace(pair, evidence=[*pair.evidence, *evidence])
    faster = 1 / (1 - tail) if tail < 1 else math.inf
    step = (
        f"Each step of {batch.batch_groups} groups waits {tail:.0%} of its time on stragglers "
        f"while the server runs {busy:.0%} of its capacity: without that tail steps would "
        f"be up to ×{faster:.2f} faster. Measure the remedies with `autotune collect "
        f"--batch-groups {batch.batch_groups}` and `--over-sample 0.5` (cancels the last "
        "groups: DAPO-style over-sampling), `--carry-over` (partial rollouts: stragglers "
        f"finish in the next step, at a staleness cost) or a larger batch (`--batch-groups "
        f"{2 * batch.batch_groups}`), or run `make bench-groups` to see all of them."
    )
    low, high = tail_ci
    return Verdict(
        "tail-bound",
        False,
        pair.speedup,
        pair.parallelism_ratio,
        evidence,
        step,
        pair.notes,
        speedup_interval=pair.speedup_interval,
        clear_of_threshold=True,
        confidence=f"sure: the tail share's 95% interval {low:.0%}–{high:.0%} over "
        f"{len(tails)} steps lies above {th.tail_share:.0%}",
    )
