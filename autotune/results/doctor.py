"""A real RL run's diagnosis as saved by `autotune doctor`: its steps by phase, the steady
state, the bound with its evidence, and each remedy's predicted step time."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune.results.codec import SCHEMA_VERSION, Record
from autotune.results.diagnosis import Evidence


@dataclass(frozen=True, slots=True)
class StepPhases(Record):
    """One step: its time, the seconds of each phase that adds to it (`unaccounted`: the
    step less them), and whether it counts toward the steady state."""

    index: int
    step_s: float
    phases: dict[str, float]
    steady: bool
    step_logged: bool = True  # False: no step time logged, the step is its phases' sum


@dataclass(frozen=True, slots=True)
class PhaseFigure(Record):
    """A phase at steady state: mean seconds a step, its 95% interval over the steps (None
    from one step), and its share of the mean step."""

    phase: str
    mean_s: float
    low_s: float | None
    high_s: float | None
    share: float
    names: list[str] = field(default_factory=list)  # the run's own metrics it sums


@dataclass(frozen=True, slots=True)
class TailFigures(Record):
    """Response lengths at steady state: the longest over the mean, the share cut at the
    limit, and the slowest sample's generation time over the mean sample's."""

    length_mean: float | None = None
    length_max: float | None = None
    max_over_mean: float | None = None
    clip_ratio: float | None = None
    slowest_over_mean: float | None = None


@dataclass(frozen=True, slots=True)
class Remedy(Record):
    """One change and the step time predicted after it: an interval and its midpoint, the
    gain (today's step ÷ the predicted one) and what the prediction assumed."""

    name: str
    step_s: float
    low_s: float
    high_s: float
    gain: float
    gain_low: float
    gain_high: float
    basis: str  # how the changed phase was predicted
    assumptions: list[str]
    lines: dict[str, str]  # framework → the settings that make the change


@dataclass(frozen=True, slots=True)
class DoctorResult(Record):
    kind: ClassVar[str] = "doctor"
    created_at: float
    source: str
    format: str
    framework: str
    steps: list[StepPhases]
    warmup_rule: str
    step: PhaseFigure
    phases: list[PhaseFigure]
    tail: TailFigures
    verdict: str
    confidence: str
    evidence: list[Evidence]
    remedies: list[Remedy]
    notes: list[str]
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}
