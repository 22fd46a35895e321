"""The verdict rules on hand-made probe results (pure: no server, no timing)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autotune.diagnose.checks import CHECKS, VERDICTS, Check, Pair, speedup_interval
from autotune.diagnose.classify import classify
from autotune.results.diagnosis import Thresholds
from autotune.results.probes import ProbeBlock, ProbeResult, RateCheck
from autotune.results.stages import STAGES, StageLatency


def probe(
    parallelism: int,
    rate: float,
    *,
    model_s: float = 1.0,
    verify_s: float = 0.001,
    verify_wait_s: float = 0.0,
    **changes: Any,
) -> ProbeResult:
    latency = {stage: StageLatency(100, 0.0, 0.0, 0.0) for stage in STAGES}
    latency["model"] = StageLatency(100, model_s, model_s, model_s * 1.2)
    latency["verify"] = StageLatency(100, verify_s, verify_s, verify_s)
    latency["verify_wait"] = StageLatency(100, verify_wait_s, verify_wait_s, verify_wait_s)
    base = ProbeResult(
        parallelism=parallelism, rollouts_per_s=rate, rollouts_per_s_ci=(rate * 0.97, rate * 1.03),
        output_tokens_per_s=rate * 100, error_rate=0.0, completed=100, failed=0, measured_s=5.0,
        warmup_s=1.0, stop_reason="converged", latency_s=latency, errors_by_class={},
        rate_limited_responses=0, retry_after_seen=0, limiter_wait_share=0.0,
        verifier_capacity=None, verifier_busy_fraction=0.0, verifier_capacity_rps=None,
        telemetry={}, telemetry_unavailable={},
        token_check=None,
    )  # fmt: skip
    return replace(base, **changes)


def interval(parallelism: int, rate: float, halfwidth: float, **changes: Any) -> ProbeResult:
    """A probe whose 95% interval is rate ± `halfwidth` (a share), from 10 batches."""
    spread = (rate * (1 - halfwidth), rate * (1 + halfwidth))
    return probe(parallelism, rate, rollouts_per_s_ci=spread, batches=10, **changes)


def test_threshold_scales_with_the_parallelism_ratio() -> None:
    th = Thresholds()
    assert th.parallelism_bound_speedup(4) == 2.0  # the NeMo Gym guide: 2× for 4×
    assert th.parallelism_bound_speedup(2) < 2.0
    precise = classify(interval(10, 10, 0.005), interval(20, 14, 0.005))
    assert precise.verdict == "parallelism-bound"  # 1.4 ≥ 1.33 (and its 3% margin)
    assert classify(probe(5, 10), probe(20, 14), th).leaning  # 1.4 < 2 for 4×


def test_flat_throughput_with_saturated_client_is_client_bound() -> None:
    busy = {
        "client/cpu_fraction": {"mean": 0.97, "max": 1.0},
        "client/loop_lag_ms": {"mean": 80.0, "max": 200.0},
    }
    verdict = classify(probe(5, 100), probe(20, 105, telemetry=busy))
    assert verdict.verdict == "client-bound"
    assert any(e.name.startswith("client CPU") and e.met for e in verdict.evidence)


def test_a_starved_but_idle_client_is_not_blamed() -> None:
    starved = {
        "client/cpu_fraction": {"mean": 0.2, "max": 0.3},
        "client/loop_lag_ms": {"mean": 400.0, "max": 900.0},
    }
    verdict = classify(probe(5, 10, model_s=0.5), probe(20, 10.2, model_s=1.95, telemetry=starved))
    assert verdict.verdict == "model-bound"


def test_scaling_wins_over_a_busy_client() -> None:
    busy = {
        "client/cpu_fraction": {"mean": 0.97, "max": 1.0},
        "client/loop_lag_ms": {"mean": 80.0, "max": 200.0},
    }
    assert classify(probe(5, 10), probe(20, 39, telemetry=busy)).verdict == "parallelism-bound"


def test_flat_with_verifier_busy_is_verifier_bound() -> None:
    low = probe(
        5,
        20,
        verify_s=0.05,
        verifier_capacity=1,
        verifier_busy_fraction=0.9,
        verifier_capacity_rps=20.0,
    )
    high = probe(
        20,
        21,
        verify_s=0.05,
        verify_wait_s=0.8,
        verifier_capacity=1,
        verifier_busy_fraction=0.99,
        verifier_capacity_rps=20.0,
    )
    verdict = classify(low, high)
    assert verdict.verdict == "verifier-bound" and not verdict.leaning
    assert "each adds about 20 rollouts/s" in verdict.next_step


def test_flat_with_growing_model_latency_is_model_bound() -> None:
    verdict = classify(probe(5, 10, model_s=0.5), probe(20, 10.5, model_s=1.9))
    assert verdict.verdict == "model-bound"
    little = next(e for e in verdict.evidence if e.name.startswith("model latency growth"))
    assert little.met and 0.9 < little.value < 1.1


def test_errors_make_it_unstable_before_anything_else() -> None:
    failing = probe(20, 0.0, error_rate=0.6, errors_by_class={"connection": 30})
    verdict = classify(probe(5, 10), failing)
    assert verdict.verdict == "unstable"
    assert "lower parallelism" in verdict.next_step


def test_429s_are_rate_limited() -> None:
    verdict = classify(probe(5, 10), probe(20, 11, rate_limited_responses=4, retry_after_seen=4))
    assert verdict.verdict == "rate-limited"


def test_rate_limited_failures_are_rate_limited_whatever_their_share() -> None:
    # Seen: a high probe whose failures were nearly all 429s was called unstable.
    high = probe(
        20, 8.0, completed=40, failed=123, measured_s=5.0, error_rate=123 / 163,
        errors_by_class={"rate_limited": 121, "timeout": 2}, rate_limited_responses=480,
    )  # fmt: skip
    verdict = classify(probe(5, 6.0, completed=30, measured_s=5.0), high)
    assert verdict.verdict == "rate-limited"
    assert "accepts about 8 requests/s" in verdict.next_step  # 40 answered in 5 s
    assert "--rpm 432" in verdict.next_step  # 90% of 8/s, per minute
    assert "check the server" not in verdict.next_step  # 2 timeouts of 163 are noise
    assert "out of memory" not in verdict.next_step
    sunk = next(e for e in verdict.evidence if e.name.startswith("rollouts failed on rate"))
    assert sunk.met and sunk.value == 121


def test_rate_limits_do_not_hide_other_failures() -> None:
    high = probe(
        20, 8.0, completed=40, failed=60, error_rate=0.6,
        errors_by_class={"rate_limited": 30, "http_5xx": 30}, rate_limited_responses=90,
    )  # fmt: skip
    verdict = classify(probe(5, 10), high)
    assert verdict.verdict == "rate-limited"
    assert "Other failures exceed the error limit too" in verdict.next_step
    other = next(e for e in verdict.evidence if e.name.startswith("high probe error rate"))
    assert other.met and abs(other.value - 0.3) < 1e-9  # the 5xx half of the failures


def test_a_server_that_died_is_unstable_even_with_429s() -> None:
    died = probe(
        20, 0.0, error_rate=0.6, errors_by_class={"connection": 30}, rate_limited_responses=10,
        stop_reason="server died",
    )  # fmt: skip
    assert classify(probe(5, 10), died).verdict == "unstable"


def test_the_limit_is_estimated_from_the_probe_that_got_most_through() -> None:
    # At a fixed high parallelism, retries of refused calls can keep an attempt-counting
    # limit tripped: the low probe saw more of what the endpoint accepts.
    low = probe(2, 14.0, completed=70, measured_s=5.0, rate_limited_responses=5)
    high = probe(
        16, 3.0, completed=15, failed=40, measured_s=5.0, error_rate=40 / 55,
        errors_by_class={"rate_limited": 40}, rate_limited_responses=200,
    )  # fmt: skip
    verdict = classify(low, high)
    assert verdict.verdict == "rate-limited"
    assert "accepts about 14 requests/s" in verdict.next_step
    assert "at 16 it refused 40 requests/s" in verdict.next_step


def test_only_the_clients_own_limiter_says_so() -> None:
    verdict = classify(probe(5, 10), probe(20, 11, limiter_wait_share=0.5))
    assert verdict.verdict == "rate-limited"
    assert "the client's own --rpm/--tpm limit" in verdict.next_step


def test_token_mismatch_is_reported() -> None:
    check = {
        "client_tokens_per_s": 1000.0,
        "server_tokens_per_s": 700.0,
        "relative_difference": 0.3,
        "mismatch": 1.0,
    }
    verdict = classify(probe(5, 10), probe(20, 39, token_check=check))
    assert any("over 10%" in note for note in verdict.notes)
    assert not any("requests/s" in note for note in verdict.notes)
    requests = {
        **check,
        "mismatch": 0.0,
        "client_requests_per_s": 30.1,
        "server_requests_per_s": 14.8,
        "requests_relative_difference": 0.51,
        "requests_mismatch": 1.0,
    }
    verdict = classify(probe(5, 10, token_check=requests), probe(20, 39))
    (note,) = [note for note in verdict.notes if "requests/s" in note]
    assert "30.1 completions/s" in note and "14.8 requests/s" in note


def test_a_block_whose_two_rates_disagree_says_so() -> None:
    disagree = RateCheck((11.9, 11.1, 12.7), (22.3, 22.1, 22.4), 176, "neither: they disagree")
    uncounted = RateCheck((0.5, 0.4, 0.6), None, 7, "tokens")
    slow = block(10, 35, rate_check=disagree)
    high = blocked(20, slow, block(30, 35, rate_check=uncounted))
    notes = classify(blocked(5, block(0, 10), block(20, 10)), high).notes
    assert any("disagree beyond their intervals" in note and "176 completions" in note
               for note in notes)  # fmt: skip
    assert any("too few completions (7)" in note for note in notes)


def test_the_interval_decides_not_the_point() -> None:
    """The same speedup, ×2.2 for ×4 parallelism: a clear verdict when both probes are
    precise, `inconclusive` between the two verdicts when their intervals are wide."""
    precise = classify(interval(5, 10, 0.02), interval(20, 22, 0.02))
    assert precise.verdict == "parallelism-bound" and precise.clear_of_threshold
    assert precise.speedup_interval is not None
    assert 2.0 * 1.03 < precise.speedup_interval[0] < 2.2 < precise.speedup_interval[1]
    assert "lies above the parallelism-bound threshold ×2.00" in precise.confidence

    wide = classify(interval(5, 10, 0.15), interval(20, 22, 0.15, model_s=3.6))
    assert wide.verdict == "inconclusive" and wide.clear_of_threshold is False
    assert wide.between == ["parallelism-bound", "model-bound"]
    assert wide.speedup_interval is not None
    assert wide.speedup_interval[0] < 2.0 < wide.speedup_interval[1]
    assert "rerun with a larger --max-s" in wide.next_step
    assert "reaches across the 3% margin" in wide.confidence


def test_a_speedup_on_the_threshold_is_inconclusive_however_precise() -> None:
    """Within the margin around ×2.00 no probe length puts it on either side: the next
    step is a sweep, not a longer probe."""
    on_it = classify(interval(5, 10, 0.005), interval(20, 20.2, 0.005, model_s=2.0))
    assert on_it.verdict == "inconclusive"
    assert "lies within 3% of the parallelism-bound threshold" in on_it.confidence
    assert on_it.next_step.startswith("run `autotune sweep`")


def test_an_interval_below_the_threshold_names_the_stage_and_says_how_sure() -> None:
    flat = classify(interval(5, 10, 0.05, model_s=0.5), interval(20, 10.5, 0.05, model_s=1.9))
    assert flat.verdict == "model-bound" and not flat.leaning and flat.clear_of_threshold
    assert "barely moved" in flat.confidence
    # ×1.5: clearly not parallelism-bound, but the interval is above 'barely moved'.
    partial = classify(interval(5, 10, 0.03, model_s=0.5), interval(20, 15, 0.03, model_s=1.3))
    assert partial.verdict == "model-bound" and partial.leaning and partial.clear_of_threshold
    assert "the saturation is partial" in partial.confidence


def test_timeouts_in_the_high_probe_are_instability() -> None:
    verdict = classify(probe(5, 10), probe(20, 20, timeouts=9, completed=100))
    assert verdict.verdict == "unstable"
    timeouts = next(e for e in verdict.evidence if e.name.startswith("timed-out model calls"))
    assert timeouts.met and timeouts.value == 0.09
    assert "timed out 9 times" in verdict.next_step
    assert verdict.confidence.startswith("decided by the failures and latencies measured")


def tail(parallelism: int, rate: float, p50: float, p95: float, **changes: Any) -> ProbeResult:
    latency = {**probe(1, 1).latency_s, "total": StageLatency(100, p50, p50, p95)}
    return probe(parallelism, rate, latency_s=latency, latency_cv=p95 / p50 / 3, **changes)


def test_a_latency_tail_with_falling_throughput_is_instability() -> None:
    steady = classify(tail(5, 10, 1.0, 1.5), tail(20, 30, 1.3, 2.0))
    assert steady.verdict == "parallelism-bound"  # ×1.5 at both: a tail that did not grow
    falling = classify(tail(5, 10, 1.0, 1.5), tail(20, 7, 1.3, 6.5))
    assert falling.verdict == "unstable"
    grew = next(e for e in falling.evidence if e.name.startswith("rollout latency spread"))
    assert grew.met and abs(grew.value - 5.0 / 1.5) < 1e-9
    assert "latency spread far wider" in falling.next_step


def test_a_latency_tail_alone_never_outweighs_throughput_that_scales() -> None:
    # Seen on real vLLM: ×3.29 for ×4 parallelism while p95/p50 went 1.4 → 6.7 (the tail
    # of continuous batching), called `unstable` with advice to halve parallelism.
    verdict = classify(tail(5, 10, 1.0, 1.4), tail(20, 32.9, 1.2, 8.0))
    assert verdict.verdict == "parallelism-bound"
    note = next(n for n in verdict.notes if n.startswith("latency: p95/p50 grew"))
    assert "×4.76" in note and "not instability" in note
    assert classify(tail(5, 10, 1.0, 1.4), tail(20, 32.9, 1.2, 1.5)).notes == []


def block(
    at: float,
    rate: float,
    halfwidth: float = 0.1,
    p50: float = 1.0,
    p95: float = 1.5,
    rate_check: RateCheck | None = None,
) -> ProbeBlock:
    spread = (rate * (1 - halfwidth), rate * (1 + halfwidth))
    return ProbeBlock(at, rate, spread, 8, 5.0, p50, p95, rate_check=rate_check)


def blocked(parallelism: int, *blocks: ProbeBlock, **changes: Any) -> ProbeResult:
    """A probe measured in `blocks` (its pooled figures: their mean)."""
    rate = sum(b.rollouts_per_s for b in blocks) / len(blocks)
    return interval(parallelism, rate, 0.07, blocks=list(blocks), **changes)


def test_paired_blocks_cancel_a_load_change_between_them() -> None:
    # The machine slowed ×2 between the first pair and the second: each pair still
    # scales ×3.5, so the verdict stands, and the change is named.
    low = blocked(5, block(0, 10), block(20, 5))
    high = blocked(20, block(10, 35), block(30, 17.5))
    verdict = classify(low, high)
    assert verdict.verdict == "parallelism-bound" and verdict.clear_of_threshold
    assert abs(verdict.speedup - 3.5) < 1e-9
    assert "parallelism 5 10 → 5 rollouts/s; parallelism 20 35 → 17.5" in verdict.confidence
    paired = speedup_interval(low, high)
    assert paired.low > 2.9 and paired.high < 4.2  # one ±10% pair a side of the change


def test_a_load_change_within_a_pair_rests_on_the_pair_measured_after_it() -> None:
    # The machine slowed ×2 as the first high block started: that pair says ×1.75, the
    # second ×3.5. The old order (one low, then one high) would call it model-bound.
    old_order = classify(interval(5, 10, 0.05), interval(20, 17.5, 0.05))
    assert old_order.verdict == "model-bound" and old_order.clear_of_threshold  # and wrong
    low = blocked(5, block(0, 10, 0.05), block(20, 5, 0.05))
    high = blocked(20, block(10, 17.5, 0.05), block(30, 17.5, 0.05))
    verdict = classify(low, high)
    assert verdict.verdict == "parallelism-bound" and abs(verdict.speedup - 3.5) < 1e-9
    assert "the load changed during the probes" in verdict.confidence
    assert "(pair 2)" in verdict.confidence
    # The pairs agreeing, the same figures decide, and nothing is said of a change.
    steady = classify(
        blocked(5, block(0, 10), block(20, 10)), blocked(20, block(10, 35), block(30, 35))
    )
    assert steady.verdict == "parallelism-bound" and "load changed" not in steady.confidence


def test_a_load_change_no_pair_escapes_leaves_the_verdict_inconclusive() -> None:
    # Each pair on one side of the change says another thing (×3.5 before, ×1.0 after):
    # no placement of the change lets the pairs agree.
    low = blocked(5, block(0, 10, 0.05), block(20, 5, 0.05))
    high = blocked(20, block(10, 35, 0.05), block(30, 5, 0.05))
    verdict = classify(low, high)
    assert verdict.verdict == "inconclusive" and not verdict.clear_of_threshold
    assert "the load changed during the probes" in verdict.confidence
    assert "quiet" in verdict.next_step


SPEEDUPS = {"parallelism-bound": 3.5, "model-bound": 1.05}


def planted(speedup: float, factor: float, where: str) -> tuple[ProbeResult, ProbeResult]:
    """Four blocks (low, high, low, high at 0, 10, 20, 30 s) of a server whose throughput
    at 20 is `speedup` × that at 5 (10 rollouts/s), slowed ×`factor` at a place: before
    or inside a block (then its rate is the two loads' mean), or between the pairs."""
    change = {"before-high": 5, "inside-high-1": 10, "between-pairs": 15, "inside-low-2": 20,
              "last-block": 30}[where]  # fmt: skip

    def rate(at: float, base: float) -> float:
        slow = base / factor
        return (base + slow) / 2 if at == change else (base if at < change else slow)

    low = blocked(5, block(0, rate(0, 10), 0.05), block(20, rate(20, 10), 0.05))
    high = blocked(
        20, block(10, rate(10, 10 * speedup), 0.05), block(30, rate(30, 10 * speedup), 0.05)
    )
    return low, high


@pytest.mark.parametrize("where", ["before-high", "inside-high-1", "between-pairs",
                                   "inside-low-2", "last-block"])  # fmt: skip
@pytest.mark.parametrize("truth", sorted(SPEEDUPS))
@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_a_planted_load_change_never_decides_wrong(truth: str, factor: float, where: str) -> None:
    """Wherever a slowdown falls, the verdict is right or inconclusive; where the change
    falls between blocks, a pair on one side of it decides, and so does the verdict."""
    verdict = classify(*planted(SPEEDUPS[truth], factor, where))
    assert verdict.verdict in (truth, "inconclusive"), verdict.confidence
    if where in ("before-high", "between-pairs", "last-block"):
        assert verdict.verdict == truth, verdict.confidence
    assert "load changed" in verdict.confidence


def test_a_tail_counts_only_where_every_pair_of_blocks_shows_it() -> None:
    # One high block's tail grew ×4 (a busy moment), the other's did not: no tail growth.
    low = blocked(5, block(0, 10), block(20, 10))
    high = blocked(20, block(10, 8, p95=6.0), block(30, 8, p95=1.6))
    pair = Pair(low, high, Thresholds())
    assert abs(pair.dispersion_growth - 1.6 / 1.5) < 1e-9
    both = blocked(20, block(10, 8, p95=6.0), block(30, 8, p95=4.5))
    assert abs(Pair(low, both, Thresholds()).dispersion_growth - 3.0) < 1e-9


def test_evidence_is_rounded_to_what_it_means() -> None:
    verdict = classify(probe(5, 10), probe(20, 11, rate_limited_responses=4, completed=305))
    share = next(e for e in verdict.evidence if e.name.startswith("HTTP 429"))
    assert share.summary() == (
        "HTTP 429 responses per rollout in the high probe's window = 1.3% (threshold >= 1%)"
    )


def with_tools(parallelism: int, rate: float, *, tool_s: float, model_s: float) -> ProbeResult:
    """A multi-turn probe: rollouts spend `tool_s` in tool calls and `model_s` in the model."""
    result = probe(parallelism, rate, model_s=model_s)
    total = tool_s + model_s
    latency = {
        **result.latency_s,
        "tool": StageLatency(100, tool_s, tool_s, tool_s),
        "total": StageLatency(100, total, total, total),
    }
    return replace(result, latency_s=latency)


def test_flat_with_tool_calls_queueing_is_environment_bound() -> None:
    verdict = classify(
        with_tools(5, 10, tool_s=0.4, model_s=0.1), with_tools(20, 10.5, tool_s=1.8, model_s=0.1)
    )
    assert verdict.verdict == "environment-bound" and not verdict.leaning
    met = {e.name for e in verdict.evidence if e.met}
    assert met == {
        "tool latency growth ÷ Little's-law prediction",
        "share of rollout time in tool calls (high probe)",
    }
    assert "resources server more workers or replicas" in verdict.next_step


def test_tools_that_keep_up_leave_a_saturated_model_to_blame() -> None:
    verdict = classify(
        with_tools(5, 10, tool_s=0.1, model_s=0.4), with_tools(20, 10.5, tool_s=0.1, model_s=1.8)
    )
    assert verdict.verdict == "model-bound"
    tools = [e for e in verdict.evidence if "tool" in e.name]
    assert tools == []  # the model's evidence is cited, the environment's is not


def edge_probe(
    parallelism: int,
    rate: float,
    *,
    tool_s: float = 1.0,
    p95: float = 1.5,
    **changes: Any,
) -> ProbeResult:
    """A multi-turn probe for the edge cases: 1 s in the model and `tool_s` in tools per
    rollout, whose whole latency has a mean of 2 s, a p50 of 1 s and a p95 of `p95`."""
    result = probe(parallelism, rate, **changes)
    latency = {
        **result.latency_s,
        "tool": StageLatency(100, tool_s, tool_s, tool_s),
        "total": StageLatency(100, 2.0, 1.0, p95),
    }
    return replace(result, latency_s=latency)


def at(low: dict[str, Any] | None = None, **high: Any) -> tuple[ProbeResult, ProbeResult]:
    """A pair at ×4 parallelism for no more throughput (so Little's law predicts ×4 latency
    for a saturated stage): edge probes with the low and high probes' `changes`."""
    return edge_probe(5, 10, **(low or {})), edge_probe(20, 10, **high)


def seen(series: str, stat: str, value: float) -> tuple[ProbeResult, ProbeResult]:
    """A pair whose high probe's telemetry measured one figure."""
    return at(telemetry={series: {stat: value}})


# Each check by hand, at its default threshold: in the first pair its figure lies on the
# threshold or just past it and meets the check, in the second just short of it.
EDGES: list[tuple[str, tuple[ProbeResult, ProbeResult], tuple[ProbeResult, ProbeResult]]] = [
    ("high probe error rate (rate limits aside)",  # > 5%
     at(error_rate=0.051), at(error_rate=0.05)),
    ("high probe stopped because the server died",
     at(stop_reason="server died"), at(stop_reason="time cap")),
    ("low probe error rate (rate limits aside)",  # > 5%
     at({"error_rate": 0.051}), at({"error_rate": 0.05})),
    ("timed-out model calls per rollout in the high probe",  # > 2 in 100
     at(timeouts=3), at(timeouts=2)),
    ("tool calls hanging when the high probe ended",  # > 0
     at(tool_calls=90, stuck_tool_calls=1), at(tool_calls=90, stuck_tool_calls=0)),
    ("rollout latency spread growth (p95/p50, high ÷ low)",  # 1.5 at low; ≥ ×2
     at(p95=3.0), at(p95=2.9)),
    ("HTTP 429 responses per rollout in the high probe's window",  # ≥ 1 in 100
     at(rate_limited_responses=1), at(rate_limited_responses=1, completed=101)),
    ("rollouts failed on rate limits in the high probe",
     at(errors_by_class={"rate_limited": 1}), at(errors_by_class={"connection": 1})),
    ("share of slot time waiting on the client's --rpm/--tpm limiter",  # ≥ 20%
     at(limiter_wait_share=0.2), at(limiter_wait_share=0.19)),
    ("client CPU (cores) during the high probe",  # ≥ 0.85
     seen("client/cpu_fraction", "mean", 0.85), seen("client/cpu_fraction", "mean", 0.84)),
    ("client event-loop lag, ms (mean)",  # ≥ 50 ms
     seen("client/loop_lag_ms", "mean", 50), seen("client/loop_lag_ms", "mean", 49.9)),
    ("verifier workers busy (fraction)",  # ≥ 80%
     at(verifier_capacity=1, verifier_busy_fraction=0.8),
     at(verifier_capacity=1, verifier_busy_fraction=0.79)),
    ("throughput ÷ verifier capacity",  # 10 rollouts/s ≥ 80% of the capacity
     at(verifier_capacity_rps=12.5), at(verifier_capacity_rps=12.6)),
    ("verifier queue wait growth (high ÷ low)",  # 10 ms at low; ≥ ×2
     at({"verify_wait_s": 0.01}, verify_wait_s=0.02),
     at({"verify_wait_s": 0.01}, verify_wait_s=0.019)),
    ("model latency growth ÷ Little's-law prediction",  # 1 s at low; ≥ 60% of ×4
     at(model_s=2.44), at(model_s=2.36)),
    ("server requests waiting (mean)",  # ≥ 0.5
     seen("server/vllm:num_requests_waiting", "mean", 0.5),
     seen("server/vllm:num_requests_waiting", "mean", 0.49)),
    ("server KV cache usage (max)",  # ≥ 90%
     seen("server/vllm:kv_cache_usage_perc", "max", 0.9),
     seen("server/vllm:kv_cache_usage_perc", "max", 0.89)),
    ("server preemptions during the probe",  # > 0
     seen("server/vllm:num_preemptions_total", "delta", 1),
     seen("server/vllm:num_preemptions_total", "delta", 0)),
    ("GPU utilisation, % (mean)",  # ≥ 80%
     seen("gpu/gpu_util_pct_mean", "mean", 80), seen("gpu/gpu_util_pct_mean", "mean", 79)),
    ("tool latency growth ÷ Little's-law prediction",  # 1 s at low; ≥ 60% of ×4
     at(tool_s=2.44), at(tool_s=2.36)),
    ("share of rollout time in tool calls (high probe)",  # ≥ half of a 2 s rollout
     at(tool_s=1.0), at(tool_s=0.99)),
]  # fmt: skip


def table() -> list[Check]:
    return [check for checks in CHECKS.values() for check in checks]


def test_every_check_is_named_once_and_keyed_once_in_its_verdict() -> None:
    names = [check.name for check in table()]
    assert len(names) == len(set(names))
    for checks in CHECKS.values():  # a verdict's findings are keyed by metric
        assert len({check.metric for check in checks}) == len(checks)
    assert set(CHECKS) < set(VERDICTS)
    assert {name for name, *_ in EDGES} == set(names)  # a new check needs its edge case


@pytest.mark.parametrize(("name", "meets", "misses"), EDGES, ids=[e[0] for e in EDGES])
def test_each_check_flips_at_its_threshold(
    name: str, meets: tuple[ProbeResult, ProbeResult], misses: tuple[ProbeResult, ProbeResult]
) -> None:
    check = next(check for check in table() if check.name == name)
    met = check.judge(Pair(*meets, Thresholds()))
    missed = check.judge(Pair(*misses, Thresholds()))
    assert met is not None and met.met, met
    assert missed is not None and not missed.met, missed


def test_only_what_the_probes_measured_is_evidence() -> None:
    """A single-turn run with no telemetry, no verifier pool and no queue for a verifier:
    the tools, client, server, GPU and verifier checks have nothing to judge."""
    plain = Pair(probe(5, 10), probe(20, 10), Thresholds())
    measured = {check.name for check in table() if check.judge(plain) is not None}
    always = [*CHECKS["unstable"], *CHECKS["rate-limited"]]
    little = "model latency growth ÷ Little's-law prediction"
    stuck = "tool calls hanging when the high probe ended"
    assert measured == {check.name for check in always if check.name != stuck} | {little}


def test_the_gpu_figure_cited_is_the_high_probes_and_names_its_window() -> None:
    """Seen on an H200: the verdict cited 66.7% with no window, while the probes' means
    printed beside it were 42.8% and 55.4%. The evidence is the high probe's own mean
    over its measured blocks, and says so, with how many NVML readings made it."""
    util = {"gpu/gpu_util_pct_mean": {"mean": 72.1, "max": 91.5, "samples": 25.0}}
    low = blocked(
        4,
        block(0, 10),
        block(20, 10),
        measured_s=21.0,
        telemetry={"gpu/gpu_util_pct_mean": {"mean": 45.7, "max": 90.7, "samples": 42.0}},
    )
    high = blocked(16, block(10, 12), block(30, 12), measured_s=12.5, telemetry=util)
    verdict = classify(low, high)
    cited = next(e for e in verdict.evidence if e.name.startswith("GPU"))
    assert cited.value == 72.1 and cited.value == high.telemetry["gpu/gpu_util_pct_mean"]["mean"]
    assert cited.meaning.startswith(
        "mean of 25 NVML readings over the measured 12.5 s of the probe at parallelism 16 "
        "(2 blocks): "
    )


def test_tools_that_hang_or_fail_point_at_the_environment_not_at_parallelism() -> None:
    hung = classify(*at(tool_calls=90, stuck_tool_calls=3))
    assert hung.verdict == "unstable" and hung.next_step.startswith("fix the environment")
    assert "left 3 tool calls hanging" in hung.next_step
    failing = classify(*at(error_rate=0.2, errors_by_class={"tool_timeout": 20}))
    assert failing.verdict == "unstable" and failing.next_step.startswith("fix the environment")
    # a model server's failures beside the tools' are the model server's to fix first
    mixed = classify(*at(error_rate=0.2, errors_by_class={"tool_timeout": 10, "http_5xx": 10}))
    assert mixed.verdict == "unstable" and mixed.next_step.startswith("lower parallelism")
