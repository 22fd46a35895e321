"""What a sweep maximises: one `Objective` per `objective.metric`. An objective added in
its own module is one line of OBJECTIVES; the search, the job and the report ask it."""

from __future__ import annotations

from autotune.config.study import GOODPUT, TRAINED
from autotune.errors import UsageError
from autotune.sweep.objectives.base import Objective
from autotune.sweep.objectives.curve import CurveObjective
from autotune.sweep.objectives.goodput import GoodputObjective
from autotune.sweep.objectives.loop import LoopObjective

OBJECTIVES: dict[str, Objective] = {
    "rollouts_per_s": CurveObjective("rollouts_per_s"),
    "output_tokens_per_s": CurveObjective("output_tokens_per_s"),
    GOODPUT: GoodputObjective(),
    TRAINED: LoopObjective(),
}


def objective_for(metric: str) -> Objective:
    """The objective a study's `objective.metric` names."""
    try:
        return OBJECTIVES[metric]
    except KeyError:
        known = ", ".join(OBJECTIVES)
        raise UsageError(
            f"objective.metric {metric} names no objective; use one of {known}"
        ) from None
