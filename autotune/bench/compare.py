"""`autotune bench compare`: a verdict for each case and metric against a baseline, from
saved files only (a regression is a large enough fall that is also significant).
Why, and the exit codes: docs/design/bench.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.bench.fingerprint import DECISIVE, differences
from autotune.bench.records import BenchResults, CaseResult, load
from autotune.bench.significance import (
    bootstrap_ratio_interval,
    mann_whitney_u,
    median,
    paired_ratio,
)
from autotune.errors import BaselineUnavailable, UsageError

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_NOT_COMPARABLE = 3
EXIT_CANNOT_RUN = 4

REGRESSION = "regression"
IMPROVEMENT = "improvement"
UNCHANGED = "unchanged"
NOT_COMPARABLE = "not comparable"
COULD_NOT_RUN = "could not run"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One case and metric against the baseline; the figures are None where not compared."""

    case: str
    metric: str
    unit: str
    verdict: str
    reason: str  # one sentence a reader acts on
    threshold: float
    median: float | None = None
    baseline_median: float | None = None
    ratio: float | None = None  # median ÷ baseline median; an A/B's: its pairs' geometric mean
    interval: tuple[float, float] | None = None  # the ratio's, at Comparison.confidence
    p_value: float | None = None
    samples: tuple[float, ...] = ()
    baseline_samples: tuple[float, ...] = ()
    settings_changed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Run:
    """One results file as the history shows it: when, where, and each metric's median."""

    path: str
    created_at: float
    host: str
    medians: dict[str, float]  # "case/metric" → median


@dataclass(frozen=True, slots=True)
class AbRecord:
    """How `bench ab` measured its two sides: interleaved pairs, and why it stopped."""

    baseline: str  # what the baseline side ran: a git ref, an install, a server command
    candidate: str
    pairs: int
    looks: int  # the pair counts at which it could have stopped (each tests at alpha / looks)
    stopped: str  # one sentence: the verdict was clear, or the pair cap was reached
    pair_ratios: dict[str, tuple[float, ...]]  # "case/metric" → candidate ÷ baseline, a pair
    wall_s: float


@dataclass(frozen=True, slots=True)
class Comparison:
    results: str
    baseline: str
    created_at: float
    baseline_created_at: float
    baseline_reason: str | None
    alpha: float
    ignored: tuple[str, ...]
    verdicts: tuple[Verdict, ...]
    history: tuple[Run, ...]  # every results file given, oldest first
    baseline_medians: dict[str, float]
    fingerprints: dict[str, dict[str, Any]]  # case → the results' fingerprint
    exit_code: int
    ab: AbRecord | None = None  # set by `bench ab`: how the two sides were measured
    kind: str = "bench-comparison"
    schema_version: int = 1

    @property
    def level(self) -> float:
        """What each verdict's test is held to: alpha, or an A/B's alpha ÷ its looks."""
        return self.alpha / (self.ab.looks if self.ab is not None else 1)

    @property
    def confidence(self) -> float:
        """The verdicts' intervals' level: an A/B's is corrected for its looks."""
        return 1 - self.level

    def count(self, verdict: str) -> int:
        return sum(1 for v in self.verdicts if v.verdict == verdict)

    @property
    def summary(self) -> str:
        """'1 regression, 3 unchanged': the headline."""
        parts = []
        for name in (REGRESSION, COULD_NOT_RUN, NOT_COMPARABLE, IMPROVEMENT, UNCHANGED):
            n = self.count(name)
            if n:
                plural = "s" if n > 1 and name in (REGRESSION, IMPROVEMENT) else ""
                parts.append(f"{n} {name}{plural}")
        return ", ".join(parts) or "nothing compared"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_baseline(path: Path) -> BenchResults:
    if not path.exists():
        raise BaselineUnavailable(
            f"the baseline {path} does not exist; make one on purpose with "
            "`autotune bench update-baseline RESULTS --baseline PATH`."
        )
    try:
        return load(path)
    except UsageError as error:
        raise BaselineUnavailable(f"the baseline cannot be used: {error}") from None


def compare_files(
    results: Sequence[Path],
    baseline: Path,
    threshold: float | None = None,
    alpha: float | None = None,
    ignore: Sequence[str] = (),
) -> Comparison:
    """The newest of `results` against `baseline`; the others make the history."""
    check_options(threshold, alpha, ignore)
    runs = sorted(((load(path), path) for path in results), key=lambda pair: pair[0].created_at)
    newest, newest_path = runs[-1]
    return compare_results(
        newest,
        load_baseline(baseline),
        results_name=str(newest_path),
        baseline_name=str(baseline),
        threshold=threshold,
        alpha=alpha,
        ignore=ignore,
        history=tuple(_run(r, p) for r, p in runs),
    )


def check_options(threshold: float | None, alpha: float | None, ignore: Sequence[str]) -> None:
    """--threshold, --alpha and --ignore-fingerprint, refused in one sentence if wrong."""
    for name in ignore:
        if name not in DECISIVE:
            raise UsageError(
                f"--ignore-fingerprint {name!r} is not a decisive field; "
                f"the fields are {', '.join(DECISIVE)}."
            )
    if threshold is not None and not 0 < threshold < 1:
        raise UsageError("--threshold must be between 0 and 1, e.g. 0.05 for 5%.")
    if alpha is not None and not 0 < alpha < 1:
        raise UsageError("--alpha must be between 0 and 1, e.g. 0.01.")


def compare_results(
    newest: BenchResults,
    base: BenchResults,
    *,
    results_name: str,
    baseline_name: str,
    threshold: float | None = None,
    alpha: float | None = None,
    ignore: Sequence[str] = (),
    history: tuple[Run, ...] = (),
    ab: AbRecord | None = None,
) -> Comparison:
    """Every case and metric of `newest` judged against `base` (saved or measured beside).

    An A/B that may stop at any of `ab.looks` looks tests each at alpha / looks
    (Bonferroni), so that looking often does not raise its false-alarm rate.
    """
    level = alpha if alpha is not None else newest.alpha
    looks = ab.looks if ab is not None else 1
    verdicts = tuple(
        v
        for case in newest.cases
        for v in compare_case(
            case, base.case(case.name), level, threshold, ignore, looks, paired=ab is not None
        )
    )
    verdicts += tuple(
        Verdict(
            case=c.name,
            metric=name,
            unit=metric.unit,
            verdict=NOT_COMPARABLE,
            reason=f"the baseline has case {c.name} but these results do not; run the whole "
            "suite, or update the baseline if the case was removed on purpose.",
            threshold=c.threshold,
            baseline_median=median(metric.samples),
            baseline_samples=metric.samples,
        )
        for c in base.cases
        if newest.case(c.name) is None
        for name, metric in c.metrics.items()
    )
    return Comparison(
        results=results_name,
        baseline=baseline_name,
        created_at=newest.created_at,
        baseline_created_at=base.created_at,
        baseline_reason=(base.baseline or {}).get("reason"),
        alpha=level,
        ignored=tuple(ignore),
        verdicts=verdicts,
        history=history or (_run(newest, Path(results_name)),),
        baseline_medians=_medians(base),
        fingerprints={c.name: asdict(c.fingerprint) for c in newest.cases if c.fingerprint},
        exit_code=exit_code(verdicts),
        ab=ab,
    )


def exit_code(verdicts: Sequence[Verdict]) -> int:
    found = {v.verdict for v in verdicts}
    if REGRESSION in found:
        return EXIT_REGRESSION
    if COULD_NOT_RUN in found:
        return EXIT_CANNOT_RUN
    if NOT_COMPARABLE in found:
        return EXIT_NOT_COMPARABLE
    return EXIT_OK


def compare_case(
    case: CaseResult,
    base: CaseResult | None,
    alpha: float,
    threshold: float | None = None,
    ignore: Sequence[str] = (),
    looks: int = 1,
    paired: bool = False,
) -> list[Verdict]:
    """One verdict per metric of `case` (one, metric "-", if it could not run). Unpaired
    (a saved baseline): the rank test at alpha, a bootstrap interval at 1 - alpha. Paired
    (`bench ab`: sample i of each side measured together): the paired test at
    alpha / looks and its interval at 1 - alpha / looks."""
    limit = case.threshold if threshold is None else threshold
    if case.error is not None:
        return [Verdict(case.name, "-", "", COULD_NOT_RUN, case.error, limit)]
    changed = tuple(_settings_changed(base.settings, case.settings)) if base else ()
    verdicts = []
    for name, metric in case.metrics.items():
        now = median(metric.samples)
        why = _not_comparable(case, base, name, ignore)
        if base is None or why is not None:
            verdicts.append(
                Verdict(case.name, name, metric.unit, NOT_COMPARABLE, why or "", limit, now,
                        samples=metric.samples, settings_changed=changed)
            )  # fmt: skip
            continue
        old = base.metrics[name].samples
        level = alpha / looks
        if paired:
            test = paired_ratio(metric.samples, old, confidence=1 - level)
            ratio, interval, p_value = test.ratio, test.interval, test.p_value
        else:
            ratio = now / median(old)
            interval = bootstrap_ratio_interval(metric.samples, old, confidence=1 - level)
            p_value = mann_whitney_u(metric.samples, old).p_value
        verdict, reason = _judge(
            ratio, p_value, limit, level, "the pairs' ratio" if paired else "the median"
        )
        verdicts.append(
            Verdict(
                case=case.name,
                metric=name,
                unit=metric.unit,
                verdict=verdict,
                reason=reason,
                threshold=limit,
                median=now,
                baseline_median=median(old),
                ratio=ratio,
                interval=interval,
                p_value=p_value,
                samples=metric.samples,
                baseline_samples=old,
                settings_changed=changed,
            )
        )
    return verdicts


def _judge(
    ratio: float, p_value: float, threshold: float, alpha: float, what: str
) -> tuple[str, str]:
    """The verdict on `what` (the median, or an A/B's pairs' ratio) moving to `ratio`."""
    change = ratio - 1
    significant = p_value < alpha
    if change < -threshold and significant:
        return REGRESSION, (
            f"{what} fell {-change:.1%} (more than {threshold:.0%}), p = {p_value:.2g}."
        )
    if change > threshold and significant:
        return IMPROVEMENT, (
            f"{what} rose {change:.1%} (more than {threshold:.0%}), p = {p_value:.2g}; "
            "update the baseline to keep the gain."
        )
    if abs(change) > threshold:
        return UNCHANGED, (
            f"{what} moved {change:+.1%}, but not significantly (p = {p_value:.2g} "
            f"≥ {alpha:g}); more repetitions would tell."
        )
    return UNCHANGED, f"{what} moved {change:+.1%}, within ±{threshold:.0%}."


def _not_comparable(
    case: CaseResult, base: CaseResult | None, metric: str, ignore: Sequence[str]
) -> str | None:
    if base is None:
        return (
            f"the baseline has no case {case.name}; add it with `autotune bench update-baseline`."
        )
    if metric not in base.metrics:
        return f"the baseline has no {metric} for case {case.name}."
    assert case.fingerprint is not None and base.fingerprint is not None
    diff = differences(base.fingerprint, case.fingerprint, ignore)
    if diff:
        fields = [d.split(":", 1)[0] for d in diff]
        return (
            f"the environment differs from the baseline's ({'; '.join(diff)}); "
            f"compare across it with --ignore-fingerprint {' --ignore-fingerprint '.join(fields)}"
            ", or make a new baseline."
        )
    return None


def _settings_changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'parallelism: 32 → 64' for each recorded setting that differs: shown, not decisive."""
    return [
        f"{key}: {old.get(key)!r} → {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


def _medians(results: BenchResults) -> dict[str, float]:
    return {
        f"{case.name}/{name}": median(metric.samples)
        for case in results.cases
        for name, metric in case.metrics.items()
    }


def _run(results: BenchResults, path: Path) -> Run:
    return Run(str(path), results.created_at, str(results.machine.get("host")), _medians(results))
