"""What a collect and a loop run record: their summaries, groups, batch and loop steps,
the workload they ran, live samples and drift warnings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from autotune.results.codec import SCHEMA_VERSION, Record
from autotune.results.stages import ReplicaStats, StageLatency


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
    busy_share: float | None  # mean running requests ÷ the server's batch limit over the step
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
    capacity: int  # the busy share's denominator: the server's batch limit (capacity_source)
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
    # "max_num_seqs", "KV cache" (its capacity ÷ a sample's tokens), or "samples launched"
    # (the server states no limit: pass --server-max-num-seqs)
    capacity_source: str = "samples launched"

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
    groups_informative_tokens: int | None = None  # the informative groups' output tokens
    groups_informative_share: float | None = None  # of the complete groups, so far
    window_informative_groups_per_s: float | None = None  # RL goodput since the last sample
    window_informative_tokens_per_s: float | None = None  # ... in their output tokens
    # Slowest sample ÷ median one of the groups closed since the last sample.
    window_straggler_ratio: StageLatency | None = None
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
