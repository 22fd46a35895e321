"""Bottleneck verdicts from a low and a high parallelism probe: pure rules, no I/O.
Throttling, failures and a saturated client are judged first; then scaling decides by the
speedup's 95% interval, and the saturated stage is named. Why, rule by rule:
docs/design/diagnose.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from autotune.diagnose.checks import (
    Pair,
    blocks_agree,
    compare,
    failure_classes,
    judge,
    load_change,
    pair_speedups,
    speedup_interval,
    stage_mean,
)
from autotune.engines import ENGINES
from autotune.results.diagnosis import Evidence, Thresholds, Verdict
from autotune.results.probes import ProbeResult
from autotune.results.runs import BatchSummary
from autotune.results.stages import ReplicaStats
from autotune.stats import (
    RatioInterval,
    mean_interval,
)


def classify(low: ProbeResult, high: ProbeResult, th: Thresholds | None = None) -> Verdict:
    """The verdict for a low/high probe pair, with the evidence that decided it and how
    sure it is."""
    pair = Pair(low, high, th or Thresholds())
    th, ratio, speedup = pair.th, pair.ratio, pair.speedup
    interval = speedup_interval(low, high)
    change = load_change(low, high)
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
        if change is not None and word != "inconclusive":
            confidence = f"{confidence}. Beware: {change.describe()}"
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

    unstable = judge("unstable", pair)
    falling = interval.high < 1  # throughput fell at the higher parallelism, surely
    instability = _instability(unstable, falling)
    notes = _notes(low, high) + (_drift_notes(low, high) if change is None else [])
    spread = unstable.get("dispersion_growth")
    if spread is not None and spread.met and not falling:
        notes.append(
            f"latency: p95/p50 grew ×{spread.value:.2f} from parallelism {low.parallelism} "
            f"to {high.parallelism} ({pair.low_spread} → {pair.high_spread}) while "
            f"throughput did not fall: the tail of continuous batching, not instability. "
            "Take p95 into account if the rollouts have a latency budget."
        )
    limited = judge("rate-limited", pair)
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
    scaling = compare(
        "speedup (high ÷ low throughput)",
        speedup,
        ">=",
        scales_at,
        f"parallelism ×{ratio:.2g}: {low.rollouts_per_s:.3g} → "
        f"{high.rollouts_per_s:.3g} rollouts/s; 95% interval {shown}",
        "×",
    )
    scales = interval.low >= above
    client = list(judge("client-bound", pair).values())
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
    verifier = judge("verifier-bound", pair)
    model = judge("model-bound", pair)
    environment = judge("environment-bound", pair)
    stage, evidence, step = _saturated_stage(low, high, verifier, model, environment)
    pairs = pair_speedups(low, high)
    against = _contradicting_pairs(pairs, interval, below, above) if change is None else []
    if change is not None and interval.low < above and interval.high >= below:
        return verdict(
            "inconclusive",
            [scaling, *evidence],
            "rerun when the machine is quiet: its load (another job, or the server's own) "
            "changed while the probes ran, and the pairs of blocks measured on one side of "
            "the change do not decide the speedup on their own.",
            f"inconclusive — {change.describe()}: wherever the change fell, the speedup's "
            f"95% interval spans {shown}, across the parallelism-bound threshold "
            f"×{scales_at:.2f}",
            clear=False,
            between=("parallelism-bound", stage),
        )
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
        parts.append(f"failed ({failure_classes(high)})")
    if unstable["timeout_share"].met:
        parts.append(f"timed out {high.timeouts} times")
    stuck = unstable.get("stuck_tool_calls")
    if stuck is not None and stuck.met:
        parts.append(f"left {high.stuck_tool_calls} tool calls hanging")
    if unstable["dispersion_growth"].met and falling:
        parts.append("had latency spread far wider than at low parallelism, and fell in throughput")
    return " and ".join(parts) or f"failed ({failure_classes(high)})"


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
        if not blocks_agree(blocks):
            slowest = min(blocks, key=lambda b: b.rollouts_per_s_ci[1])
            fastest = max(blocks, key=lambda b: b.rollouts_per_s_ci[0])
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
        step += (
            f" Other failures exceed the error limit too ({failure_classes(high)}): "
            "check the server."
        )
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
        return sum((stage_mean(high, s) or 0.0) - (stage_mean(low, s) or 0.0) for s in stages)

    candidates = {  # stage: (evidence met, latency growth)
        "model-bound": (_count_met(model), growth("model")),
        "verifier-bound": (_count_met(verifier), growth("verify_wait", "verify")),
    }
    if environment:  # only rollouts that call tools have an environment stage
        candidates["environment-bound"] = (_count_met(environment), growth("tool"))
    saturated = max(candidates, key=lambda stage: candidates[stage])
    if saturated == "environment-bound":
        tool_s = stage_mean(high, "tool") or 0.0
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


MISSING_SERVER_EVIDENCE = (
    "the verdict rests on the client's timings alone: the server's requests running and "
    "waiting, KV-cache use, queue time and token counters are missing, so no check could "
    "cite them."
)


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
        if check and check.get("requests_mismatch"):
            notes.append(
                f"at parallelism {probe.parallelism} the client counted "
                f"{check['client_requests_per_s']:.3g} completions/s but the server finished "
                f"{check['server_requests_per_s']:.3g} requests/s by its own counter "
                f"({check['requests_relative_difference']:.0%} apart; over 10% and over the "
                "rate's own 95% interval)."
            )
        checks = [block.rate_check for block in probe.blocks if block.rate_check]
        for rate_check in checks:
            if rate_check.counted is not None and rate_check.why is not None:
                notes.append(
                    f"at parallelism {probe.parallelism}, a block timed in tokens: "
                    f"{rate_check.why}."
                )
        uncounted = [str(c.completions) for c in checks if c.counted is None]
        if uncounted:
            notes.append(
                f"at parallelism {probe.parallelism}, the blocks timed in tokens held too few "
                f"completions ({', '.join(uncounted)}) to check their token rate by counting."
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
    engine = high.server_engine or low.server_engine
    if engine is not None and engine != "vllm":  # vLLM's names are autotune's own
        notes.append(
            f"server: {ENGINES[engine].title}, told by what it serves; its metrics are read "
            "as autotune's quantities (vLLM's names)."
        )
    for name, reason in high.telemetry_unavailable.items():
        notes.append(f"{name}: {reason}")
        if name == "server":
            notes.append(MISSING_SERVER_EVIDENCE)
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
            f"running requests ÷ {batch.capacity} ({batch.capacity_source}; the "
            f"{batch.busy_source}'s count) while "
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
