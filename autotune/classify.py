"""Bottleneck verdicts from a low and a high parallelism probe: pure rules, no I/O.

Order of the rules: a probe that was throttled (`rate-limited`) or failed (`unstable`)
says nothing about scaling, and a saturated client (`client-bound`) hides the server, so
those are checked first. Refusals for exceeding a rate limit (HTTP 429, and rollouts that
failed on them) make it `rate-limited` however many rollouts they sank, unless the server
died: they are not the server failing, so `unstable` judges the other failures only.
Then scaling decides: throughput that grew about as much as
the NeMo Gym guide asks (2× for 4× parallelism) is `parallelism-bound`; throughput that
barely moved is saturated somewhere, and the stage whose saturation signals were
measured (verifier busy and queueing, or model latency growing as Little's law
predicts, server queueing, KV cache full, GPU busy) is named. In between, the verdict
names what it leans to and says a sweep is the next step.
"""

from __future__ import annotations

from autotune.results import Evidence, ProbeResult, Thresholds, Verdict

RATE_LIMIT_CLASSES = frozenset({"rate_limited"})  # failure classes a rate limit causes

VERDICTS = (
    "parallelism-bound",
    "model-bound",
    "verifier-bound",
    "rate-limited",
    "client-bound",
    "unstable",
)


def _check(name: str, value: float, comparison: str, threshold: float, meaning: str) -> Evidence:
    met = {
        ">=": value >= threshold,
        ">": value > threshold,
        "<": value < threshold,
    }[comparison]
    return Evidence(name, float(value), float(threshold), comparison, met, meaning)


def _metric(probe: ProbeResult, source: str, name: str, stat: str) -> float | None:
    value = probe.telemetry.get(f"{source}/{name}", {}).get(stat)
    return None if value is None else float(value)


def _other_error_rate(probe: ProbeResult) -> float:
    """The probe's error rate without the rollouts a rate limit sank."""
    errors = probe.errors_by_class
    total = sum(errors.values())
    if not total:
        return probe.error_rate
    other = sum(n for cls, n in errors.items() if cls not in RATE_LIMIT_CLASSES)
    return probe.error_rate * other / total


def _instability(low: ProbeResult, high: ProbeResult, th: Thresholds) -> list[Evidence]:
    return [
        _check(
            "high probe error rate (rate limits aside)",
            _other_error_rate(high),
            ">",
            th.max_error_rate,
            f"share of rollouts at parallelism {high.parallelism} that failed ({_classes(high)})",
        ),
        _check(
            "high probe stopped because the server died",
            float(high.stop_reason == "server died"),
            ">=",
            1.0,
            "model calls stopped connecting during the probe",
        ),
        _check(
            "low probe error rate (rate limits aside)",
            _other_error_rate(low),
            ">",
            th.max_error_rate,
            f"share of rollouts at parallelism {low.parallelism} that failed",
        ),
    ]


def _classes(probe: ProbeResult) -> str:
    if not probe.errors_by_class:
        return "no errors"
    return ", ".join(f"{k}: {v}" for k, v in sorted(probe.errors_by_class.items()))


def _rate_limit(high: ProbeResult, th: Thresholds) -> list[Evidence]:
    sunk = sum(n for cls, n in high.errors_by_class.items() if cls in RATE_LIMIT_CLASSES)
    return [
        _check(
            "HTTP 429 responses per rollout in the high probe's window",
            high.rate_limited_responses / max(high.completed + high.failed, 1),
            ">=",
            th.rate_limited_share,
            f"the endpoint refused {high.rate_limited_responses} requests for exceeding its "
            f"rate and sent {high.retry_after_seen} Retry-After headers",
        ),
        _check(
            "rollouts failed on rate limits in the high probe",
            sunk,
            ">",
            0,
            "calls refused for exceeding the rate on every retry, whatever their share",
        ),
        _check(
            "share of slot time waiting on the client's --rpm/--tpm limiter",
            high.limiter_wait_share,
            ">=",
            th.limiter_wait_share,
            "the client's own rate limit holds requests back",
        ),
    ]


def _client(high: ProbeResult, th: Thresholds) -> list[Evidence]:
    evidence = []
    cpu = _metric(high, "client", "cpu_fraction", "mean")
    if cpu is not None:
        evidence.append(
            _check(
                "client CPU (cores) during the high probe",
                cpu,
                ">=",
                th.client_cpu_fraction,
                "the harness's own process is busy",
            )
        )
    lag = _metric(high, "client", "loop_lag_ms", "mean")
    if lag is not None:
        evidence.append(
            _check(
                "client event-loop lag, ms (mean)",
                lag,
                ">=",
                th.client_loop_lag_ms,
                "the harness reacts late to finished I/O",
            )
        )
    return evidence


def _verifier(low: ProbeResult, high: ProbeResult, th: Thresholds) -> list[Evidence]:
    evidence = []
    if high.verifier_capacity is not None and high.verifier_busy_fraction is not None:
        evidence.append(
            _check(
                "verifier workers busy (fraction)",
                high.verifier_busy_fraction,
                ">=",
                th.verifier_busy_fraction,
                f"{high.verifier_capacity} workers verifying nearly all the time",
            )
        )
    if high.verifier_capacity_rps:
        evidence.append(
            _check(
                "throughput ÷ verifier capacity",
                high.rollouts_per_s / high.verifier_capacity_rps,
                ">=",
                th.verifier_capacity_use,
                f"capacity = workers ÷ mean verify time = "
                f"{high.verifier_capacity_rps:.3g} rollouts/s",
            )
        )
    low_wait = low.latency_s["verify_wait"].mean or 0.0
    high_wait = high.latency_s["verify_wait"].mean or 0.0
    if high_wait > 0.005:
        evidence.append(
            _check(
                "verifier queue wait growth (high ÷ low)",
                high_wait / max(low_wait, 1e-4),
                ">=",
                th.verify_wait_growth,
                f"rollouts wait {high_wait * 1000:.0f} ms for a verifier",
            )
        )
    return evidence


def _model(
    low: ProbeResult, high: ProbeResult, speedup: float, ratio: float, th: Thresholds
) -> list[Evidence]:
    evidence = []
    low_model = low.latency_s["model"].mean
    high_model = high.latency_s["model"].mean
    if low_model and high_model:
        predicted = ratio / max(speedup, 1e-9)  # Little's law at fixed in-flight count
        evidence.append(
            _check(
                "model latency growth ÷ Little's-law prediction",
                (high_model / low_model) / predicted,
                ">=",
                th.littles_law_match,
                f"model latency {low_model:.3g} s → {high_model:.3g} s; "
                f"a saturated server predicts ×{predicted:.2f}",
            )
        )
    waiting = _metric(high, "server", "vllm:num_requests_waiting", "mean")
    if waiting is not None:
        evidence.append(
            _check(
                "server requests waiting (mean)",
                waiting,
                ">=",
                th.server_waiting,
                "vLLM queues requests it cannot schedule",
            )
        )
    kv = _metric(high, "server", "vllm:kv_cache_usage_perc", "max")
    if kv is not None:
        evidence.append(
            _check(
                "server KV cache usage (max)", kv, ">=", th.kv_cache_full, "the KV cache is full"
            )
        )
    preemptions = _metric(high, "server", "vllm:num_preemptions_total", "delta")
    if preemptions is not None:
        evidence.append(
            _check(
                "server preemptions during the probe",
                preemptions,
                ">",
                0,
                "sequences were evicted for lack of KV cache",
            )
        )
    gpu = _metric(high, "gpu", "gpu_util_pct_mean", "mean")
    if gpu is not None:
        evidence.append(
            _check(
                "GPU utilisation, % (mean)",
                gpu,
                ">=",
                th.gpu_busy_pct,
                "a kernel ran most of the time",
            )
        )
    return evidence


def classify(low: ProbeResult, high: ProbeResult, th: Thresholds | None = None) -> Verdict:
    """The verdict for a low/high probe pair, with the evidence that decided it."""
    th = th or Thresholds()
    ratio = high.parallelism / low.parallelism
    speedup = high.rollouts_per_s / low.rollouts_per_s if low.rollouts_per_s > 0 else 0.0

    def verdict(word: str, evidence: list[Evidence], step: str, leaning: bool = False) -> Verdict:
        return Verdict(word, leaning, speedup, ratio, evidence, step, _notes(low, high))

    unstable = _instability(low, high, th)
    limited = _rate_limit(high, th)
    if any(e.met for e in limited) and high.stop_reason != "server died":
        return verdict(
            "rate-limited",
            limited + [e for e in unstable if e.met],
            _rate_limited_step(low, high, limited, unstable),
        )
    if any(e.met for e in unstable):
        return verdict(
            "unstable",
            unstable,
            f"lower parallelism: at {high.parallelism} the run failed "
            f"({_classes(high)}); at {low.parallelism} it "
            + (
                "also failed; check the server's log first."
                if unstable[2].met
                else f"held ({low.rollouts_per_s:.3g} rollouts/s). "
                "Check the server's log (out of memory?), then run `autotune sweep` "
                f"with parallelism at most {high.parallelism // 2}."
            ),
        )
    scaling = _check(
        "speedup (high ÷ low throughput)",
        speedup,
        ">=",
        th.parallelism_bound_speedup(ratio),
        f"parallelism ×{ratio:.2g}: {low.rollouts_per_s:.3g} → "
        f"{high.rollouts_per_s:.3g} rollouts/s",
    )
    client = _client(high, th)
    # Both, not either: a lagging loop in an idle process means the OS starved it (a
    # server on the same cores, say), which says nothing about the harness's own cost.
    if not scaling.met and client and all(e.met for e in client):
        return verdict(
            "client-bound",
            [scaling, *client],
            "the harness itself is the limit, not the server: split the run across "
            "processes or machines (`--shard i/N`), use a cheaper verifier, or run "
            "the client on a less loaded machine.",
        )
    if scaling.met:
        return verdict(
            "parallelism-bound",
            [scaling],
            f"raise parallelism above {high.parallelism}: throughput grew "
            f"×{speedup:.2f} for ×{ratio:.2g} parallelism. Run `autotune sweep` "
            "to find the knee and take 80% of the peak.",
        )
    flat = speedup < 1 + th.flat_gain
    verifier = _verifier(low, high, th)
    model = _model(low, high, speedup, ratio, th)
    stage, evidence, step = _saturated_stage(low, high, verifier, model)
    if flat:
        return verdict(stage, [scaling, *evidence], step)
    return verdict(
        stage,
        [scaling, *evidence],
        f"throughput grew ×{speedup:.2f}, between 'barely moved' "
        f"(< ×{1 + th.flat_gain:.2f}) and 'scales' (≥ ×"
        f"{th.parallelism_bound_speedup(ratio):.2f}); it leans to {stage}. "
        f"Run `autotune sweep` next. {step}",
        leaning=True,
    )


def _accepted_per_s(probe: ProbeResult) -> float:
    """Model calls the endpoint answered per second of the probe's window: one per
    completed rollout."""
    return probe.completed / probe.measured_s if probe.measured_s > 0 else 0.0


def _rate_limited_step(
    low: ProbeResult, high: ProbeResult, limited: list[Evidence], unstable: list[Evidence]
) -> str:
    """What to do about a rate limit, with the rate it was measured to accept.

    The higher of the two probes' accepted rates estimates the limit: at the high
    probe's fixed parallelism, refused calls retrying together can keep a limit that
    counts every attempt tripped, so it may accept far less than the limit allows.
    """
    best = max((low, high), key=_accepted_per_s)
    accepted = _accepted_per_s(best)
    if not limited[0].met and not limited[1].met:  # only the client's own limiter waited
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
    if any(e.met for e in unstable):
        step += f" Other failures exceed the error limit too ({_classes(high)}): check the server."
    return step


def _saturated_stage(
    low: ProbeResult, high: ProbeResult, verifier: list[Evidence], model: list[Evidence]
) -> tuple[str, list[Evidence], str]:
    """Which stage's saturation was measured; ties go to where latency grew most."""
    verifier_score = sum(e.met for e in verifier)
    model_score = sum(e.met for e in model)
    if verifier_score != model_score:
        verifier_saturated = verifier_score > model_score
    else:  # no signal either way: name the stage whose latency grew more
        model_growth = (high.latency_s["model"].mean or 0) - (low.latency_s["model"].mean or 0)
        verify_growth = sum(
            (high.latency_s[s].mean or 0) - (low.latency_s[s].mean or 0)
            for s in ("verify_wait", "verify")
        )
        verifier_saturated = verify_growth > model_growth
    if verifier_saturated:
        per_worker = 1 / high.latency_s["verify"].mean if high.latency_s["verify"].mean else 0.0
        return (
            "verifier-bound",
            verifier,
            (
                f"add verifier workers (--verifier-workers, now {high.verifier_capacity}): "
                f"each adds about {per_worker:.3g} rollouts/s (one worker verifies one rollout "
                f"per {(high.latency_s['verify'].mean or 0) * 1000:.0f} ms), "
                "or make the verifier cheaper."
            ),
        )
    kv = next((e for e in model if e.name.startswith("server KV") and e.met), None)
    step = (
        f"the model server is saturated near {high.rollouts_per_s:.3g} rollouts/s: raise "
        "max_num_seqs (vLLM --max-num-seqs) if the GPU has room, or add a replica; "
        "run `autotune sweep` over the server's knobs."
    )
    if kv is not None:
        step += (
            " The KV cache is full: raise --gpu-memory-utilization or "
            "--tensor-parallel-size before max_num_seqs."
        )
    return "model-bound", model, step


def _notes(low: ProbeResult, high: ProbeResult) -> list[str]:
    notes = []
    for probe in (low, high):
        check = probe.token_check
        if check and check.get("mismatch"):
            notes.append(
                f"at parallelism {probe.parallelism} the client counted "
                f"{check['client_tokens_per_s']:.0f} output tokens/s but the server's "
                f"vllm:generation_tokens_total says {check['server_tokens_per_s']:.0f} "
                f"({check['relative_difference']:.0%} apart; over 10%)."
            )
        if probe.stop_reason == "time cap":
            lo, hi = probe.rollouts_per_s_ci
            notes.append(
                f"the probe at parallelism {probe.parallelism} hit its time cap before its "
                f"interval reached its precision target (95% CI {lo:.3g}–{hi:.3g} rollouts/s)."
            )
    for name, reason in high.telemetry_unavailable.items():
        notes.append(f"{name}: {reason}")
    return notes
