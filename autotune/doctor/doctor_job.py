"""`autotune doctor`: one run's telemetry read, its step time dissected and each remedy
predicted, as a `DoctorResult`; `follow` reads a log still being written, a step at a time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from autotune.doctor.anatomy import WARMUP_RULE, dissect
from autotune.doctor.formats import ParsedRun, read_run, read_runs
from autotune.doctor.remedies import Setup, remedies
from autotune.errors import UsageError
from autotune.results.doctor import DoctorResult, StepPhases

FOLLOW_POLL_S = 1.0


def pick_run(path: Path, run: int | None) -> tuple[ParsedRun, list[str]]:
    """The run to doctor (a table of runs holds several: `run` picks one, from 1)."""
    runs = read_runs(path)
    if run is None and len(runs) > 1:
        listed = "; ".join(f"{i}: {r.source.partition('(')[2].rstrip(')')}" for i, r in
                           enumerate(runs, 1))  # fmt: skip
        return runs[0], [f"{path} holds {len(runs)} runs ({listed}); --run K picks another"]
    index = 1 if run is None else run
    if not 1 <= index <= len(runs):
        raise UsageError(f"--run {index}: {path} holds {len(runs)} run(s); pick 1 to {len(runs)}.")
    return runs[index - 1], []


def doctor(run: ParsedRun, setup: Setup, notes: list[str] | None = None) -> DoctorResult:
    """Where the run's step time goes, its bound, and what each remedy would make of it."""
    anatomy = dissect(run)
    found, skipped = remedies(anatomy, setup)
    return DoctorResult(
        created_at=time.time(),
        source=run.source,
        format=run.format,
        framework=run.framework,
        steps=anatomy.steps,
        warmup_rule=_warmup_said(anatomy.steps),
        step=anatomy.step,
        phases=anatomy.phases,
        tail=anatomy.tail,
        verdict=anatomy.verdict,
        confidence=anatomy.confidence,
        evidence=anatomy.evidence,
        remedies=found,
        notes=[*(notes or []), *anatomy.notes, *skipped],
    )


def _warmup_said(steps: list[StepPhases]) -> str:
    left_out = [step.index for step in steps if not step.steady]
    kept = len(steps) - len(left_out)
    which = f"left out: step {', '.join(map(str, left_out))}" if left_out else "none left out"
    return f"{WARMUP_RULE}: {which}, {kept} steady step(s)"


def follow(path: Path, say: Callable[[str], None]) -> None:
    """Each step of a log still being written told once the next one begins (the last may
    be partial), the log read again whenever it grows; until the reader interrupts."""
    told = 0
    size = -1
    while True:
        current = path.stat().st_size if path.exists() else -1
        if current != size:
            size = current
            try:
                whole = read_run(path).steps[:-1]
            except UsageError:
                whole = []  # nothing whole yet: wait for more
            for step in whole[told:]:
                say(step_line(step.index, step.values))
            told = max(told, len(whole))
        time.sleep(FOLLOW_POLL_S)


def step_line(index: int, values: dict[str, float]) -> str:
    """One step's figures as `--follow` prints them."""
    figures = ", ".join(f"{name} {value:.3g}" for name, value in values.items())
    return f"step {index}: {figures}"
