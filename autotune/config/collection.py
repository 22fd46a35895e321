"""What one run is configured by: the workload, request, verifier, probe and server specs
that flags and study files share, and the frozen configs a run reads (`TargetConfig`,
`CollectConfig`), made from the specs by `target_config` and `collect_config` alone.
Why: docs/design/config.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    field_validator,
    model_validator,
)

from autotune.config.fields import (
    Api,
    ApiChoice,
    Count,
    Count0,
    Flag,
    NonNegative,
    Option,
    Positive,
    Share,
    SpecModel,
    Text,
    Tokens,
    _numbers,
    base_url_problem,
    problem,
    sentence,
)
from autotune.config.rl_specs import BatchSpec, LoopSpec
from autotune.errors import UsageError


class SyntheticSpec(SpecModel):
    """Generated tasks for the embedded default: lengths in tokens (~4 characters each).
    A study's `workload.synthetic`; a bench suite's workload spells the same fields flat."""

    what: ClassVar[str] = "a synthetic workload"
    num_tasks: Annotated[
        Count,
        Option(("--synthetic",), "number of synthetic tasks when no --input is given", "N"),
    ] = 1000
    prompt_tokens: Annotated[
        Tokens,
        Option(
            ("--prompt-tokens",),
            "synthetic prompt lengths, normal (STD: a quarter of MEAN when left out)",
            "MEAN[,STD]",
            _numbers,
        ),
    ] = (256, 64)
    output_tokens: Annotated[
        Tokens,
        Option(
            ("--output-tokens",),
            "synthetic output lengths (max_tokens; ignore_eos on the simulator)",
            "MEAN[,STD]",
            _numbers,
        ),
    ] = (256, 64)
    seed: Annotated[Count0, Option(("--seed",), "seed of the synthetic tasks")] = 0


SYNTHETIC = SyntheticSpec()


class VerifierFields(SpecModel):
    """Who rewards a rollout: a study's workload, a suite's probe case and the flags."""

    verifier: Annotated[
        Text | None,
        Option(
            ("--verifier",),
            "none | exact | boxed | mcqa | code | synthetic | file.py:function | "
            "package.module:function | http(s)://host:port/verify "
            "(default: synthetic without --input, else none)",
        ),
    ] = None  # None: synthetic for synthetic tasks, none for a task file
    verifier_workers: Annotated[
        Count | None,
        Option(("--verifier-workers",), "processes for pool verifiers, connections for HTTP ones"),
    ] = None
    verifier_cost_ms: Annotated[
        NonNegative,
        Option(
            ("--verifier-cost-ms",), "CPU milliseconds the synthetic verifier burns per rollout"
        ),
    ] = 0.0

    def verifier_for(self, task_file: Path | None) -> str:
        """The verifier by name: the one given, else synthetic unless tasks come from a file."""
        return self.verifier or ("none" if task_file is not None else "synthetic")


class RequestFields(SpecModel):
    """How model calls are made: a study's workload, a suite's target and the flags."""

    api: Annotated[
        ApiChoice,
        Option(("--api",), "/v1/chat/completions or /v1/completions", "{chat,completions}"),
    ] = "chat"
    stream: Annotated[
        Flag, Option(("--no-stream",), "non-streaming calls (no time-to-first-token)", switch=True)
    ] = True
    timeout_s: Annotated[Positive, Option(("--timeout",), "per-request timeout", "SECONDS")] = 600.0
    max_retries: Annotated[Count0, Option(("--max-retries",), "retries of a failed model call")] = 3


REQUEST = RequestFields()


class ProbeSpec(SpecModel):
    """How long and how precisely a probe measures one parallelism: the one set of defaults
    (ProbeSettings, `autotune diagnose`, studies and bench suites all start from these)."""

    what: ClassVar[str] = "probe settings"
    warmup_s: NonNegative = 1.0  # and until every slot has finished a rollout
    min_s: Annotated[Positive, Option(("--min-s",), "shortest steady-state window")] = 3.0
    max_s: Annotated[Positive, Option(("--max-s",), "time cap per probe")] = 20.0
    target_halfwidth: Share = 0.05  # stop once the 95% interval is within ± this share
    # Training steps a batch measurement runs (`diagnose --batch-groups`, and each trial
    # of a study whose objective is informative_groups_per_s).
    steps: Count = 12

    @model_validator(mode="after")
    def _ordered(self) -> ProbeSpec:
        if self.max_s < self.min_s:
            raise problem(f"at least min_s ({self.min_s:g})", self.max_s, "max_s")
        return self


PROBE_DEFAULTS = ProbeSpec()


# `autotune diagnose`'s two probes: the NeMo Gym guide's first two rungs.
LOW_PARALLELISM = 5


HIGH_PARALLELISM = 20


class ServerFields(SpecModel):
    """What any target says about its server: where it is, what it serves, its key."""

    base_url: Text | None = None  # a running server (http://host:8000/v1)
    model: Annotated[
        Text | None, Option(("--model",), "model name (default: the server's first model)")
    ] = None
    api_key_env: Annotated[
        Text,
        Option(("--api-key-env",), "environment variable holding the API key (never printed)"),
    ] = "OPENAI_API_KEY"  # the variable's name, never the key
    startup_timeout_s: Positive = 600.0  # for a server autotune starts

    @field_validator("base_url")
    @classmethod
    def _usable_url(cls, url: str | None) -> str | None:
        found = base_url_problem(url) if url else None
        if found is not None:
            text = f"{url} {found}, e.g. http://host:8000/v1"
            raise sentence(text, message=f"base_url {text}")
        return url


SERVER = ServerFields()


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    """The synthetic tasks a run generates (SyntheticSpec's figures, mean and std apart)."""

    num_tasks: int = SYNTHETIC.num_tasks
    prompt_tokens_mean: int = SYNTHETIC.prompt_tokens[0]
    prompt_tokens_std: int = SYNTHETIC.prompt_tokens[1]
    output_tokens_mean: int = SYNTHETIC.output_tokens[0]
    output_tokens_std: int = SYNTHETIC.output_tokens[1]
    seed: int = SYNTHETIC.seed

    def __post_init__(self) -> None:
        if self.num_tasks < 1:
            raise UsageError("--synthetic needs at least 1 task; pass a positive count.")
        if self.prompt_tokens_mean < 1 or self.output_tokens_mean < 1:
            raise UsageError("synthetic prompt and output lengths must be at least 1 token.")

    @classmethod
    def of(cls, spec: SyntheticSpec) -> SyntheticWorkload:
        return cls(
            num_tasks=spec.num_tasks,
            prompt_tokens_mean=spec.prompt_tokens[0],
            prompt_tokens_std=spec.prompt_tokens[1],
            output_tokens_mean=spec.output_tokens[0],
            output_tokens_std=spec.output_tokens[1],
            seed=spec.seed,
        )


@dataclass(frozen=True, slots=True)
class Shard:
    """The i-th (0-based) of n contiguous slices of the task list."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            left, right = text.split("/")
            index, count = int(left), int(right)
        except ValueError:
            raise UsageError(
                f"--shard {text!r} is not of the form i/N; pass e.g. --shard 0/4."
            ) from None
        if count < 1 or not 0 <= index < count:
            raise UsageError(f"--shard {text!r} needs 0 <= i < N; pass e.g. --shard 0/4.")
        return cls(index, count)


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """Where model calls go and how they are made."""

    base_url: str | None = None  # None: the embedded simulated server
    # Every replica's base URL when several serve the model (base_url is the first one);
    # calls are balanced across them (autotune/rollout/replicas.py).
    replica_urls: tuple[str, ...] = ()
    replica_gpus: tuple[tuple[int, ...], ...] = ()  # each replica's GPUs, when known
    model: str | None = None  # None: the server's first /v1/models entry
    api: Api = REQUEST.api
    stream: bool = REQUEST.stream
    api_key_env: str = SERVER.api_key_env
    extra_body: dict[str, Any] = field(default_factory=dict)
    request_timeout_s: float = REQUEST.timeout_s
    connect_timeout_s: float = 5.0
    idle_timeout_s: float | None = 60.0  # tokens come ms apart: a stream silent 60 s stalled
    max_retries: int = REQUEST.max_retries
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    pool_limit: int = 1024
    rpm: float | None = None
    tpm: float | None = None
    sim_args: tuple[str, ...] = ()  # flags for the embedded simulated server
    max_num_seqs: int | None = None  # each server's --max-num-seqs, as the user says it
    # A NeMo Gym agent server making whole rollouts (POST /run) instead of a model server.
    agent_url: str | None = None
    # The model server's vLLM-style /metrics (None: beside base_url; none for an agent).
    metrics_url: str | None = None

    @property
    def base_urls(self) -> tuple[str, ...]:
        """Every replica's base URL (one, or none for the embedded simulator)."""
        if self.replica_urls:
            return self.replica_urls
        return (self.base_url,) if self.base_url is not None else ()

    @property
    def total_max_num_seqs(self) -> int | None:
        """The servers' batch limit over every replica, where the user said it."""
        if self.max_num_seqs is None:
            return None
        return self.max_num_seqs * max(1, len(self.base_urls))


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """What a collect reports while it runs (autotune/live/); everything is off by default."""

    metrics_port: int | None = None  # serve Prometheus /metrics here
    metrics_host: str = "127.0.0.1"
    metrics_linger_s: float = 0.0  # after the run, serve until one scrape reads the end
    stats_every_s: float | None = None  # a line of <output>_stats.jsonl this often
    expect: Path | None = None  # a sweep's recommendation.json: the drift watch's expectation
    expect_rate: float | None = None  # ... or a rate in rollouts/s
    drift_window_s: float | None = None  # None: MIN_BATCHES batches of latency, at least 60 s
    drift_windows: int = 3  # warn after this many windows in a row below the expectation
    report: Path | None = None  # write collect.json and an HTML report here at the end

    def __post_init__(self) -> None:
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise UsageError("--metrics-port must be a port from 1 to 65535.")
        if self.stats_every_s is not None and not self.stats_every_s > 0:
            raise UsageError("--stats-every must be a number of seconds above 0, e.g. 60.")
        if self.expect is not None and self.expect_rate is not None:
            raise UsageError("--expect and --expect-rate both set the expectation; pass one.")
        if self.expect_rate is not None and not self.expect_rate > 0:
            raise UsageError("--expect-rate must be a rate in rollouts/s above 0.")
        if self.drift_window_s is not None and not self.drift_window_s > 0:
            raise UsageError("--drift-window must be a number of seconds above 0.")
        if self.drift_windows < 1:
            raise UsageError("--drift-windows must be at least 1.")

    @property
    def drift_watch(self) -> bool:
        return self.expect is not None or self.expect_rate is not None

    @property
    def sampled(self) -> bool:
        """Samples are taken (for the stats file or the report)."""
        return self.stats_every_s is not None or self.report is not None

    @property
    def enabled(self) -> bool:
        return self.metrics_port is not None or self.sampled or self.drift_watch


TOOL_ERROR_TREATMENTS = ("feed", "fail")


@dataclass(frozen=True, slots=True)
class CollectConfig:
    """One collection run: tasks, target, verifier, parallelism, output."""

    target: TargetConfig = field(default_factory=TargetConfig)
    input: Path | None = None  # None: the synthetic workload
    synthetic: SyntheticWorkload = field(default_factory=SyntheticWorkload)
    limit: int | None = None
    num_repeats: int = 1
    shard: Shard | None = None
    parallelism: int | None = None  # None: unlimited (bounded by target.pool_limit)
    adaptive_concurrency: bool = True  # AIMD below parallelism on 429/503 (--no-adaptive-...)
    verifier: str = "none"
    verifier_workers: int | None = None
    verifier_cost_ms: float = 0.0
    verifier_timeout_s: float = 60.0  # one HTTP or user-function verification, at most
    # Multi-turn rollouts (autotune.rollout.turns): a NeMo Gym resources server's URL whose tools
    # the model may call, or "null" (answered at once, in-process); None: one model call.
    tools: str | None = None
    max_turns: int = 10  # model calls per multi-turn rollout, at most
    # A tool call with no answer in this time fails its rollout as `tool_timeout`: the
    # model's --timeout (minutes, for long generations) would hide a hung environment.
    tool_timeout_s: float = 30.0
    # An error status from a tool: fed back to the model as its output, as NeMo Gym's
    # agent does ("feed"), or the rollout failed as a `tool_error` ("fail"). Counted either way.
    tool_errors: str = "feed"
    output: Path | None = None  # None: rollouts are not written (probes)
    resume: bool = False
    progress: bool = True
    # `autotune collect` exits 3 when a larger share of its rollouts failed (or none
    # succeeded); what it collected is kept either way.
    max_failure_rate: float = 0.05
    live: LiveConfig = field(default_factory=LiveConfig)
    batch: BatchSpec | None = None  # None: rollouts flow freely (no training steps)
    # Group figures with --num-repeats above 1; the overhead benchmark turns them off to
    # measure what they cost the engine.
    track_groups: bool = True

    def __post_init__(self) -> None:
        if self.live.stats_every_s is not None and self.output is None:
            raise UsageError(
                "--stats-every writes its lines beside the rollout file, and this run keeps "
                "none (--no-output); drop one of the two."
            )
        if self.parallelism is not None and self.parallelism < 1:
            raise UsageError("--parallelism must be at least 1; omit it for unlimited.")
        if self.max_turns < 1:
            raise UsageError("--max-turns must be at least 1.")
        if not self.tool_timeout_s > 0:
            raise UsageError("--tool-timeout must be a number of seconds above 0, e.g. 30.")
        if self.tool_errors not in TOOL_ERROR_TREATMENTS:
            raise UsageError(
                f"--tool-errors must be one of {', '.join(TOOL_ERROR_TREATMENTS)}, "
                f"not {self.tool_errors!r}."
            )
        if self.tools is not None and self.target.agent_url is not None:
            raise UsageError(
                "the NeMo Gym agent calls its resources server's tools itself; drop --tools."
            )
        if self.num_repeats < 1:
            raise UsageError("--num-repeats must be at least 1.")
        if self.limit is not None and self.limit < 0:
            raise UsageError("--limit must be zero or more.")
        if self.resume and self.output is None:
            raise UsageError("--resume needs --output-dir, the run to continue.")
        if not 0 <= self.max_failure_rate <= 1:
            raise UsageError("--max-failure-rate must be a share from 0 to 1, e.g. 0.05.")
        if self.batch is not None:
            if self.resume:
                raise UsageError(
                    "--batch-groups runs whole groups in steps and --resume would leave some "
                    "groups part-done; collect into a new --output-dir."
                )
            if self.batch.over_sample and self.num_repeats < 2:
                raise UsageError(
                    "--over-sample ends a step at B informative groups, and a group of one "
                    "sample is never informative: add --num-repeats 2 or more."
                )


def target_config(request: RequestFields, server: ServerFields, **more: Any) -> TargetConfig:
    """A run's target from the specs (flags, a study or a suite); `more` what only one of
    them says (replicas, rate limits, the simulator's flags)."""
    return TargetConfig(
        base_url=server.base_url,
        model=server.model,
        api=request.api,
        stream=request.stream,
        api_key_env=server.api_key_env,
        request_timeout_s=request.timeout_s,
        max_retries=request.max_retries,
        **more,
    )


def collect_config(workload: WorkloadSpec, target: TargetConfig, **run: Any) -> CollectConfig:
    """The one way a run's config is built from a workload spec, whether flags, a study or a
    bench suite gave it; `run` what only a run of collect says (output, parallelism, ...)."""
    return CollectConfig(
        target=target,
        input=workload.input,
        synthetic=SyntheticWorkload.of(workload.synthetic),
        limit=workload.limit,
        num_repeats=workload.num_repeats,
        verifier=workload.verifier_for(workload.input),
        verifier_workers=workload.verifier_workers,
        verifier_cost_ms=workload.verifier_cost_ms,
        **run,
    )


class WorkloadSpec(VerifierFields, RequestFields):
    what: ClassVar[str] = "a workload"
    input: Annotated[
        Path | None,
        Option(
            ("--input", "-i"),
            "task JSONL: NeMo Gym, {messages: [...]} or {prompt: ...} rows "
            "(default: a synthetic workload)",
        ),
    ] = None
    synthetic: SyntheticSpec = SYNTHETIC
    limit: Annotated[Count0 | None, Option(("--limit",), "only the first N tasks")] = None
    # None: ignore_eos for synthetic work on the sim, unless its policy samples lengths
    extra_body: dict[str, Any] | None = None
    # Rollouts per task, sent one after another (a GRPO group sharing its prompt), as
    # `autotune collect --num-repeats` makes them.
    num_repeats: Annotated[Count, Option(("--num-repeats",), "rollouts per task (GRPO groups)")] = 1
    # Training steps (objective informative_groups_per_s): the settings not searched.
    batch: BatchSpec | None = None
    # The RL loop (objective trained_samples_per_s): the trainer's settings not searched.
    loop: LoopSpec | None = None


# The simulator's flags that make each sample's length its own (servers/sim/policy.py)
SAMPLED_LENGTHS = ("--output-length-sigma", "--rollouts")


# ... and every flag of its policy: lengths, or rewards too (a run giving none gets a default)
POLICY_FLAGS = (*SAMPLED_LENGTHS, "--uninformative-share")


def policy_given(sim_args: Sequence[str]) -> bool:
    """Whether the simulator's flags say how its policy samples (servers/sim/policy.py)."""
    return any(arg.startswith(POLICY_FLAGS) for arg in sim_args)


def lengths_sampled(sim_args: Sequence[str]) -> bool:
    """Whether the simulated policy draws each sample's length itself (sim/policy.py), so
    that `ignore_eos` would flatten the tail it was asked for."""
    return any(arg.startswith(SAMPLED_LENGTHS) for arg in sim_args)
