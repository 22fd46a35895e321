"""The recommendation: the best configuration at 80% of its peak parallelism (or, with
`recommend: ceiling`, at the server's ceiling), lower where an SLO or a failed validation
run says so, with 95% intervals and lines for NeMo Gym, `vllm serve` and OpenRLHF. Pure:
computed from a saved SweepResult alone. The rules: docs/design/sweep.md.
"""

from __future__ import annotations

import itertools
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from autotune.config.flags import server_flags
from autotune.config.knobs import NUM_ENGINES, SERVER_KNOBS, knob
from autotune.engines import ENGINE_NAMES, Engine, engine_named
from autotune.engines.description import OPTIONS_FILE
from autotune.knee import CurveBootstrap, Interval, UslFit, bootstrap_curve, standard_errors
from autotune.results.probes import CurvePoint
from autotune.results.stages import LATENCY_SLOS
from autotune.results.trials import (
    CEILING_RULE,
    HEADROOM_RULE,
    Peak,
    PrefixCachingGain,
    Recommendation,
    Recommended,
    Snippets,
    SweepResult,
    TrialRecord,
)
from autotune.rollout.workload import workload_flags
from autotune.sweep.frameworks import sglang_framework_lines

# OpenRLHF's dotted flags for the vLLM knobs it exposes (a switch: given when true).
OPENRLHF_FLAGS = {
    NUM_ENGINES: "--vllm.num_engines",
    **{name: flag for name in SERVER_KNOBS if (flag := knob(name).openrlhf) is not None},
}
CACHING = "enable_prefix_caching"
RULE = "80% of the peak parallelism (the NeMo Gym guide's headroom for stability)"
CEILING = "ceiling"  # the study's `recommend:` that runs a level curve at its ceiling
VALIDATION_RULE = "validation"
# An expected latency must sit inside its SLO by what it is known to: a plan right at
# the SLO would fail its validation run half the time. A rollout latency's p95 or p99 is
# known to its 95% half-width as an order statistic of the point's completions
# (quantile_margin), never better than MIN_LATENCY_MARGIN (the run-to-run drift of a
# rate, ~1-2%); a p95 whose spread is not measured (TTFT: no median kept) takes
# LATENCY_MARGIN.
LATENCY_MARGIN = 0.10
MIN_LATENCY_MARGIN = 0.03
# The standard normal's 95th and 99th percentiles, and its density there.
NORMAL_QUANTILE = {0.95: (1.6449, 0.10314), 0.99: (2.3263, 0.02665)}


def result_engine(result: SweepResult) -> Engine:
    """The engine the study launched (the simulator's lines are vLLM's)."""
    kind = (result.spec.get("target") or {}).get("kind")
    return engine_named(kind if kind in ENGINE_NAMES else "vllm")


def serve_line(engine: Engine, model: str | None, knobs: dict[str, object]) -> str:
    """The engine's launch line for a configuration, its knobs spelled as the engine spells
    them; several engines run as one server's data-parallel ranks where the engine can
    (TensorRT-LLM cannot: the line is each engine's, one server a replica)."""
    flags = {name: value for name, value in knobs.items() if name != NUM_ENGINES}
    engines = int(str(knobs.get(NUM_ENGINES, 1)))
    if engines > 1 and engine.knob_problem("data_parallel_size") is None:
        flags = {"data_parallel_size": engines, **flags}
    options = OPTIONS_FILE if engine.options(flags) else None
    if engine.name == "vllm":  # `vllm serve` takes the model first (--model suits launches)
        engine = replace(engine, model_flag=None)
    words = engine.launch_line(engine.command, model or "MODEL", flags, options_file=options)
    return " ".join(words)


def group_size(result: SweepResult) -> int:
    """Samples to a GRPO group in the study's workload (1 without groups)."""
    return result.workload.num_repeats if result.workload is not None else 1


def options_yaml(engine: Engine, knobs: dict[str, object]) -> str:
    """The options file `serve_line` names (TensorRT-LLM's), as YAML; "" for none."""
    options = engine.options(knobs)
    return yaml.safe_dump(options, sort_keys=True) if options else ""


def collect_line(result: SweepResult, parallelism: int, knobs: dict[str, object]) -> str:
    """`autotune collect` at the recommended parallelism on the sweep's own workload (and,
    on the simulator, its server flags): the run whose throughput `--expect` may hold to
    the prediction."""
    words = ["autotune", "collect", "--parallelism", str(parallelism)]
    if result.simulated:
        served = {name: value for name, value in knobs.items() if name != NUM_ENGINES}
        target = result.spec.get("target") or {}
        sim = [*map(str, target.get("args") or []), *server_flags(served)]
        words += [f"--sim-arg={arg}" for arg in sim]
    if result.workload is not None:
        words += workload_flags(result.workload)
    return shlex.join(words)


def openrlhf_flags(knobs: dict[str, object]) -> str:
    """OpenRLHF's dotted flags for the knobs it has: a switch only when on."""
    flags = []
    for name, flag in OPENRLHF_FLAGS.items():
        value = knobs.get(name)
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags.append(f"{flag} {value}")
    return " ".join(flags)


def prefix_caching_gain(result: SweepResult, best: TrialRecord) -> PrefixCachingGain | None:
    """The best value with prefix caching on and off at the best trial's split (engines
    × TP); None unless both were measured there."""
    if CACHING not in best.knobs:
        return None
    split = _split(best.knobs)
    values: dict[bool, float] = {}
    for trial in result.completed:
        if trial.feasible and CACHING in trial.knobs and _split(trial.knobs) == split:
            on = bool(trial.knobs[CACHING])
            values[on] = max(values.get(on, 0.0), trial.value or 0.0)
    if True not in values or False not in values:
        return None
    return PrefixCachingGain(f"{split[0]}x{split[1]}", values[True], values[False])


def _split(knobs: dict[str, Any]) -> tuple[int, int]:
    """(engines, tensor-parallel size) of a configuration."""
    return int(knobs.get(NUM_ENGINES, 1)), int(knobs.get("tensor_parallel_size", 1))


def usable_points(result: SweepResult, trial: TrialRecord) -> list[CurvePoint]:
    """The trial's points within the error budget, lowest parallelism first."""
    points = [p for p in trial.points if p.error_rate <= result.max_error_rate]
    return sorted(points, key=lambda p: p.parallelism)


def curve_bootstrap(result: SweepResult, trial: TrialRecord) -> CurveBootstrap | None:
    """The bootstrap of the trial's curve fit (seeded by the trial: the same file always
    gives the same intervals)."""
    points = usable_points(result, trial)
    ns = [p.parallelism for p in points]
    xs = [p.metric(result.metric) for p in points]
    intervals = [p.metric_interval(result.metric) for p in points]
    if len(points) < 2:
        return None
    batches = [p.batches for p in points]
    errors = standard_errors(ns, xs, intervals, batches)
    ceiling = trial.curve.server_ceiling if trial.curve else None
    return bootstrap_curve(ns, xs, errors, seed=trial.number, ceiling=ceiling)


def expected_latency(points: Sequence[CurvePoint], parallelism: float, which: str) -> float | None:
    """The p95 latency (`which`: p95_latency_s or p95_ttft_s) expected at a parallelism:
    interpolated between measured points on log-log axes; below the lowest point, that
    point's; above the highest, growing in proportion (a flat throughput's queue)."""
    known = [(p.parallelism, getattr(p, which)) for p in points if getattr(p, which)]
    if not known:
        return None
    known.sort()
    if parallelism <= known[0][0]:
        return float(known[0][1])
    if parallelism >= known[-1][0]:
        return float(known[-1][1] * parallelism / known[-1][0])
    for (n0, y0), (n1, y1) in itertools.pairwise(known):
        if n0 <= parallelism <= n1:
            share = math.log(parallelism / n0) / math.log(n1 / n0) if n1 > n0 else 0.0
            return float(math.exp(math.log(y0) + share * (math.log(y1) - math.log(y0))))
    return None


def quantile_margin(point: CurvePoint, which: str, quantile: float) -> float:
    """The relative 95% half-width of a point's rollout-latency quantile (`which`: its
    p95 or p99 figure). The q-quantile of n completions is an order statistic: its
    standard error is √(q(1−q)/n) ÷ the latencies' density there, which for a log-normal
    spread (σ = ln(p_q/p50) / z_q) is √(q(1−q)/n) · σ / φ(z_q) of the quantile itself."""
    p50, tail, count = point.p50_latency_s, getattr(point, which), point.completed
    if not (p50 and tail and count):
        return LATENCY_MARGIN
    z, density = NORMAL_QUANTILE[quantile]
    sigma = math.log(max(tail / p50, 1.0)) / z
    error = math.sqrt(quantile * (1 - quantile) / count) * sigma / density
    return max(MIN_LATENCY_MARGIN, 1.96 * error)


def latency_margin(points: Sequence[CurvePoint], parallelism: float, which: str) -> float:
    """How far inside its SLO the expected latency (`which`: a point's figure) at
    `parallelism` must sit: the wider margin of the measured points it is read from (the
    two around it, or the end one)."""
    quantile = next((slo.quantile for slo in LATENCY_SLOS if slo.figure == which), None)
    known = sorted((p for p in points if getattr(p, which)), key=lambda p: p.parallelism)
    if quantile is None or not known:
        return LATENCY_MARGIN
    below = [p for p in known if p.parallelism <= parallelism][-1:] or known[:1]
    above = [p for p in known if p.parallelism >= parallelism][:1] or known[-1:]
    return max(quantile_margin(p, which, quantile) for p in (*below, *above))


@dataclass(frozen=True, slots=True)
class Plan:
    """The parallelism the rules give before any validation run, and why."""

    parallelism: int
    bound_by: str
    rule: str
    parallelism_interval: Interval | None


def _slo_misses(
    points: Sequence[CurvePoint], parallelism: float, result: SweepResult, scale: float = 1.0
) -> list[str]:
    """The SLOs the expected latencies at `parallelism` miss (`scale`: a bootstrap draw's
    latency ÷ the fit's, by Little's law)."""
    misses = []
    for latency in LATENCY_SLOS:
        slo = getattr(result, latency.field)
        expected = expected_latency(points, parallelism, latency.figure) if slo else None
        margin = latency_margin(points, parallelism, latency.figure)
        if slo and expected is not None and expected * scale * (1 + margin) > slo:
            misses.append(latency.rule)
    return misses


def _within_slos(
    points: Sequence[CurvePoint],
    headroom: int,
    result: SweepResult,
    scale: Callable[[int], float] | None = None,
) -> int:
    """The largest parallelism at or under `headroom` whose expected latencies meet the
    SLOs (1 when none does)."""
    for n in range(headroom, 0, -1):
        if not _slo_misses(points, n, result, scale(n) if scale else 1.0):
            return n
    return 1


def runs_full(result: SweepResult, trial: TrialRecord) -> bool:
    """Whether the study's rule (`recommend: ceiling`) runs this curve at its server's
    ceiling: only a curve level there has one."""
    ceiling = trial.curve.server_ceiling if trial.curve else None
    return ceiling is not None and result.spec.get("recommend") == CEILING


def rule_plan(trial: TrialRecord, boot: CurveBootstrap | None, full: bool) -> Plan:
    """What a rule alone gives, before any SLO: 80% of the peak parallelism, or (`full`)
    the server's ceiling."""
    assert trial.curve is not None
    if full and trial.curve.server_ceiling is not None:
        ceiling = trial.curve.server_ceiling
        return Plan(ceiling, CEILING_RULE, _ceiling_rule(ceiling), (ceiling, ceiling))
    interval = boot.recommended_parallelism if boot else None
    return Plan(trial.curve.recommended_parallelism, HEADROOM_RULE, RULE, interval)


def plan(result: SweepResult, trial: TrialRecord, boot: CurveBootstrap | None) -> Plan:
    """The study's rule (80% of the peak, or the server's ceiling), lowered to the SLOs
    where they bind, with the 95% interval of the rule that bound it (the rule applied to
    every bootstrap draw)."""
    assert trial.curve is not None
    full = runs_full(result, trial)
    by_rule = rule_plan(trial, boot, full)
    headroom = by_rule.parallelism
    points = usable_points(result, trial)
    parallelism = _within_slos(points, headroom, result)
    if parallelism == headroom:
        return by_rule
    missed = _slo_misses(points, headroom, result)
    interval = None
    fitted = _fit(trial)
    if boot is not None and fitted is not None:
        starts = [headroom if full else mark.recommended_parallelism for mark in boot.draws]
        draws = [
            _within_slos(points, start, result, _scale(fitted, fit))
            for fit, start in zip(boot.fits, starts, strict=True)
        ]
        interval = boot.interval(draws)
    slos = []
    for latency in LATENCY_SLOS:
        if latency.rule not in missed:
            continue
        slo = getattr(result, latency.field)
        if latency.quantile is None:  # TTFT: no spread kept, the flat margin
            slos.append(f"{latency.label} stays {LATENCY_MARGIN:.0%} within {slo:g} s")
            continue
        margin = latency_margin(points, parallelism, latency.figure)
        name = latency.label.split()[0]
        slos.append(
            f"{name} rollout latency stays {margin:.0%} within {slo:g} s "
            f"(what the measured {name} is known to, 95%)"
        )
    start = "the server's ceiling" if full else "80% of the peak"
    rule = (
        f"the largest parallelism at or under {start} ({headroom}) whose expected "
        f"{' and '.join(slos)} (the study's SLO: at {headroom} it would not)"
    )
    return Plan(parallelism, " and ".join(missed), rule, interval)


def _ceiling_rule(ceiling: int) -> str:
    return (
        f"the server's ceiling ({ceiling} requests at once: max_num_seqs, or what its KV "
        "cache holds; the study's recommend: ceiling): the curve is level there, and past "
        "it requests only wait in the server's queue"
    )


def alternative(
    result: SweepResult, trial: TrialRecord, boot: CurveBootstrap | None
) -> Recommended | None:
    """The rule the study did not choose, where the curve has both (it ran level to its
    server's ceiling): its parallelism and predicted throughput, so what the headroom
    costs (or what running full would gain) is read beside the recommendation."""
    if trial.curve is None or trial.curve.server_ceiling is None:
        return None
    other = rule_plan(trial, boot, not runs_full(result, trial))
    predicted, interval = predicted_at(result, trial, boot, other.parallelism)
    points = usable_points(result, trial)
    return Recommended(
        other.parallelism,
        predicted,
        other.rule,
        bound_by=other.bound_by,
        parallelism_interval=other.parallelism_interval,
        throughput_interval=interval,
        p95_latency_s=expected_latency(points, other.parallelism, "p95_latency_s"),
        p95_ttft_s=expected_latency(points, other.parallelism, "p95_ttft_s"),
    )


def _scale(fitted: UslFit, draw: UslFit) -> Callable[[int], float]:
    """A bootstrap draw's latencies relative to the fit's: at one parallelism a closed
    loop's latency is inversely proportional to its throughput (Little's law)."""
    return lambda n: fitted.throughput(n) / max(draw.throughput(n), 1e-12)


def predicted_at(
    result: SweepResult, trial: TrialRecord, boot: CurveBootstrap | None, parallelism: int
) -> tuple[float, Interval | None]:
    """The fitted curve's throughput at a parallelism, with its 95% interval (None when
    there are too few points to bootstrap); without a fit, the nearest measured point's."""
    fit = _fit(trial)
    if fit is not None:
        return fit.throughput(parallelism), boot.throughput_at(parallelism) if boot else None
    points = usable_points(result, trial)
    if not points:
        return trial.curve.best_measured_throughput if trial.curve else 0.0, None
    nearest = min(points, key=lambda p: abs(p.parallelism - parallelism))
    return nearest.metric(result.metric), nearest.metric_interval(result.metric)


def _fit(trial: TrialRecord) -> UslFit | None:
    fit = trial.curve.fit if trial.curve else None
    return UslFit(fit["lambda"], fit["sigma"], fit["kappa"], fit["r2"]) if fit else None


def recommendation(result: SweepResult) -> Recommendation | None:
    """None when no feasible trial has a fitted curve."""
    best = result.best()
    if best is None or best.curve is None:
        return None
    curve, knobs = best.curve, best.knobs
    boot = curve_bootstrap(result, best)
    planned = plan(result, best, boot)
    parallelism, bound_by, rule, interval = (
        planned.parallelism,
        planned.bound_by,
        planned.rule,
        planned.parallelism_interval,
    )
    validations = [v for v in result.validations if v.trial == best.number]
    if validations and validations[-1].parallelism != parallelism:
        first, last = validations[0], validations[-1]
        parallelism, bound_by, interval = last.parallelism, VALIDATION_RULE, None
        rule = (
            f"stepped down from {first.parallelism} ({planned.bound_by}) to {parallelism}: the "
            f"validation run at {first.parallelism} failed ({'; '.join(first.problems)})"
        )
    predicted, predicted_interval = predicted_at(result, best, boot, parallelism)
    points = usable_points(result, best)
    engines, tp = _split(knobs)
    per_engine = math.ceil(parallelism / engines)
    engine = result_engine(result)
    return Recommendation(
        simulated=result.simulated,
        metric=result.metric,
        server=knobs,
        peak=Peak(
            parallelism=curve.peak_parallelism,
            throughput=curve.peak_throughput,
            inside_searched_range=curve.peak_inside_range,
            best_measured_parallelism=curve.best_measured_parallelism,
            best_measured_throughput=curve.best_measured_throughput,
            parallelism_interval=boot.peak_parallelism if boot else None,
            throughput_interval=boot.peak_throughput if boot else None,
        ),
        recommended=Recommended(
            parallelism,
            predicted,
            rule,
            bound_by=bound_by,
            parallelism_interval=interval,
            throughput_interval=predicted_interval,
            p95_latency_s=expected_latency(points, parallelism, "p95_latency_s"),
            p95_ttft_s=expected_latency(points, parallelism, "p95_ttft_s"),
        ),
        knee_parallelism=curve.knee_parallelism,
        smallest_parallelism_at_80pct_of_peak_throughput=curve.smallest_parallelism_at_80pct,
        note=curve.note,
        snippets=Snippets(
            nemo_gym=f"+num_samples_in_parallel={parallelism}",
            serve=serve_line(engine, result.model, knobs),
            openrlhf=openrlhf_flags(knobs) if engine.name == "vllm" else "",
            openrlhf_note=(
                f"keep rollout.batch_size × rollout.n_samples_per_prompt ÷ vllm.num_engines "
                f"near {per_engine} requests in flight per engine"
                if engine.name == "vllm"
                else f"OpenRLHF rolls out with vLLM only, not {engine.title}"
            ),
            autotune=collect_line(result, parallelism, knobs),
            engine=engine.name,
            frameworks=(
                sglang_framework_lines(knobs, parallelism, group_size=group_size(result))
                if engine.name == "sglang"
                else {}
            ),
            options=options_yaml(engine, knobs),
        ),
        alternative=alternative(result, best, boot),
        knee_interval=boot.knee_parallelism if boot else None,
        p95_latency_slo_s=result.p95_latency_slo_s,
        p95_ttft_slo_s=result.p95_ttft_slo_s,
        p99_latency_slo_s=result.p99_latency_slo_s,
        validated=validations[-1].passed if validations else None,
        validations=validations,
        engines=engines,
        tensor_parallel_size=tp if "tensor_parallel_size" in knobs else None,
        enable_prefix_caching=bool(knobs[CACHING]) if CACHING in knobs else None,
        parallelism_per_engine=per_engine,
        prefix_caching=prefix_caching_gain(result, best),
        roofline_share=best.roofline_share,
        workload=result.workload,
    )
