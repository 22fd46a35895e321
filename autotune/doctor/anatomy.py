"""Where a run's step time goes: each step by phase, the steady state (warm-up left out by
a stated rule), each phase's share with its interval over the steps, the response-length
tail, and the bound with its evidence, as `autotune diagnose` gives a verdict."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.doctor.formats import ParsedRun, Step
from autotune.doctor.names import PHASES, lookup
from autotune.results.diagnosis import Evidence
from autotune.results.doctor import PhaseFigure, StepPhases, TailFigures
from autotune.stats import mean_interval

UNACCOUNTED = "unaccounted"
WARMUP_SLOWER = 1.5  # a leading step this much slower than the median still warms up
WARMUP_RULE = (
    "with 3 steps or more, the first step is warm-up (engine start, compilation, the first "
    f"weight load), and so is each step after it that is over {WARMUP_SLOWER:g}× the median "
    "step, up to a tenth of the run"
)
# The bounds, the phases each sums, and the share of the step that makes a run that bound.
BOUNDS: dict[str, tuple[tuple[str, ...], float, str]] = {
    "generation": (("generation", "waiting"), 0.5, "the step waits on rollout generation"),
    "training": (("training", "logprobs"), 0.5, "the step is the trainer's passes"),
    "weight-sync": (("weight_sync", "sleep_wake"), 0.2, "moving weights and waking engines"),
    "reward": (("reward",), 0.2, "scoring the rollouts"),
    "overhead": (
        ("overhead", "checkpoint", UNACCOUNTED), 0.25, "time no phase of the run accounts for",
    ),
}  # fmt: skip
TAIL_MAX_OVER_MEAN = 3.0  # the longest response this many times the mean: a long tail
TAIL_SLOWEST_OVER_MEAN = 2.0  # the slowest sample's generation over the mean sample's


@dataclass(frozen=True, slots=True)
class Anatomy:
    steps: list[StepPhases]
    step: PhaseFigure
    phases: list[PhaseFigure]
    tail: TailFigures
    verdict: str
    confidence: str
    evidence: list[Evidence]
    notes: list[str]
    generation_alone_s: float | None  # the engines' generation without a switch's cost

    def seconds(self, *phases: str) -> float:
        """The mean seconds a steady step spends in `phases`, together."""
        return sum(figure.mean_s for figure in self.phases if figure.phase in phases)


def dissect(run: ParsedRun) -> Anatomy:
    """The run's steps by phase, its steady state and its bound."""
    names: dict[str, list[str]] = {}
    read = [_read(step, names) for step in run.steps]
    steps = _warm_up([phased for phased, _ in read])
    steady = [step for step in steps if step.steady]
    steady_roles = [roles for (_, roles), step in zip(read, steps, strict=True) if step.steady]
    step_times = [step.step_s for step in steady]
    mean_step = statistics.fmean(step_times)
    phases = [
        _figure(phase, [step.phases.get(phase, 0.0) for step in steady], mean_step, names)
        for phase in (*PHASES, UNACCOUNTED)
        if any(phase in step.phases for step in steady)
    ]
    notes = list(run.notes)
    if not all(step.step_logged for step in steady):
        notes.append("no step time logged: a step is the sum of its phases, none unaccounted")
    if any(step.phases.get(UNACCOUNTED, 0.0) < -0.02 * step.step_s for step in steady):
        notes.append("the phases add to more than the step: some of them overlap")
    tail = _tail(steady_roles)
    verdict, confidence, evidence = _bound(steady, tail)
    alone = _role_values(steady_roles, "generation_alone")
    return Anatomy(
        steps=steps,
        step=_figure("step", step_times, mean_step, {}),
        phases=phases,
        tail=tail,
        verdict=verdict,
        confidence=confidence,
        evidence=evidence,
        notes=notes,
        generation_alone_s=statistics.fmean(alone) if alone else None,
    )


def _read(step: Step, names: dict[str, list[str]]) -> tuple[StepPhases, dict[str, float]]:
    """One pass over a step's figures: its phases (the step less them unaccounted), and
    its other roles' figures (the first name of each role it has); each phase's names are
    added to `names`."""
    phases: dict[str, float] = {}
    roles: dict[str, float] = {}
    total = None
    for name, value in step.values.items():
        row = lookup(name)
        if row is None:
            continue
        if row.role == "phase":
            phases[row.phase] = phases.get(row.phase, 0.0) + value
            if name not in names.setdefault(row.phase, []):
                names[row.phase].append(name)
        elif row.role == "step":
            total = value if total is None else total
        else:
            roles.setdefault(row.role, value)
    accounted = sum(phases.values())
    if total is None:
        return StepPhases(step.index, accounted, phases, True, step_logged=False), roles
    whole = StepPhases(step.index, total, {**phases, UNACCOUNTED: total - accounted}, True)
    return whole, roles


def _warm_up(steps: list[StepPhases]) -> list[StepPhases]:
    if len(steps) < 3:
        return steps
    median = statistics.median(step.step_s for step in steps)
    warm = 1
    while warm < max(1, len(steps) // 10) and steps[warm].step_s > WARMUP_SLOWER * median:
        warm += 1
    return [replace(step, steady=i >= warm) for i, step in enumerate(steps)]


def _figure(
    phase: str, values: list[float], mean_step: float, names: dict[str, list[str]]
) -> PhaseFigure:
    centre = statistics.fmean(values)
    interval = mean_interval(values)
    return PhaseFigure(
        phase=phase,
        mean_s=centre,
        low_s=interval[0] if interval else None,
        high_s=interval[1] if interval else None,
        share=centre / mean_step if mean_step > 0 else 0.0,
        names=names.get(phase, []),
    )


def _role_values(roles: Sequence[dict[str, float]], role: str) -> list[float]:
    """Each step's figure of the role, for the steps that have one."""
    return [figures[role] for figures in roles if role in figures]


def _tail(steady: Sequence[dict[str, float]]) -> TailFigures:
    means, maxima = _role_values(steady, "length_mean"), _role_values(steady, "length_max")
    clips = _role_values(steady, "clip_ratio")
    sample_means, sample_maxima = (
        _role_values(steady, "sample_mean"), _role_values(steady, "sample_max"),
    )  # fmt: skip
    length_mean = statistics.fmean(means) if means else None
    length_max = statistics.fmean(maxima) if maxima else None
    slowest = (
        statistics.fmean(sample_maxima) / statistics.fmean(sample_means)
        if sample_means and sample_maxima and statistics.fmean(sample_means) > 0
        else None
    )
    return TailFigures(
        length_mean=length_mean,
        length_max=length_max,
        max_over_mean=length_max / length_mean if length_mean and length_max else None,
        clip_ratio=statistics.fmean(clips) if clips else None,
        slowest_over_mean=slowest,
    )


def _bound(steady: list[StepPhases], tail: TailFigures) -> tuple[str, str, list[Evidence]]:
    """The bound: the phase group over its threshold with the largest share (generation
    with a long tail is tail-bound); sure when its share's interval clears the next
    group's, leaning otherwise."""
    shares: dict[str, list[float]] = {
        bound: [sum(s.phases.get(p, 0.0) for p in phases) / s.step_s for s in steady]
        for bound, (phases, _, _) in BOUNDS.items()
    }
    evidence = []
    for bound, (_, threshold, meaning) in BOUNDS.items():
        share = statistics.fmean(shares[bound])
        evidence.append(
            Evidence(f"{bound} share", share, threshold, ">=", share >= threshold, meaning, "share")
        )
    long_tail = _tail_evidence(tail)
    evidence += long_tail
    if not any(phase != UNACCOUNTED for step in steady for phase in step.phases):
        return "inconclusive", "the log times whole steps only, no phase", evidence
    ranked = sorted(BOUNDS, key=lambda bound: statistics.fmean(shares[bound]), reverse=True)
    top, runner_up = ranked[0], ranked[1]
    met = next(e.met for e in evidence if e.name == f"{top} share")
    verdict = f"{top}-bound"
    if top == "generation" and any(e.met for e in long_tail):
        verdict = "tail-bound"
    top_interval = mean_interval(shares[top])
    next_interval = mean_interval(shares[runner_up])
    if len(steady) == 1:
        confidence = "leaning, one step"
    elif met and top_interval and next_interval and top_interval[0] > next_interval[1]:
        confidence = "sure"
    else:
        confidence = "leaning"
    return verdict, confidence, evidence


def _tail_evidence(tail: TailFigures) -> list[Evidence]:
    found = []
    if tail.max_over_mean is not None:
        found.append(
            Evidence(
                "longest response ÷ mean", tail.max_over_mean, TAIL_MAX_OVER_MEAN, ">=",
                tail.max_over_mean >= TAIL_MAX_OVER_MEAN,
                "a step's generation waits on its longest responses", "×",
            )
        )  # fmt: skip
    if tail.slowest_over_mean is not None:
        found.append(
            Evidence(
                "slowest sample's generation ÷ mean", tail.slowest_over_mean,
                TAIL_SLOWEST_OVER_MEAN, ">=", tail.slowest_over_mean >= TAIL_SLOWEST_OVER_MEAN,
                "the engines idle while the slowest samples finish", "×",
            )
        )  # fmt: skip
    return found
