"""What the drift watch expects a collect to hold (`--expect-rate`, or a recommendation.json
with its interval, derived here where it holds none), and what to run when it does not.
Why: docs/design/live.md.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import orjson

from autotune.config.collection import PROBE_DEFAULTS, CollectConfig, LiveConfig
from autotune.errors import UsageError
from autotune.results.runs import Expectation, WorkloadRecord
from autotune.results.saved import load_result
from autotune.results.trials import Recommendation, SweepResult
from autotune.rollout.workload import workload_flags

RECOMMENDATION_FILE = "recommendation.json"


def load_expectation(live: LiveConfig) -> Expectation | None:
    """The expectation `--expect` or `--expect-rate` sets; None without either."""
    if live.expect_rate is not None:
        rate = live.expect_rate
        return Expectation(
            rollouts_per_s=rate,
            low=rate,
            high=rate,
            parallelism=None,
            source=f"--expect-rate {rate:g}",
            note="given on the command line, without an interval",
        )
    if live.expect is None:
        return None
    return from_recommendation(live.expect)


def from_recommendation(path: Path) -> Expectation:
    """A sweep's recommendation (the file, or the report directory holding it)."""
    if path.is_dir():
        path = path / RECOMMENDATION_FILE
    fix = "pass the recommendation.json a sweep wrote, e.g. reports/<study>/recommendation.json"
    if not path.exists():
        raise UsageError(f"--expect {path} does not exist; {fix}.")
    try:
        recommendation = Recommendation.from_dict(orjson.loads(path.read_bytes()))
    except orjson.JSONDecodeError as error:
        raise UsageError(f"--expect {path} is not valid JSON ({error}); {fix}.") from None
    except (KeyError, TypeError, AttributeError) as error:
        raise UsageError(
            f"--expect {path} is not a recommendation ({type(error).__name__}: {error}); {fix}."
        ) from None
    if recommendation.metric != "rollouts_per_s":
        raise UsageError(
            f"--expect {path} predicts {recommendation.metric}, and the drift watch compares "
            "rollouts/s; pass --expect-rate with the rollouts/s to hold instead."
        )
    recommended = recommendation.recommended
    predicted = recommended.predicted_throughput
    if recommended.throughput_interval is not None:
        low, high = recommended.throughput_interval
        note = "the recommendation's own 95% interval (a bootstrap of the sweep's fitted curve)"
    else:
        halfwidth, note = _derived_halfwidth(path.with_name("sweep.json"))
        low, high = predicted * max(0.0, 1 - halfwidth), predicted * (1 + halfwidth)
    return Expectation(
        rollouts_per_s=predicted,
        low=low,
        high=high,
        parallelism=recommended.parallelism,
        source=str(path),
        note=note,
        workload=recommendation.workload,
    )


def workload_differences(expectation: Expectation, run: WorkloadRecord) -> list[str]:
    """How the `run`'s workload differs from the one the expectation was measured on (none
    where it records none: a rate given by hand, an older recommendation)."""
    if expectation.workload is None:
        return []
    return expectation.workload.differences(run)


def _derived_halfwidth(sweep_path: Path) -> tuple[float, str]:
    """The prediction's relative 95% half-width, and how it was found."""
    head = "the recommendation holds a prediction without an interval; "
    default = PROBE_DEFAULTS.target_halfwidth
    fallback = (
        default,
        f"{head}±{default:.0%}, the probes' default precision (no readable sweep.json beside "
        "it to read the study's precision and the fit's misses from)",
    )
    if not sweep_path.exists():
        return fallback
    try:
        result = load_result(sweep_path)
    except UsageError:
        return fallback
    if not isinstance(result, SweepResult):
        return fallback
    probe = result.spec.get("probe")
    precision = default
    if isinstance(probe, dict):
        precision = float(probe.get("target_halfwidth", default))
    from autotune.knee import UslFit  # numpy: only a run with --expect pays for it

    best = result.best()
    misses = []
    if best is not None and best.curve is not None and best.curve.fit is not None:
        fit = UslFit(
            best.curve.fit["lambda"], best.curve.fit["sigma"], best.curve.fit["kappa"], 0.0
        )
        for point in best.points:
            predicted = fit.throughput(point.parallelism)
            if point.error_rate <= result.max_error_rate and predicted > 0:
                misses.append(abs(point.rollouts_per_s - predicted) / predicted)
    miss = max(misses, default=0.0)
    return precision + miss, (
        f"{head}±{precision + miss:.0%} derived from the sweep: its probes' precision "
        f"(±{precision:.0%}, 95%) plus the fitted curve's largest miss at a measured point "
        f"({miss:.0%})"
    )


def diagnose_command(
    config: CollectConfig, workload: WorkloadRecord, model: str, parallelism: int
) -> str:
    """`autotune diagnose` against what this collect runs on, with its own `workload`
    (`workload_record` of it), probing its parallelism against a quarter of it: the next
    step when throughput drifts."""
    target = config.target
    words = ["autotune", "diagnose"]
    for url in target.base_urls:
        words += ["--base-url", url]
    words += ["--model", model]
    words += [f"--sim-arg={flag}" for flag in target.sim_args]
    words += workload_flags(workload)
    if config.verifier_workers is not None:
        words += ["--verifier-workers", str(config.verifier_workers)]
    if config.verifier_cost_ms:
        words += ["--verifier-cost-ms", f"{config.verifier_cost_ms:g}"]
    words += ["--low", str(max(1, parallelism // 4)), "--high", str(parallelism)]
    return shlex.join(words)
