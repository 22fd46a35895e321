"""Result types: frozen, versioned, saved as JSON by one writer and read back by one reader.

Every job's output (terminal text, HTML, CSV, the recommendation) is rebuilt from these
types alone, so a saved file is the whole truth about a run. `schema_version` is
checked on load: a file from another version is refused in one sentence.
"""

from __future__ import annotations

import dataclasses
import math
import types
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints

import orjson

from autotune.errors import UsageError

SCHEMA_VERSION = 2
STAGES = ("queue", "model", "ttft", "tool", "verify_wait", "verify", "total")

R = TypeVar("R", bound="Record")


class ResultFormatError(UsageError):
    """A saved file is not a result this version of autotune can read."""


# -- one codec -----------------------------------------------------------------------------


def _decode(kind: Any, value: Any) -> Any:
    """`value` (parsed JSON) as the annotated type `kind`: nested records, lists, tuples."""
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        options = [option for option in get_args(kind) if option is not type(None)]
        return _decode(options[0], value) if len(options) == 1 else value
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_dict(value)
    if origin in (list, Sequence):
        (item,) = get_args(kind)
        return [_decode(item, v) for v in _expect(value, list)]
    if origin is tuple:
        items, args = _expect(value, list), get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in items)
        if len(args) == len(items):
            return tuple(_decode(arg, v) for arg, v in zip(args, items, strict=True))
        return tuple(items)
    if origin in (dict, Mapping):
        _, item = get_args(kind)
        return {str(k): _decode(item, v) for k, v in _expect(value, dict).items()}
    if kind is float:
        if value is None:  # written for NaN
            return math.nan
        if isinstance(value, int) or value in _INFINITIES:
            return float(value)
    return value


def _expect(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


class Record:
    """Mixin of the result dataclasses: `to_dict` for the writer, `from_dict` for the reader."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Raises KeyError or TypeError on a malformed dict (load_result turns them into
        one sentence)."""
        hints = get_type_hints(cls)
        values = {}
        for item in dataclasses.fields(cls):  # type: ignore[arg-type]
            if item.name in data:
                values[item.name] = _decode(hints[item.name], data[item.name])
            elif (
                item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
            ):
                raise KeyError(item.name)
        return cls(**values)


_INFINITIES = ("Infinity", "-Infinity")


def _finite_or_named(value: Any) -> Any:
    """`value` with every infinity as the string JSON has no number for: an unbounded
    interval must read back unbounded, not as the null orjson writes for it."""
    if isinstance(value, float) and math.isinf(value):
        return _INFINITIES[value < 0]
    if isinstance(value, dict):
        return {k: _finite_or_named(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_named(v) for v in value]
    return value


def to_json(value: Record | Mapping[str, Any]) -> bytes:
    """The one JSON writer of saved files: indented, UTF-8, NaN written as null and an
    infinity as "Infinity" or "-Infinity" (read back as floats)."""
    data = value.to_dict() if isinstance(value, Record) else value
    return orjson.dumps(
        _finite_or_named(data), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
    )


def save(value: Record | Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(to_json(value))
    return path


def read_json(path: Path) -> Any:
    """A JSON file's content; a missing or malformed file is one sentence."""
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist; check the path.") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; pass the JSON file.") from None
    except orjson.JSONDecodeError as error:
        raise UsageError(
            f"{path} is not valid JSON ({error}); pass a file autotune saved."
        ) from None


def machine_identity() -> dict[str, str]:
    """Where a result was measured (reports show it; bench compares its own fingerprint)."""
    import platform

    from autotune import __version__

    return {"host": platform.node(), "python": platform.python_version(), "autotune": __version__}


# -- rollouts and collect --------------------------------------------------------------------


def stage_durations(t: Mapping[str, float | None]) -> Iterator[tuple[str, float]]:
    """Each stage's seconds for one rollout, from its timestamps (ttft only if streamed;
    tool only for a multi-turn rollout, whose model stage is its time outside the tools)."""
    queued, start, first = t["queued"] or 0.0, t["model_start"] or 0.0, t["first_token"]
    model_end, verify_start = t["model_end"] or 0.0, t["verify_start"] or 0.0
    verify_end = t["verify_end"] or 0.0
    tool = t.get("tool")
    yield "queue", start - queued
    yield "model", model_end - start - (tool or 0.0)
    if first is not None:
        yield "ttft", first - start
    if tool is not None:
        yield "tool", tool
    yield "verify_wait", verify_start - model_end
    yield "verify", verify_end - verify_start
    yield "total", verify_end - queued


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class StageLatency(Record):
    """Latency of one stage, seconds."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None = None  # older files lack it; a p99 latency SLO reads it

    @classmethod
    def of(cls, values: Sequence[float]) -> StageLatency:
        mean = sum(values) / len(values) if values else None
        p50, p95, p99 = (percentile(values, q) for q in (50, 95, 99))
        return cls(len(values), mean, p50, p95, p99)


def no_latencies() -> dict[str, StageLatency]:
    """Every stage without a sample (what a probe that cannot time stages reports)."""
    return {stage: StageLatency.of([]) for stage in STAGES}


@dataclass(slots=True)
class StageSamples:
    """Per-stage latency samples, kept compact (8 bytes each) for long runs."""

    samples: dict[str, array] = field(
        default_factory=lambda: {stage: array("d") for stage in STAGES}
    )

    def add(self, stage: str, value: float) -> None:
        self.samples[stage].append(value)

    def summarise(self) -> dict[str, StageLatency]:
        return {stage: StageLatency.of(values) for stage, values in self.samples.items()}


@dataclass(frozen=True, slots=True)
class ReplicaStats(Record):
    """One replica's share of a run or a probe's window, when several serve the model:
    what the client saw, and what its own /metrics and GPUs said over the same time."""

    index: int
    url: str
    completed: int  # model calls answered
    failed: int  # model calls that failed (each retry counted)
    calls_per_s: float
    output_tokens_per_s: float
    mean_latency_s: float | None  # of a model call
    up: bool  # in rotation at the end
    times_down: int  # taken out of rotation this many times
    down_reason: str | None = None
    server: dict[str, float] = field(default_factory=dict)  # its /metrics, means and deltas
    gpus: list[int] = field(default_factory=list)  # the GPUs it runs on, when known
    gpu: dict[str, float] = field(default_factory=dict)  # NVML over those GPUs, means

    @property
    def prefix_cache_hit_share(self) -> float | None:
        """Prompt tokens served from the prefix cache ÷ prompt tokens looked up."""
        queries = self.server.get("prefix_cache_queries")
        if not queries:
            return None
        return self.server.get("prefix_cache_hits", 0.0) / queries


@dataclass(frozen=True, slots=True)
class GroupSummary(Record):
    """A run's GRPO groups (the `--num-repeats` samples of one prompt), what an RL trainer
    consumes. A group is complete when each sample completed with a reward, informative
    when those rewards differ (zero advantage otherwise: dynamic sampling drops it)."""

    size: int
    complete: int
    informative: int
    incomplete: int  # a sample failed or was cancelled
    informative_share: float | None  # of complete groups
    informative_groups_per_s: float  # RL goodput
    informative_tokens_per_s: float  # their output tokens
    completion_s: StageLatency  # first sample's start to last sample's end
    straggler_ratio: StageLatency  # slowest sample ÷ the median one


@dataclass(frozen=True, slots=True)
class BatchStep(Record):
    """One training step's generation, as a synchronous trainer waits for it."""

    index: int
    generation_s: float
    tail_share: float | None  # the share of the step after 90% of its samples ended
    busy_share: float | None  # mean running requests ÷ capacity over the step
    tail_busy_share: float | None  # ... over its tail: the server idling on stragglers
    groups: int  # complete groups handed to the trainer
    informative: int
    cancelled: int  # samples cancelled when the step ended


@dataclass(frozen=True, slots=True)
class BatchSummary(Record):
    """Batch-synchronous collection (`collect --batch-groups`) and its remedies."""

    batch_groups: int
    over_sample: float
    carry_over: bool
    capacity: int  # the busy share's denominator: --parallelism, else samples launched
    busy_source: str  # "server" (its /metrics running gauge) or "client" (its own calls)
    steps: list[BatchStep]
    step_s: StageLatency
    tail_share: float | None  # mean over steps
    busy_share: float | None
    informative_groups_per_s: float
    cancelled_samples: int
    cancelled_tokens: int | None  # generated for nothing: the server's count less kept rows'
    staleness_mean: float | None  # steps between a used group's launch and its step
    staleness_max: int | None
    completed_samples: int = 0
    failed_samples: int = 0

    @property
    def error_rate(self) -> float:
        """Failed samples ÷ those that ended (cancelled ones did not end: they were stopped)."""
        ended = self.completed_samples + self.failed_samples
        return self.failed_samples / ended if ended else 0.0


@dataclass(frozen=True, slots=True)
class LoopStep(Record):
    """One trainer step of the RL loop, its times in seconds from the loop's start: the
    HTML report draws them as the generation, training and sync lanes."""

    index: int
    version: int  # the policy version the step trains (syncs made before it)
    batch_ready_at: float  # when its B groups were there: the trainer waited until then
    wait_s: float  # how long the trainer waited for them
    train_start: float
    train_end: float
    sync_start: float
    sync_end: float
    pause_s: float  # the server's answer to /pause (wait: the drain), or colocated to /sleep
    resume_s: float  # ... to /resume, or colocated to /wake_up
    transfer_s: float  # the weight transfer itself
    samples: int  # trained on
    dropped_stale: int  # samples of groups older than --max-staleness, dropped
    staleness: list[int]  # each trained group's versions behind the trainer


@dataclass(frozen=True, slots=True)
class LoopSummary(Record):
    """What the RL loop trained and where its time went (`autotune loop --json`)."""

    mode: str
    batch_groups: int
    group_size: int
    pause_mode: str
    pause_source: str  # "server" (its /pause and /resume) or "client" (no new requests only)
    max_ahead: int
    max_staleness: int | None
    started_at: float  # Unix time of the loop's start: the steps' times count from it
    elapsed_s: float
    steps: list[LoopStep]
    trained_samples: int
    trained_samples_per_s: float  # the objective
    trainer_idle_share: float  # waiting for a batch
    generator_idle_share: float  # no sample in flight
    sync_share: float  # pause to resume, the sleep and wake-up of the colocated mode included
    staleness_histogram: dict[str, int]  # versions behind → samples trained
    staleness_p50: float | None
    staleness_p95: float | None
    staleness_max: int | None
    dropped_stale_samples: int
    aborted_samples: int  # ended by a pause in abort mode, and sent again
    failed_samples: int
    cancelled_samples: int  # in flight when the loop ended
    untrained_samples: int  # complete when the loop ended, never trained on
    pause_s: StageLatency  # the server's answers to /pause (or /sleep), measured
    resume_s: StageLatency  # ... to /resume (or /wake_up)
    output_tokens: int
    model: str
    base_url: str
    simulated: bool
    output: str | None
    generating: list[tuple[float, float]] = field(default_factory=list)  # samples in flight


@dataclass(frozen=True, slots=True)
class CollectSummary(Record):
    """What a collection run did; `--json` prints exactly this."""

    completed: int
    failed: int
    skipped: int
    elapsed_s: float
    rollouts_per_s: float
    output_tokens_per_s: float
    input_tokens: int
    output_tokens: int
    mean_reward: float | None
    latency_s: dict[str, StageLatency]
    errors_by_class: dict[str, int]
    retries_by_class: dict[str, int]
    parallelism: int | None
    model: str
    base_url: str
    simulated: bool
    output: str | None
    rate_limited_responses: int = 0  # HTTP 429 answers, every attempt counted
    # The adaptive concurrency limit (None: calls ran at a fixed parallelism): how often
    # refusals lowered it, how low it went, where it ended.
    concurrency_decreases: int = 0
    concurrency_limit_min: int | None = None
    concurrency_limit_final: int | None = None
    replicas: list[ReplicaStats] = field(default_factory=list)  # several --base-url only
    cancelled: int = 0  # samples cancelled by a batch step's end (--over-sample)
    groups: GroupSummary | None = None  # --num-repeats above 1
    batch: BatchSummary | None = None  # --batch-groups
    # Multi-turn rollouts (--tools): calls made, and those answered with an error status
    # (fed back to the model, or failing the rollout, as --tool-errors says).
    tool_calls: int = 0
    tool_errors: int = 0
    tool_errors_treatment: str | None = None
    drift: DriftWarning | None = None  # --expect/--expect-rate: the warning, if it fired
    schema_version: int = SCHEMA_VERSION


# -- a collect watched while it runs (autotune/live/) ---------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadRecord(Record):
    """The tasks and requests a throughput was measured on. A run holds a sweep's
    prediction only on the same ones: other prompts (another prefix cache), lengths,
    repeats or request fields move throughput with nothing wrong."""

    input: str | None  # the task file's path as given; None: synthetic tasks
    input_sha256: str | None  # its content, so a copy elsewhere still matches
    synthetic_tasks: int | None
    prompt_tokens: tuple[int, int] | None  # synthetic: mean, std
    output_tokens: tuple[int, int] | None
    seed: int | None
    limit: int | None
    num_repeats: int
    extra_body: dict[str, Any]  # the request fields sent (ignore_eos included where automatic)
    api: str
    stream: bool
    verifier: str

    def differences(self, run: WorkloadRecord, where: str = "the sweep") -> list[str]:
        """How `run` differs from this workload, a phrase each ("output tokens 256±64 here,
        128±32 in the sweep"); none: the same workload."""

        def shown(name: str, value: Any) -> str:
            if value is None:
                return "none"
            if name in ("prompt_tokens", "output_tokens"):
                return f"{value[0]}±{value[1]}"
            if name == "extra_body":
                return orjson.dumps(value).decode() if value else "none"
            return str(value)

        found = []
        for item in dataclasses.fields(self):
            name = item.name
            if name == "limit":
                continue  # fewer of the same tasks: each is the same work
            if name == "input" and run.input_sha256 == self.input_sha256:
                continue  # the same tasks under another name
            ours, theirs = getattr(run, name), getattr(self, name)
            if isinstance(ours, list):
                ours = tuple(ours)
            if isinstance(theirs, list):
                theirs = tuple(theirs)
            if ours != theirs:
                label = name.replace("_", " ").replace("sha256", "content")
                found.append(f"{label} {shown(name, ours)} here, {shown(name, theirs)} in {where}")
        return found


@dataclass(frozen=True, slots=True)
class Expectation(Record):
    """The throughput a collect should hold, in rollouts/s: a recommendation's prediction
    with its interval, or a rate given on the command line. `note` says where the
    interval came from (a recommendation saves none: it is derived, and says how)."""

    rollouts_per_s: float
    low: float
    high: float
    parallelism: int | None
    source: str
    note: str
    workload: WorkloadRecord | None = None  # what the prediction was measured on


@dataclass(frozen=True, slots=True)
class DriftWarning(Record):
    """Steady-state throughput stayed below the expectation for `windows` windows in a row."""

    t_s: float  # seconds since the run began, at the end of the last window below
    windows: int
    window_s: float
    rollouts_per_s: float  # the last window's steady-state rate
    rollouts_per_s_ci: tuple[float, float]
    expected_low: float
    stage: str | None  # the stage whose mean latency grew most since the first window
    stage_before_s: float | None
    stage_now_s: float | None
    message: str
    # How this run's workload differs from the one the expectation was measured on; any
    # difference makes the shortfall the workload's to explain first, not drift.
    workload_differs: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LiveSample(Record):
    """One look at a running collect: a line of `<output>_stats.jsonl`, a point of the
    collect report. Totals count from the run's start; `window_*` cover the time since the
    previous sample. The last sample of a run carries the closing summary, exactly."""

    at: float  # time.time()
    t_s: float  # seconds since the run began
    completed: int
    failed: int
    in_flight: int
    input_tokens: int
    output_tokens: int
    mean_reward: float | None
    errors_by_class: dict[str, int]
    retries_by_class: dict[str, int]
    rate_limited_responses: int
    limiter_wait_s: float  # waiting for --rpm/--tpm
    pool_wait_s: float  # getting a connection from the pool (a wait for a free one, or a connect)
    concurrency_limit: int | None
    window_s: float
    window_rollouts_per_s: float
    window_output_tokens_per_s: float
    window_latency_s: dict[str, StageLatency]
    steady_rollouts_per_s: tuple[float, float, float] | None = None  # rate, 95% low, high
    cancelled: int = 0  # samples a batch step's end cancelled (--over-sample)
    groups_complete: int | None = None  # GRPO groups (--num-repeats above 1)
    groups_informative: int | None = None
    window_informative_groups_per_s: float | None = None  # RL goodput since the last sample
    drift: DriftWarning | None = None  # on the first sample after the warning
    summary: CollectSummary | None = None  # the last sample only


@dataclass(frozen=True, slots=True)
class CollectResult(Record):
    """A finished collect as `collect --report DIR` saves it: the summary, the samples taken
    while it ran, and what the drift watch expected and found."""

    kind: ClassVar[str] = "collect"
    created_at: float
    summary: CollectSummary
    samples: list[LiveSample]
    expectation: Expectation | None
    drift: DriftWarning | None
    drift_windows_counted: int  # steady-state windows the drift watch compared
    settings: dict[str, Any]
    machine: dict[str, str]
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True, slots=True)
class LoopResult(Record):
    """A finished `autotune loop` as it saves it (loop.json): the summary, the trainer's
    settings and the machine; its HTML page is rebuilt from this alone."""

    kind: ClassVar[str] = "loop"
    created_at: float
    summary: LoopSummary
    settings: dict[str, Any]
    machine: dict[str, str]
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}


# -- probes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeBlock(Record):
    """One block of a probe measured on its own: diagnose measures the low and the high
    parallelism in turn, so a block and the other parallelism's next block form a pair
    measured under the same conditions."""

    at: float  # when its measured window began (epoch seconds; ordering the blocks)
    rollouts_per_s: float
    rollouts_per_s_ci: tuple[float, float]
    batches: int
    measured_s: float
    latency_p50_s: float | None  # the whole rollout's, over the block's window
    latency_p95_s: float | None
    # Where rollouts were too long to time by completions: the output tokens/s the block
    # was timed in (its rollouts/s is this ÷ the tokens a finished rollout had).
    output_tokens_per_s: float | None = None
    output_tokens_per_s_ci: tuple[float, float] | None = None
    stop_reason: str = ""  # why its window ended: precision, time cap, ... (see Window)

    @property
    def rate(self) -> tuple[float, float, int]:
        """(rate, halfwidth of its 95% interval, batches): what `stats` pairs."""
        return self.rollouts_per_s, self.rollouts_per_s_ci[1] - self.rollouts_per_s, self.batches

    @property
    def token_rate(self) -> tuple[float, float, int] | None:
        """The same in output tokens/s, where the block was timed in tokens."""
        if self.output_tokens_per_s is None or self.output_tokens_per_s_ci is None:
            return None
        rate = self.output_tokens_per_s
        return rate, self.output_tokens_per_s_ci[1] - rate, self.batches

    @property
    def latency_dispersion(self) -> float | None:
        if not self.latency_p50_s or self.latency_p95_s is None:
            return None
        return self.latency_p95_s / self.latency_p50_s


@dataclass(frozen=True, slots=True)
class ProbeResult(Record):
    """Everything one probe measured at one parallelism. Probes that cannot see a stage
    (a user's command, the virtual engine) leave its fields at their defaults."""

    parallelism: int
    rollouts_per_s: float
    rollouts_per_s_ci: tuple[float, float]
    output_tokens_per_s: float
    error_rate: float
    completed: int
    failed: int
    measured_s: float
    warmup_s: float
    stop_reason: str  # converged | time cap | server died | rows timed | whole run timed | ...
    latency_s: dict[str, StageLatency] = field(default_factory=no_latencies)
    errors_by_class: dict[str, int] = field(default_factory=dict)
    rate_limited_responses: int = 0
    retry_after_seen: int = 0
    limiter_wait_share: float = 0.0
    verifier_capacity: int | None = None
    verifier_busy_fraction: float | None = None
    verifier_capacity_rps: float | None = None
    telemetry: dict[str, dict[str, float]] = field(default_factory=dict)  # "source/metric"
    telemetry_unavailable: dict[str, str] = field(default_factory=dict)
    token_check: dict[str, float] | None = None
    series: list[dict[str, Any]] = field(default_factory=list)
    batches: int = 10  # of the rate's batch-means interval (its degrees of freedom + 1)
    latency_cv: float | None = None  # rollout latency's standard deviation ÷ its mean
    timeouts: int = 0  # model calls that timed out in the window, retried or failed
    # Seconds since the probe began: rollouts/s in short bins, and the spans of its
    # phases ("warm-up", "measured", "drain"); an extended probe's runs follow each other.
    timeline: list[tuple[float, float]] = field(default_factory=list)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    replicas: list[ReplicaStats] = field(default_factory=list)  # several replicas only
    # With --num-repeats above 1: the GRPO groups that ended inside the window.
    groups: GroupSummary | None = None
    # Each measure of an engine probe, in order: diagnose pairs them across parallelisms.
    blocks: list[ProbeBlock] = field(default_factory=list)
    # Multi-turn rollouts: tool calls made in the windows, those answered with an error
    # status, and those still hanging when a block's drain gave up on them.
    tool_calls: int = 0
    tool_errors: int = 0
    stuck_tool_calls: int = 0
    # Model calls retried, by failure class, over the probe's whole run (warm-up and
    # drain too): which faults the server showed, though every retry succeeded.
    retries_by_class: dict[str, int] = field(default_factory=dict)

    @property
    def probe_s(self) -> float:
        """How long the probe ran (simulated seconds on the virtual engine)."""
        return self.warmup_s + self.measured_s

    @property
    def latency_dispersion(self) -> float | None:
        """p95 ÷ p50 of the whole rollout's latency: a long tail is a symptom of too much
        parallelism (queueing, retries), as the NeMo Gym guide lists."""
        total = self.latency_s.get("total")
        if total is None or not total.p50 or total.p95 is None:
            return None
        return total.p95 / total.p50


@dataclass(frozen=True, slots=True)
class CurvePoint(Record):
    """One measured point of a configuration's throughput curve (a probe, in short)."""

    parallelism: int
    rollouts_per_s: float
    output_tokens_per_s: float
    error_rate: float
    p95_latency_s: float | None
    probe_s: float
    stop_reason: str
    p50_latency_s: float | None = None
    p95_ttft_s: float | None = None  # streamed requests only
    # The probe's 95% interval of rollouts/s; None when it had too few batches for one.
    rollouts_per_s_ci: tuple[float, float] | None = None
    completed: int | None = None  # rollouts counted in the window
    batches: int | None = None  # of the interval: its degrees of freedom + 1
    # Prompt tokens the server found in its prefix cache ÷ those it looked up, over the
    # window (vLLM's prefix_cache_hits/queries counters); None where it exposes none.
    prefix_cache_hit_share: float | None = None
    p99_latency_s: float | None = None  # rollout latency's; a p99 SLO reads it

    @classmethod
    def of(cls, result: ProbeResult) -> CurvePoint:
        low, high = result.rollouts_per_s_ci
        total = result.latency_s["total"]
        ttft = result.latency_s.get("ttft")
        queries = result.telemetry.get("server/vllm:prefix_cache_queries_total", {})
        hits = result.telemetry.get("server/vllm:prefix_cache_hits_total", {})
        looked_up = queries.get("delta")
        return cls(
            parallelism=result.parallelism,
            rollouts_per_s=result.rollouts_per_s,
            output_tokens_per_s=result.output_tokens_per_s,
            error_rate=result.error_rate,
            p95_latency_s=total.p95,
            p99_latency_s=total.p99,
            probe_s=result.probe_s,
            stop_reason=result.stop_reason,
            p50_latency_s=total.p50,
            p95_ttft_s=ttft.p95 if ttft is not None else None,
            rollouts_per_s_ci=(low, high) if math.isfinite(high) and high > 0 else None,
            completed=result.completed,
            batches=result.batches,
            prefix_cache_hit_share=hits.get("delta", 0.0) / looked_up if looked_up else None,
        )

    def metric(self, name: str) -> float:
        """The objective's figure: rollouts_per_s or output_tokens_per_s."""
        figure = self.output_tokens_per_s if name == "output_tokens_per_s" else self.rollouts_per_s
        return float(figure)

    def metric_interval(self, name: str) -> tuple[float, float] | None:
        """The objective's 95% interval: the rate's, scaled to the metric (tokens per rollout
        are measured over the same window); None when the probe gave none."""
        if self.rollouts_per_s_ci is None or self.rollouts_per_s <= 0:
            return None
        scale = self.metric(name) / self.rollouts_per_s
        return self.rollouts_per_s_ci[0] * scale, self.rollouts_per_s_ci[1] * scale


# -- diagnose --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Thresholds(Record):
    """Every number a verdict rule compares against; each is configurable."""

    scaling_fraction: float = 1 / 3  # parallelism-bound: speedup ≥ 1 + f·(ratio − 1)
    flat_gain: float = 0.20  # saturated: speedup < 1 + flat_gain
    max_error_rate: float = 0.05
    client_cpu_fraction: float = 0.85  # of one core
    client_loop_lag_ms: float = 50.0  # mean of the per-sample worst lag
    limiter_wait_share: float = 0.20
    rate_limited_share: float = 0.01  # 429s per rollout: one stray 429 is not a limit
    verifier_busy_fraction: float = 0.80
    verifier_capacity_use: float = 0.80  # throughput ÷ verifier capacity
    verify_wait_growth: float = 2.0
    tool_share: float = 0.5  # environment-bound: share of a rollout's time in tool calls
    littles_law_match: float = 0.60  # observed model-latency growth ÷ predicted
    server_waiting: float = 0.5  # mean requests waiting in the server's queue
    kv_cache_full: float = 0.90
    gpu_busy_pct: float = 80.0
    timeout_share: float = 0.02  # timed-out model calls per rollout in the high probe
    dispersion_growth: float = 2.0  # latency p95/p50 at the high probe ÷ at the low one
    # tail-bound (batch steps): the tail is at least this share of a step (lower bound of
    # its 95% interval over the steps) while the server runs at most this share of its
    # capacity during it (upper bound)
    tail_share: float = 0.20
    tail_busy_share: float = 0.5
    # A speedup within this share of the parallelism-bound threshold is on it: the
    # interval must clear the threshold by this much, or no probe length could decide.
    threshold_margin: float = 0.03

    def parallelism_bound_speedup(self, ratio: float) -> float:
        return 1 + self.scaling_fraction * (ratio - 1)

    def undecided_zone(self, ratio: float) -> tuple[float, float]:
        """The speedups that lie on the parallelism-bound threshold, within its margin."""
        threshold = self.parallelism_bound_speedup(ratio)
        return threshold / (1 + self.threshold_margin), threshold * (1 + self.threshold_margin)


@dataclass(frozen=True, slots=True)
class Evidence(Record):
    """One measured number beside the threshold it was compared with."""

    name: str
    value: float
    threshold: float
    comparison: str  # ">=" or "<" or ">"
    met: bool
    meaning: str
    unit: str = ""  # how `quantity` rounds it: share, ×, ms, count, or "" (3 digits)

    def summary(self) -> str:
        """The number against its threshold, e.g. `speedup = ×3.76 (threshold >= ×2.00)`."""
        return f"{self._compared()})"

    def text(self) -> str:
        mark = "yes" if self.met else "no"
        return f"{self._compared()}: {mark}) — {self.meaning}"

    def _compared(self) -> str:
        return (
            f"{self.name} = {quantity(self.value, self.unit)} "
            f"(threshold {self.comparison} {quantity(self.threshold, self.unit)}"
        )


def quantity(value: float, unit: str = "") -> str:
    """A measured number rounded to what it means: a share as a percentage, a ratio to
    two decimals, milliseconds and counts whole, anything else to three digits."""
    if math.isnan(value):
        return "—"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if unit == "share":
        percent = value * 100
        return f"{percent:.0f}%" if abs(percent) >= 10 or percent == 0 else f"{percent:.2g}%"
    if unit == "×":
        return f"×{value:.2f}"
    if unit == "ms":
        return f"{value:,.0f} ms"
    if unit == "count" or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


@dataclass(frozen=True, slots=True)
class Verdict(Record):
    verdict: str
    leaning: bool  # True between "barely moved" and "scaled": a sweep should decide
    speedup: float
    parallelism_ratio: float
    evidence: list[Evidence]
    next_step: str
    notes: list[str] = field(default_factory=list)
    # How sure: the speedup's 95% interval, whether it lies clear of the threshold that
    # separates this verdict from the next, and that in words; for `inconclusive`, the
    # verdicts the interval lies between.
    speedup_interval: tuple[float, float] | None = None
    clear_of_threshold: bool | None = None
    confidence: str = ""
    between: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DiagnoseTarget(Record):
    """What was diagnosed: a server (URL, model) or a user's collector command."""

    base_url: str | None
    model: str | None
    simulated: bool
    api: str | None = None
    stream: bool | None = None
    command: str | None = None
    # The simulator's real seconds per simulated second; every figure saved is already
    # in simulated time (what the simulated server would show in real time).
    time_scale: float | None = None


@dataclass(frozen=True, slots=True)
class DiagnoseWorkload(Record):
    input: str | None
    tasks: int
    num_repeats: int = 1  # rollouts of each task in a row (GRPO groups)
    verifier: str | None = None
    verifier_workers: int | None = None


@dataclass(frozen=True, slots=True)
class DiagnoseSettings(Record):
    low: int
    high: int
    min_s: float
    max_s: float
    target_halfwidth: float
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True, slots=True)
class DiagnoseResult(Record):
    """A diagnosis: the probe pair, the verdict from them, and how they were made."""

    kind: ClassVar[str] = "diagnose"
    created_at: float
    verdict: Verdict
    probes: list[ProbeResult]
    target: DiagnoseTarget
    workload: DiagnoseWorkload
    settings: DiagnoseSettings
    machine: dict[str, str]
    batch: BatchSummary | None = None  # --batch-groups: the training-step probe
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}


# -- sweep -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencySlo:
    """A latency SLO a study may set: `field` on its objective and on the SweepResult, the
    `figure` a curve point (and a trial's lowest, `min_` before it) carries, the quantile
    that figure is (None: its spread is not kept, so its margin is a flat one), and its
    name in words. Every place that applies the SLOs reads them from LATENCY_SLOS."""

    field: str
    figure: str
    quantile: float | None
    label: str

    @property
    def rule(self) -> str:
        """The recommendation's `bound_by` where this SLO lowered it."""
        return f"{self.label} SLO"


LATENCY_SLOS = (
    LatencySlo("p95_latency_slo_s", "p95_latency_s", 0.95, "p95 latency"),
    LatencySlo("p99_latency_slo_s", "p99_latency_s", 0.99, "p99 latency"),
    LatencySlo("p95_ttft_slo_s", "p95_ttft_s", None, "p95 TTFT"),
)


@dataclass(frozen=True, slots=True)
class CurveSummary(Record):
    """Peak, knee and recommendation for one configuration's measured curve."""

    fit: dict[str, float] | None  # lambda, sigma, kappa, r2 of the USL fit
    peak_parallelism: float  # fitted N* inside the range, else the best measured N
    peak_throughput: float
    peak_inside_range: bool
    best_measured_parallelism: int
    best_measured_throughput: float
    recommended_parallelism: int  # 80% of the peak parallelism, or the server's ceiling
    recommended_throughput: float  # what the fitted curve predicts there
    knee_parallelism: float  # where linear scaling (λN) meets the peak throughput
    smallest_parallelism_at_80pct: int  # smallest N whose fitted throughput ≥ 80% of peak
    note: str
    # The server's ceiling (most requests at once) where the best point reached it: the
    # recommendation runs it full instead of at 80% (knee.landmarks). None otherwise.
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
        if "num_engines" not in self.knobs:  # config.ENGINES
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
    nemo_gym: str
    vllm: str
    openrlhf: str
    openrlhf_note: str
    autotune: str


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


@dataclass(frozen=True, slots=True)
class StepSnippets(Record):
    """The recommendation in each RL framework's own names (only flags found in its docs
    or code: OpenRLHF 0.9+, verl's DAPO recipe and fully-async trainer, slime)."""

    openrlhf: str
    verl: str
    slime: str
    vllm: str
    autotune: str


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
class LoopSnippets(Record):
    """The loop's recommendation in each RL framework's own names (each read from its
    repository: OpenRLHF 0.10.2+, verl's fully-async trainer, NeMo RL's GRPO config)."""

    openrlhf: str
    verl: str
    nemo_rl: str
    vllm: str
    autotune: str


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


AnyRecommendation = Recommendation | StepsRecommendation | LoopRecommendation


# -- the reader ------------------------------------------------------------------------------

Saved = DiagnoseResult | SweepResult | CollectResult | LoopResult
SAVED_KINDS: dict[str, type[Saved]] = {
    "diagnose": DiagnoseResult,
    "sweep": SweepResult,
    "collect": CollectResult,
    "loop": LoopResult,
}
SAVED_FILES = {kind: f"{kind}.json" for kind in SAVED_KINDS}


def load_result(path: Path) -> Saved:
    """A saved diagnose, sweep, collect or loop result (the JSON file, or the directory
    holding it)."""
    files = ", ".join(SAVED_FILES.values())
    if path.is_dir():
        found = [path / name for name in SAVED_FILES.values() if (path / name).exists()]
        if not found:
            raise UsageError(f"{path} holds none of {files}; pass a report directory.")
        path = found[0]
    data = read_json(path)
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in SAVED_KINDS:
        raise ResultFormatError(
            f"{path} is not a saved autotune result (no diagnose, sweep, collect or loop "
            f"kind); pass the {files.replace(', loop', ' or loop')} a job wrote."
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultFormatError(
            f"{path} was saved with result schema version {version}, and this autotune reads "
            f"version {SCHEMA_VERSION}; rerun the job to save it anew, or read it with the "
            "autotune version that wrote it."
        )
    try:
        return SAVED_KINDS[kind].from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ResultFormatError(
            f"{path} is not a complete {kind} result ({type(error).__name__}: {error}); "
            "rerun the job to save it anew."
        ) from None
