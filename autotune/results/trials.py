"""A study as saved: its trials and curves, the validation run, and the recommendation of
each objective with its snippets.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune.engines import ENGINES
from autotune.results.codec import SCHEMA_VERSION, Record
from autotune.results.probes import CurvePoint
from autotune.results.runs import BatchSummary, LoopSummary, WorkloadRecord


@dataclass(frozen=True, slots=True)
class CurveSummary(Record):
    """Peak, knee and recommendation for one configuration's measured curve."""

    fit: dict[str, float] | None  # lambda, sigma, kappa, r2 of the USL fit
    peak_parallelism: float  # fitted N* inside the range, else the best measured N
    peak_throughput: float
    peak_inside_range: bool
    best_measured_parallelism: int
    best_measured_throughput: float
    recommended_parallelism: int  # 80% of the peak parallelism
    recommended_throughput: float  # what the fitted curve predicts there
    knee_parallelism: float  # where linear scaling (λN) meets the peak throughput
    smallest_parallelism_at_80pct: int  # smallest N whose fitted throughput ≥ 80% of peak
    note: str
    # The server's ceiling (most requests at once) where the curve ran level to it: its
    # peak, and where `recommend: ceiling` runs it (knee.landmarks). None otherwise.
    server_ceiling: int | None = None


@dataclass(frozen=True, slots=True)
class TrialOutcome:
    """What one trial measured (stored in the trial's user attributes)."""

    knobs: dict[str, Any]
    points: list[CurvePoint]
    curve: CurveSummary | None
    value: float
    p95_latency_s: float | None
    error_rate: float
    infeasible_reason: str | None
    probe_s: float
    wall_s: float
    pruned_reason: str | None = None
    min_p95_latency_s: float | None = None  # the lowest of any usable point (SLO constraint)
    min_p95_ttft_s: float | None = None
    min_p99_latency_s: float | None = None
    # The trial whose figures this one reuses (the same effective knobs), not re-measured.
    copied_from: int | None = None
    batch: BatchSummary | None = None  # its training steps (objective informative_groups_per_s)
    loop: LoopSummary | None = None  # its RL loop (objective trained_samples_per_s)


@dataclass(frozen=True, slots=True)
class TrialRecord(Record):
    """One trial of a study: a server configuration and its measured curve."""

    number: int
    # COMPLETE; PRUNED (stopped early: its curve could not reach the best one, see
    # pruned_reason); or FAIL (an infrastructure error; nothing measured counts)
    state: str
    value: float | None
    feasible: bool
    knobs: dict[str, Any]
    points: list[CurvePoint] = field(default_factory=list)
    curve: CurveSummary | None = None
    probe_s: float | None = None
    wall_s: float | None = None
    p95_latency_s: float | None = None
    error_rate: float | None = None
    infeasible_reason: str | None = None
    pruned_reason: str | None = None
    # The hardware's ceiling for this configuration in output tokens/s (hardware/
    # roofline.py: every engine's batch at its fastest step) and the share of it the
    # trial's best point reached; None where the GPU, the model or the lengths are unknown.
    roofline_output_tokens_per_s: float | None = None
    roofline_share: float | None = None
    # Objective informative_groups_per_s: the trial's training steps instead of a curve.
    batch: BatchSummary | None = None
    # Objective trained_samples_per_s: the trial's RL loop instead of a curve.
    loop: LoopSummary | None = None
    # The trial whose figures this one reuses (the sampler proposed its configuration
    # again): not measured again, no launch.
    copied_from: int | None = None

    @property
    def complete(self) -> bool:
        return self.state == "COMPLETE"

    @property
    def split(self) -> str | None:
        """`4x2`: engines × tensor-parallel size, in a study that split a GPU budget."""
        if "num_engines" not in self.knobs:  # config.knobs.NUM_ENGINES
            return None
        return f"{self.knobs['num_engines']}x{self.knobs.get('tensor_parallel_size', 1)}"

    @property
    def usable(self) -> bool:
        """Complete, feasible, with a fitted curve: it can be recommended."""
        return self.complete and self.feasible and self.curve is not None


@dataclass(frozen=True, slots=True)
class Validation(Record):
    """One validation run: the recommended configuration held at one parallelism for
    `rollouts` rollouts, its figures beside what the sweep predicted there."""

    trial: int  # whose configuration
    knobs: dict[str, Any]
    parallelism: int
    rollouts: int  # asked for
    completed: int
    throughput: float  # in the study's metric
    throughput_ci: tuple[float, float] | None
    predicted_throughput: float
    predicted_interval: tuple[float, float] | None  # 95%, the curve fit's bootstrap
    error_rate: float
    max_error_rate: float
    p50_latency_s: float | None
    p95_latency_s: float | None
    latency_dispersion: float | None  # p95 ÷ p50 rollout latency
    dispersion_limit: float | None  # what the sweep's own points allow
    probe_s: float
    passed: bool
    problems: list[str]  # one phrase per failed check; empty when it passed
    # The sweep's nearest point of this configuration re-measured now ÷ as the sweep
    # measured it, where a run fell below its prediction (1: the machine is as it was);
    # below 1 the prediction was scaled by it. None: not measured.
    machine_speed: float | None = None

    @classmethod
    def rerun(
        cls,
        trial: TrialRecord,
        max_error_rate: float,
        problems: list[str],
        *,
        parallelism: int,
        rollouts: int,
        completed: int,
        throughput: float,
        error_rate: float,
        probe_s: float,
    ) -> Validation:
        """The trial's own measurement run again (a goodput or loop study's validation):
        no curve, so no interval, latency or dispersion to hold it to."""
        return cls(
            trial=trial.number,
            knobs=trial.knobs,
            parallelism=parallelism,
            rollouts=rollouts,
            completed=completed,
            throughput=throughput,
            throughput_ci=None,
            predicted_throughput=trial.value or 0.0,
            predicted_interval=None,
            error_rate=error_rate,
            max_error_rate=max_error_rate,
            p50_latency_s=None,
            p95_latency_s=None,
            latency_dispersion=None,
            dispersion_limit=None,
            probe_s=probe_s,
            passed=not problems,
            problems=problems,
        )


@dataclass(frozen=True, slots=True)
class SweepResult(Record):
    """A study as saved: every trial, what was searched and how; the rest derives from it."""

    kind: ClassVar[str] = "sweep"
    study: str
    created_at: float
    started_at: float
    simulated: bool
    storage: str  # without a password
    # Trials this run did not measure: finished before a resume, or copied from a trial
    # of a configuration the study had measured already (the sampler proposed it again).
    trials_reused: int
    metric: str  # rollouts_per_s | output_tokens_per_s
    max_error_rate: float
    model: str | None  # what the recommended `vllm serve` line names
    spec: dict[str, Any]  # the validated study file, secrets hidden
    trials: list[TrialRecord]
    importances: dict[str, float]
    machine: dict[str, str]
    schema_version: int = SCHEMA_VERSION
    p95_latency_slo_s: float | None = None
    p95_ttft_slo_s: float | None = None
    p99_latency_slo_s: float | None = None
    # The validation runs of the recommendation, in order: each failed one stepped down.
    validations: list[Validation] = field(default_factory=list)
    workload: WorkloadRecord | None = None  # what every trial measured

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    @property
    def pruned(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.state == "PRUNED"]

    @property
    def completed(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.complete]

    def best(self) -> TrialRecord | None:
        """The feasible complete trial with the highest objective."""
        feasible = [t for t in self.completed if t.feasible]
        return max(feasible, key=lambda t: t.value or 0.0, default=None)

    @property
    def probe_s_total(self) -> float:
        """Probe time of every trial and of the validation runs."""
        return sum(t.probe_s or 0.0 for t in self.trials) + sum(v.probe_s for v in self.validations)


@dataclass(frozen=True, slots=True)
class Peak(Record):
    parallelism: float
    throughput: float
    inside_searched_range: bool
    best_measured_parallelism: int
    best_measured_throughput: float
    parallelism_interval: tuple[float, float] | None = None  # 95%, bootstrap of the fit
    throughput_interval: tuple[float, float] | None = None


# What set a recommended parallelism (Recommended.bound_by), besides an SLO or validation.
HEADROOM_RULE = "80% of peak"


CEILING_RULE = "server ceiling"


@dataclass(frozen=True, slots=True)
class Recommended(Record):
    parallelism: int
    predicted_throughput: float
    rule: str
    # Which rule set the parallelism: "80% of peak", "server ceiling", "p95 latency SLO",
    # "p95 TTFT SLO" or "validation" (a failed validation run stepped it down).
    bound_by: str = HEADROOM_RULE
    parallelism_interval: tuple[float, float] | None = None  # of the 80% rule, 95%
    throughput_interval: tuple[float, float] | None = None  # predicted there, 95%
    p95_latency_s: float | None = None  # expected there (interpolated between points)
    p95_ttft_s: float | None = None


@dataclass(frozen=True, slots=True)
class Snippets(Record):
    """The rollouts/s recommendation's lines: NeMo Gym's, the engine's launch line
    (`serve`), OpenRLHF's, autotune's own, and SGLang's RL frameworks' (slime, verl,
    AReaL) where the engine is SGLang; TensorRT-LLM's options file as YAML."""

    renamed: ClassVar[dict[str, str]] = {"vllm": "serve"}  # files written before engines
    nemo_gym: str
    serve: str
    openrlhf: str
    openrlhf_note: str
    autotune: str
    engine: str = "vllm"
    frameworks: dict[str, str] = field(default_factory=dict)
    options: str = ""


@dataclass(frozen=True, slots=True)
class PrefixCachingGain(Record):
    """The best throughput measured with prefix caching on and off at one GPU split
    (engines × TP): what the cache bought."""

    split: str  # `4x2`: engines × tensor-parallel size
    on: float  # in the study's metric
    off: float

    @property
    def gain(self) -> float:
        """on ÷ off: 1.3 is 30% more with caching on."""
        return self.on / self.off if self.off > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Recommendation(Record):
    """The best configuration at 80% of its peak (or lower, where a latency budget or a
    failed validation says so), with lines to paste into each tool."""

    simulated: bool
    metric: str
    server: dict[str, Any]
    peak: Peak
    recommended: Recommended
    knee_parallelism: float
    smallest_parallelism_at_80pct_of_peak_throughput: int
    note: str
    snippets: Snippets
    # The rule the study did not choose (80% of the peak, or the server's ceiling) where
    # the curve has both, with its predicted throughput: what the headroom costs.
    alternative: Recommended | None = None
    knee_interval: tuple[float, float] | None = None  # 95%, bootstrap of the fit
    p95_latency_slo_s: float | None = None
    p95_ttft_slo_s: float | None = None
    p99_latency_slo_s: float | None = None
    # None: not validated (budget.validate_rollouts: 0, or a file from before validation);
    # else whether the last validation run passed. `validations` holds every run.
    validated: bool | None = None
    validations: list[Validation] = field(default_factory=list)
    # How the GPUs are spent: engines (replicas) × tensor-parallel size, whether prefix
    # caching is on (None: not searched), and the in-flight requests each engine gets.
    engines: int = 1
    tensor_parallel_size: int | None = None
    enable_prefix_caching: bool | None = None
    parallelism_per_engine: int | None = None
    prefix_caching: PrefixCachingGain | None = None  # both measured at the best split
    roofline_share: float | None = None  # the best trial's, of its hardware's roofline
    workload: WorkloadRecord | None = None  # what the prediction holds for


FRAMEWORKS = {"openrlhf": "OpenRLHF", "verl": "verl", "slime": "slime", "nemo_rl": "NeMo RL"}
FRAMEWORKS |= {"autotune": "autotune"}


class FrameworkLines:
    """A recommendation's lines for each RL framework, one field a framework, and the
    engine's launch line (`serve`, named by `engine`)."""

    __slots__ = ()
    renamed: ClassVar[dict[str, str]] = {"vllm": "serve"}  # files written before engines

    def rows(self) -> list[tuple[str, str]]:
        """Each framework's name and its line, in the order of the fields."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]  # a dataclass mixin
        engine = ENGINES[getattr(self, "engine", "vllm")].title
        names = {**FRAMEWORKS, "serve": engine}
        return [(names[f.name], getattr(self, f.name)) for f in fields if f.name != "engine"]


@dataclass(frozen=True, slots=True)
class StepSnippets(FrameworkLines, Record):
    """The recommendation in each RL framework's own names (only flags found in its docs
    or code: OpenRLHF 0.9+, verl's DAPO recipe and fully-async trainer, slime)."""

    openrlhf: str
    verl: str
    slime: str
    serve: str
    autotune: str
    engine: str = "vllm"


@dataclass(frozen=True, slots=True)
class StepsRecommendation(Record):
    """The best goodput trial: its server knobs, batch settings and measured steps."""

    simulated: bool
    metric: str
    server: dict[str, Any]
    group_size: int
    batch_groups: int
    over_sample: float
    carry_over: bool
    informative_groups_per_s: float
    step_p95_s: float | None
    busy_share: float | None
    tail_share: float | None
    staleness_mean: float | None
    cancelled_tokens: int | None
    max_step_s: float | None
    snippets: StepSnippets
    validated: bool | None = None  # None: not validated (budget.validate_rollouts: 0)
    validations: list[Validation] | None = None


@dataclass(frozen=True, slots=True)
class LoopSnippets(FrameworkLines, Record):
    """The loop's recommendation in each RL framework's own names (each read from its
    repository: OpenRLHF 0.10.2+, verl's fully-async trainer, NeMo RL's GRPO config)."""

    openrlhf: str
    verl: str
    nemo_rl: str
    serve: str
    autotune: str
    engine: str = "vllm"


@dataclass(frozen=True, slots=True)
class LoopRecommendation(Record):
    """The best loop trial: its mode and bounds, server knobs and measured figures, with
    its gain over the best trial of each other mode."""

    simulated: bool
    metric: str
    server: dict[str, Any]
    group_size: int
    mode: str
    batch_groups: int
    max_ahead: int | None
    max_staleness: int | None
    pause_mode: str
    trained_samples_per_s: float
    best_by_mode: dict[str, float]  # the best feasible trial's value of each mode tried
    gain_over_modes: dict[str, float]  # this value ÷ each other mode's best
    staleness_p95: float | None
    staleness_max: int | None
    trainer_idle_share: float
    generator_idle_share: float
    sync_share: float
    staleness_limit: int | None
    snippets: LoopSnippets
    validated: bool | None = None  # None: not validated (budget.validate_rollouts: 0)
    validations: list[Validation] | None = None
