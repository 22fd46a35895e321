"""The `Objective` protocol a sweep maximises, and `EngineObjective`, the shared shape of
the objectives that run one measurement through autotune's engine per trial (training
steps, the RL loop) instead of a parallelism curve."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from autotune.config.study import Study
from autotune.engines import Engine
from autotune.engines.known import VLLM
from autotune.errors import ServerStartupError, UsageError
from autotune.hardware.fit import Batch
from autotune.probe import Launcher
from autotune.probe.realtime import EngineProbe
from autotune.report import html
from autotune.report.sweep_report import no_recommendation_section
from autotune.results.codec import Record
from autotune.results.trials import SweepResult, TrialOutcome, TrialRecord, Validation
from autotune.sweep.curve import Incumbent
from autotune.sweep.recommend import result_engine

VALIDATION_SHARE = 0.8  # a validation run keeps at least this share of the trial's value


@dataclass(frozen=True, slots=True)
class TrialContext:
    """What the search knows when a trial starts: the Optuna trial (to report rungs to),
    what is known of the configuration before launch, and the best trial so far (None:
    nothing to prune against)."""

    trial: Any
    known: Batch
    best: Incumbent | None


class Objective(Protocol):
    """What a study maximises (`objective.metric`): the knobs it searches besides the
    server's, how one trial is measured and validated, the recommendation it makes, and
    how the terminal and the report show them."""

    @property
    def metric(self) -> str:
        """The `objective.metric` it answers to."""
        ...

    @property
    def searched(self) -> tuple[str, ...]:
        """The knobs it searches besides the server's."""
        ...

    async def run_trial(
        self, study: Study, launcher: Launcher, knobs: dict[str, Any], context: TrialContext
    ) -> TrialOutcome: ...

    def record_trial(self, study: Study, trial: Any, outcome: TrialOutcome) -> None:
        """Its own figures and constraints on the Optuna trial, beside the common ones."""

    async def validate(
        self, study: Study, launcher: Launcher, result: SweepResult
    ) -> list[Validation]: ...

    def recommend(self, result: SweepResult) -> Record | None: ...

    def trial_text(self, outcome: TrialOutcome) -> str:
        """What a feasible trial found, as the sweep's progress line says it."""
        ...

    def summary_lines(self, result: SweepResult, recommended: Any) -> list[str]:
        """The sweep's closing summary of the recommendation, in the terminal."""
        ...

    def report_sections(self, result: SweepResult, recommended: Any) -> list[str]:
        """The report's sections on the recommendation (HTML), first in the page."""
        ...

    def validation_note(self, verdict: str) -> str:
        """What the report says of the validation runs ('passed' or 'failed')."""
        ...


S = TypeVar("S", bound=Record)


class EngineObjective(Generic[S]):
    """An objective measured by one run through autotune's engine per trial (a summary
    `S`): a subclass says how to run it on the probe, what it is worth, what makes it
    unfit, and how a validation run compares with the trial."""

    metric: ClassVar[str]
    searched: ClassVar[tuple[str, ...]]
    what: ClassVar[str]  # what the engine runs, for the one sentence: "training steps"
    summary_field: ClassVar[str]  # the field of a trial that holds its summary: "batch"
    # The summary's figures its recommendation repeats, under the same names, and the
    # study's `objective` bound the recommendation states ("max_step_s").
    recommended_figures: ClassVar[tuple[str, ...]]
    bound: ClassVar[str]
    # The validation run as the report says it: what ran again, its value's unit, and
    # the limits it must also keep.
    rerun: ClassVar[tuple[str, str, str]]

    async def measure(self, probe: EngineProbe, study: Study, knobs: dict[str, Any]) -> S:
        raise NotImplementedError

    def value(self, summary: S) -> float:
        raise NotImplementedError

    def error_rate(self, summary: S) -> float:
        raise NotImplementedError

    def measured_s(self, summary: S | None) -> float:
        raise NotImplementedError

    def trial_problem(self, study: Study, summary: S) -> str | None:
        """Why a measured trial is infeasible; None when it is not."""
        raise NotImplementedError

    def validation_problems(self, study: Study, summary: S) -> list[str]:
        """Why a validation run fails besides keeping too little of the trial's value."""
        problem = self.trial_problem(study, summary)
        return [problem] if problem is not None else []

    def shortfall(self, summary: S, expected: float) -> str:
        """The validation's problem when it kept less than VALIDATION_SHARE of `expected`."""
        raise NotImplementedError

    def validation_counts(
        self, study: Study, best: TrialRecord, summary: S | None
    ) -> tuple[int, int, int]:
        """A validation run's parallelism, the rollouts it asked for and those completed."""
        raise NotImplementedError

    def recommendation(
        self, result: SweepResult, best: TrialRecord, summary: S, common: dict[str, Any]
    ) -> Record:
        """The recommendation record: `common` (what `recommend` says of every objective's)
        and the objective's own figures of `summary`."""
        raise NotImplementedError

    def snippets(
        self,
        model: str | None,
        server: dict[str, Any],
        group_size: int,
        summary: S,
        engine: Engine = VLLM,
    ) -> Record:
        """The lines each RL framework, the engine (its launch line) and autotune take for
        the recommendation."""
        raise NotImplementedError

    def figures_text(self, value: float, summary: S) -> str:
        """What a feasible trial found, after its value, as the progress line says it."""
        raise NotImplementedError

    def recommendation_lines(self, rec: Any) -> list[str]:
        """The terminal's lines on what was recommended, between the configuration's line
        and the validation's."""
        raise NotImplementedError

    def recommendation_text(self, rec: Any) -> str:
        """The report's one sentence on what was recommended and what it measured."""
        raise NotImplementedError

    def recommendation_facts(self, rec: Any) -> list[tuple[str, str]]:
        """The report's figures of the recommendation, before whether it was validated."""
        raise NotImplementedError

    def outcome(
        self, knobs: dict[str, Any], summary: S | None, reason: str | None, wall_s: float
    ) -> TrialOutcome:
        """A trial's outcome: worth its value when measured and fit, else 0."""
        measured: dict[str, Any] = {self.summary_field: summary}
        return TrialOutcome(
            knobs=knobs,
            points=[],
            curve=None,
            value=self.value(summary) if summary is not None and reason is None else 0.0,
            p95_latency_s=None,
            error_rate=self.error_rate(summary) if summary is not None else 1.0,
            infeasible_reason=reason,
            probe_s=self.measured_s(summary),
            wall_s=wall_s,
            **measured,
        )

    def validation(
        self, study: Study, best: TrialRecord, summary: S | None, problems: list[str]
    ) -> Validation:
        """A validation run as recorded (`summary` None: the server did not start)."""
        parallelism, rollouts, completed = self.validation_counts(study, best, summary)
        return Validation.rerun(
            best,
            study.objective.max_error_rate,
            problems,
            parallelism=parallelism,
            rollouts=rollouts,
            completed=completed,
            throughput=self.value(summary) if summary is not None else 0.0,
            error_rate=self.error_rate(summary) if summary is not None else 1.0,
            probe_s=self.measured_s(summary),
        )

    def trial_summary(self, best: TrialRecord) -> S | None:
        """The best trial's measured summary, None when it ran none."""
        summary: S | None = getattr(best, self.summary_field)
        return summary

    def server_knobs(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """The drawn knobs the server takes: all but those this objective searches."""
        return {name: value for name, value in knobs.items() if name not in self.searched}

    async def run(self, launcher: Launcher, study: Study, knobs: dict[str, Any]) -> S:
        """The configuration's server started, the objective's run made on it."""
        async with launcher.running(self.server_knobs(knobs)) as probe:
            if not isinstance(probe, EngineProbe):  # the study's validation admits no other
                raise UsageError(
                    f"objective {self.metric} runs {self.what} through autotune's engine."
                )
            return await self.measure(probe, study, knobs)

    async def run_trial(
        self, study: Study, launcher: Launcher, knobs: dict[str, Any], context: TrialContext
    ) -> TrialOutcome:
        """Start the configuration, make its run, stop it; a refusal becomes an outcome."""
        started = time.perf_counter()
        try:
            summary = await self.run(launcher, study, knobs)
        except ServerStartupError as error:
            return self.outcome(knobs, None, error.reason, time.perf_counter() - started)
        reason = self.trial_problem(study, summary)
        return self.outcome(knobs, summary, reason, time.perf_counter() - started)

    def record_trial(self, study: Study, trial: Any, outcome: TrialOutcome) -> None:
        return None

    async def validate(
        self, study: Study, launcher: Launcher, result: SweepResult
    ) -> list[Validation]:
        """The best trial's run made again on a fresh server: it passes when it keeps
        VALIDATION_SHARE of the trial's value within the trial's limits. None when
        validate_rollouts is 0."""
        best = result.best()
        if study.budget.rollouts_to_validate(study.target.kind) == 0 or not (
            best and self.trial_summary(best)
        ):
            return []
        try:
            summary = await self.run(launcher, study, best.knobs)
        except ServerStartupError as error:
            return [
                self.validation(study, best, None, [f"the server did not start: {error.reason}"])
            ]
        problems = []
        expected = best.value or 0.0
        if self.value(summary) < VALIDATION_SHARE * expected:
            problems.append(self.shortfall(summary, expected))
        problems += self.validation_problems(study, summary)
        return [self.validation(study, best, summary, problems)]

    def best_measured(
        self, result: SweepResult
    ) -> tuple[TrialRecord, S, int, dict[str, Any], list[Validation]] | None:
        """The best trial and its summary, the group size, the server's knobs and the
        trial's validation runs: what a recommendation is made of; None when no feasible
        trial made its run."""
        best = result.best()
        summary = self.trial_summary(best) if best is not None else None
        if best is None or summary is None:
            return None
        group_size = int((result.spec or {}).get("workload", {}).get("num_repeats", 1))
        validations = [v for v in result.validations if v.trial == best.number]
        return best, summary, group_size, self.server_knobs(best.knobs), validations

    def recommend(self, result: SweepResult) -> Record | None:
        """The best trial as measured; None when no feasible trial made its run."""
        measured = self.best_measured(result)
        if measured is None:
            return None
        best, summary, group_size, server, validations = measured
        common = {
            "simulated": result.simulated,
            "metric": result.metric,
            "server": server,
            "group_size": group_size,
            **{name: getattr(summary, name) for name in self.recommended_figures},
            self.bound: (result.spec or {}).get("objective", {}).get(self.bound),
            "snippets": self.snippets(
                result.model, server, group_size, summary, result_engine(result)
            ),
            **validation_fields(validations),
        }
        return self.recommendation(result, best, summary, common)

    def trial_text(self, outcome: TrialOutcome) -> str:
        summary: S | None = getattr(outcome, self.summary_field)
        assert summary is not None
        return self.figures_text(outcome.value or 0.0, summary)

    def validation_note(self, verdict: str) -> str:
        what, unit, limits = self.rerun
        return (
            f"The recommended {what} ran again on a fresh server before it was recommended; "
            f"the run {verdict}. It must keep 80% of the trial's {unit}, {limits}."
        )

    def summary_lines(self, result: SweepResult, recommended: Any) -> list[str]:
        """The best configuration, what was recommended on it, the validation and the
        framework lines."""
        return [
            best_configuration_line(recommended.server),
            *self.recommendation_lines(recommended),
            validated_line(recommended.validated, recommended.validations),
            "",
            *framework_lines(recommended.snippets.rows()),
        ]

    def report_sections(self, result: SweepResult, recommended: Any) -> list[str]:
        """The recommendation as measured, and the lines each RL framework takes."""
        if recommended is None:
            return [no_recommendation_section()]
        facts = [
            *self.recommendation_facts(recommended),
            ("validated", validated_word(recommended.validated)),
            *recommended.snippets.rows(),
        ]
        return [
            html.section(
                "Recommendation",
                html.callout(self.recommendation_text(recommended), "verdict"),
                html.definition_list(facts),
            )
        ]


def validated_line(validated: bool | None, validations: list[Validation] | None) -> str:
    """The terminal's 'validated' line, with a failed run's problems."""
    text = {None: "not validated", True: "passed"}.get(validated, "FAILED")
    if validated is False and validations:
        text += ": " + "; ".join(validations[-1].problems)
    return f"validated            {text}"


def validated_word(validated: bool | None) -> str:
    """How the report says whether the recommendation was validated."""
    return {None: "not validated", True: "passed", False: "failed"}[validated]


def framework_lines(rows: list[tuple[str, str]]) -> list[str]:
    """The terminal's framework lines: each name in a column of its own."""
    return [f"{name:<10} {line}" for name, line in rows]


def validation_fields(validations: list[Validation]) -> dict[str, Any]:
    """A recommendation's validation runs, and whether the last one passed."""
    return {
        "validated": validations[-1].passed if validations else None,
        "validations": validations,
    }


def joined(**words: list[str]) -> dict[str, str]:
    """Each framework's line, its words joined by spaces."""
    return {name: " ".join(line) for name, line in words.items()}


def best_configuration_line(server: dict[str, Any]) -> str:
    """The terminal's line naming the recommended server knobs."""
    knobs = ", ".join(f"{k}={v}" for k, v in server.items()) or "(server as it is)"
    return f"best configuration   {knobs}"
