"""The table from each RL framework's metric names to autotune's phases of a training step
(`metric_names.csv`, one row a name): what a name measures and whether it adds to the step."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

Phase = Literal[
    "generation", "reward", "logprobs", "training", "weight_sync", "sleep_wake", "waiting",
    "checkpoint", "overhead", "step", "length",
]  # fmt: skip
# step: the step's whole time; phase: adds to the step's accounted time; within: a finer
# figure inside a phase, or beside the step (asynchronous generation), not added;
# generation_alone: the engines' generation without a colocated engine's switch (inside
# the generation phase, or beside an asynchronous step); sample_mean, sample_max: one
# sample's generation time; length_mean, length_max, clip_ratio: the response lengths.
Role = Literal[
    "step", "phase", "within", "generation_alone", "sample_mean", "sample_max",
    "length_mean", "length_max", "clip_ratio",
]  # fmt: skip
PHASES: tuple[Phase, ...] = (
    "generation", "reward", "logprobs", "training", "weight_sync", "sleep_wake", "waiting",
    "checkpoint", "overhead",
)  # fmt: skip
# What a metrics file or a W&B export puts before a framework's own name.
PREFIXES = ("timing/train/", "train/", "timing/", "actor/", "trainer/")


@dataclass(frozen=True, slots=True)
class MetricName:
    name: str
    framework: str
    phase: Phase
    role: Role
    meaning: str


@cache
def metric_names() -> dict[str, MetricName]:
    """Every row of the table, by name."""
    text = resources.files("autotune.doctor").joinpath("metric_names.csv").read_text()
    rows = csv.DictReader(text.splitlines())
    return {row["name"]: MetricName(**row) for row in rows}  # type: ignore[arg-type]


@cache
def lookup(name: str) -> MetricName | None:
    """The table's row for a metric as a log spells it: itself, or without a logger's
    prefix (W&B's `train/`, NeMo RL's `timing/train/`)."""
    names = metric_names()
    found = names.get(name)
    if found is not None:
        return found
    for prefix in PREFIXES:
        if name.startswith(prefix) and name[len(prefix) :] in names:
            return names[name[len(prefix) :]]
    return None


def frameworks() -> list[str]:
    """The frameworks the table names, in its order."""
    return list(dict.fromkeys(row.framework for row in metric_names().values()))
