"""The one configuration model: every default, range and error sentence of a flag, a
study file and a bench suite lives here, once.

A spec field that a flag shares declares an `Option` (cli/options.py adds the flag with the
field's default and checks its text with the field's validation); a study and a suite read
the same fields, so `--synthetic 0`, `synthetic: {num_tasks: 0}` and `synthetic: 0` in a
suite all say "must be a whole number of at least 1". `target_config` and `collect_config`
are the one translator from specs to a run's frozen configs (TargetConfig, CollectConfig,
whose defaults are the specs'). `ServerKnobs` holds vLLM's knobs (type, range, default,
meaning, OpenRLHF's flag): a knob added there is the simulator's flag default, a search
space field, a checked suite server_arg and a recommended flag. A study file, whose JSON
Schema `autotune sweep --schema` prints:

    name: my-study
    target: {kind: sim, args: [--gpu, h100-80gb, --model, llama-3.1-70b]}
    workload: {verifier: synthetic, synthetic: {num_tasks: 400}}
    search_space:
      parallelism: {low: 4, high: 512}
      tensor_parallel_size: {choices: [2, 4, 8]}
      gpu_memory_utilization: {low: 0.80, high: 0.95, step: 0.05}
      max_num_seqs: {low: 16, high: 512, log: true}
      max_num_batched_tokens: {choices: [2048, 4096, 8192]}
    objective: {metric: rollouts_per_s, max_error_rate: 0.05}
    budget: {trials: 30}
    seed: 0

With `resources: {gpus: 8}` a study also searches how the GPUs split into engines
(replicas) × tensor-parallel size, and `workload.num_repeats: 8` sends GRPO groups of 8
rollouts sharing a prompt (where `search_space.enable_prefix_caching: {choices: [true,
false]}` tells whether the prefix cache pays).

Target kinds: `server` (a running server: only parallelism is searched), `sim` (the
embedded simulated engine, relaunched per configuration), `vllm` (a command that
starts vLLM, relaunched per configuration), `command` (a user's own collector, run per
point) and `nemo-gym-agent` (a running NeMo Gym agent server, `agent_url`: each rollout
one POST /run; only parallelism is searched).

The field types and specs that mean the same in a study and in a bench suite
(autotune.bench.suite) are defined once here: `ProbeSpec` holds the one set of probe
defaults (ProbeSettings, diagnose and bench take theirs from it), `ServerFields` what
every target says about its server, and `Count`, `Positive`, `Tokens`, ... each spell
their bad values one way ("must be a whole number of at least 1, not 0"); `spec_problem`
turns the first problem of a validation into that sentence, naming the field as the file
spells it (`cases[0].probe.max_s`).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from autotune.errors import UsageError

Api = Literal["chat", "completions"]


def base_url_problem(url: str) -> str | None:
    """What keeps `url` from being a server's base URL ("needs http:// ..."), else None."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number raises ValueError
    except ValueError as error:
        return f"is not a valid URL ({error})"
    if parts.scheme not in ("http", "https"):
        return "needs http:// or https://"
    if not parts.hostname:
        return "needs a host"
    return None


# -- one sentence per bad value -----------------------------------------------------------


def problem(expected: str, value: Any, field: str = "") -> PydanticCustomError:
    """`must be EXPECTED, not VALUE`: of the field being validated, or of `field` inside it
    (a model validator's finding about one of its fields)."""
    return sentence(f"must be {expected}, not {value!r}", field, expected=expected)


def sentence(
    text: str, field: str = "", message: str = "", expected: str = ""
) -> PydanticCustomError:
    """A validation error whose `text` is one finished phrase about the field (or `field`
    inside it); spec_problem puts the field's name before it, a study error shows
    `message` (default: the field's name and the text). `expected` (what a `must be`
    sentence asks for) lets a flag say it of the text as typed."""
    message = message or (f"{field} {text}" if field else text)
    return PydanticCustomError(
        "autotune",
        "{message}",
        {"message": message, "sentence": text, "field": field, "expected": expected},
    )


def must_be(expected: str, *, inner: bool = True) -> WrapValidator:
    """Every failure of the field reads `must be EXPECTED, not VALUE`; with inner=False only
    the field's own (a list's length), not those of the mappings inside it."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as error:
            if not inner and any(e["loc"] for e in error.errors()):
                raise
            raise problem(expected, value) from None

    return WrapValidator(check)


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("blank")
    return text


def _words(value: Any) -> Any:
    """A list of strings; numbers (`--time-scale, 0.1`) become strings."""
    if isinstance(value, list | tuple) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    return value


def _tokens(value: Any) -> tuple[int, int]:
    """`256` or `[256, 64]` tokens → (mean, std); one number means a std of a quarter."""
    parts = list(value) if isinstance(value, list | tuple) else [value]
    if not 1 <= len(parts) <= 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in parts
    ):
        raise problem("a token count or [mean, std]", value)
    if parts[0] < 1:
        raise problem("at least 1 token", value)
    return parts[0], parts[1] if len(parts) == 2 else parts[0] // 4


def _duration(value: Any) -> tuple[str, float, float]:
    """`2`, `normal:MEAN,SD` or `uniform:LOW,HIGH` seconds → (kind, a, b)."""
    expected = "seconds: a number, normal:MEAN,SD or uniform:LOW,HIGH"
    if isinstance(value, tuple) and len(value) == 3:  # validated once already (a flag's)
        kind, a, b = value
        return _duration(a) if kind == "fixed" else _duration(f"{kind}:{a},{b}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        if not (math.isfinite(number) and number >= 0):
            raise problem(expected, value)
        return ("fixed", number, 0.0)
    if not isinstance(value, str):
        raise problem(expected, value)
    kind, _, numbers = value.partition(":")
    try:
        parts = [float(part) for part in (numbers or kind).split(",")]
    except ValueError:
        raise problem(expected, value) from None
    if not numbers and len(parts) == 1:
        return _duration(parts[0])
    if kind not in ("normal", "uniform") or len(parts) != 2 or min(parts) < 0:
        raise problem(expected, value)
    if kind == "uniform" and parts[0] > parts[1]:
        raise problem(expected + " (LOW at most HIGH)", value)
    return (kind, parts[0], parts[1])


Count = Annotated[int, Strict(), Field(ge=1), must_be("a whole number of at least 1")]
Count0 = Annotated[int, Strict(), Field(ge=0), must_be("a whole number of at least 0")]
Positive = Annotated[float, Strict(), Field(gt=0), must_be("a number above 0")]
NonNegative = Annotated[float, Strict(), Field(ge=0), must_be("a number of at least 0")]
Share = Annotated[float, Strict(), Field(gt=0, lt=1), must_be("a number above 0 and below 1")]
Text = Annotated[str, Strict(), AfterValidator(_not_blank), must_be("a non-empty string")]
Flag = Annotated[bool, Strict(), must_be("true or false")]
Words = Annotated[tuple[str, ...], BeforeValidator(_words), must_be("a list of strings")]
Tokens = Annotated[tuple[int, int], BeforeValidator(_tokens)]  # a count, or [mean, std]
Duration = Annotated[tuple[str, float, float], BeforeValidator(_duration)]
ApiChoice = Annotated[Api, must_be("chat or completions")]


class SpecModel(BaseModel):
    """A mapping of a spec file: unknown fields are errors, values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "a mapping"  # names it in "x is not a field of a target"


def unwrap(node: Any) -> Any:
    """A field's type without Annotated metadata and without `| None`."""
    while True:
        origin = get_origin(node)
        if origin is Annotated:
            node = get_args(node)[0]
            continue
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(node) if a is not type(None)]
            if len(members) == 1:
                node = members[0]
                continue
        return node


def _tag(member: Any) -> str | None:
    """The tag of one member of a tagged union (`Annotated[ProbeCase, Tag("probe")]`)."""
    tags = [m.tag for m in getattr(member, "__metadata__", ()) if isinstance(m, Tag)]
    return tags[0] if tags else None


def _tags(union: Any) -> list[str]:
    """The tags of a tagged union's members (`kind: probe`, `kind: overhead`)."""
    return [tag for tag in map(_tag, get_args(union)) if tag is not None]


def _locate(
    model: type[SpecModel], loc: Sequence[int | str]
) -> tuple[str, type[SpecModel] | None, Any]:
    """(`cases[0].target.launch`, the model holding the last field, the type found there)."""
    where: str = ""
    holder: type[SpecModel] | None = None  # the model the last field was looked up in
    node: Any = model  # the type at the location so far
    for part in loc:
        node = unwrap(node)
        if isinstance(part, int):
            where += f"[{part}]"
            args = get_args(node)
            node = args[0] if args else None
        elif isinstance(node, type) and issubclass(node, SpecModel):
            holder, where = node, f"{where}.{part}" if where else part
            info = node.model_fields.get(part)
            node = info.annotation if info is not None else None
        elif get_origin(node) in (Union, types.UnionType) and part in _tags(node):
            # A tagged union puts the tag it picked in the location; the file never says it.
            node = next(get_args(m)[0] for m in get_args(node) if _tag(m) == part)
        else:
            where, node = f"{where}.{part}" if where else part, None
    return where, holder, node


def spec_problem(model: type[SpecModel], error: ValidationError) -> str:
    """The first problem (a typo'd field before any value) as one sentence, no full stop:
    `cases[0].parallelism must be a whole number of at least 1, not 0`."""
    errors = error.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where, holder, node = _locate(model, first["loc"])
    kind, ctx, value = first["type"], first.get("ctx") or {}, first.get("input")
    if kind == "extra_forbidden" and holder is not None:
        fields = ", ".join(holder.model_fields)
        return f"{where} is not a field of {holder.what}; the fields are {fields}"
    if kind == "autotune":
        inside = ctx.get("field") or ""
        where = f"{where}.{inside}" if where and inside else where or inside
        return f"{where or 'the file'} {ctx['sentence']}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tagged = value.get("kind") if isinstance(value, dict) else None
        tags = " or ".join(_tags(unwrap(node)))
        return f"{where}.kind must be {tags}, not {tagged!r}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{where or 'the file'} must be a mapping of fields, not {value!r}"
    if kind == "missing":
        return f"{where} is missing; add it"
    return f"{where or 'the file'}: {first['msg'].removeprefix('Value error, ')}"


# -- the one model: fields that flags, study files and bench suites share -------------------


@dataclass(frozen=True, slots=True)
class Option:
    """How a spec field is spelled on the command line. The CLI (cli/options.py) adds the
    flag with the field's own default and checks its text with the field's own validation,
    so a flag, a study field and a suite field never differ in default, range or sentence."""

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    # The flag's text → the value the field validates (default: a number when it reads as
    # one, else the text); `256,64` → [256, 64] for a token count.
    text: Callable[[str], Any] | None = None
    switch: bool = False  # a `--no-X` flag: present means False (a flag without `--no-`
    # on a field whose default is False means True when present)


def _numbers(text: str) -> Any:
    """`256` → 256, `256,64` → [256, 64]; anything else stays text (and fails validation)."""
    try:
        parts = [int(part) for part in text.split(",")]
    except ValueError:
        return text
    return parts[0] if len(parts) == 1 else parts


def option(field: FieldInfo) -> Option | None:
    """The flag a spec field declares, if any."""
    return next((meta for meta in field.metadata if isinstance(meta, Option)), None)


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


# -- what a run is given: built from the specs above, never with defaults of its own ------


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


# -- study files (autotune sweep) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Knob:
    """What a server knob means, and its flag in OpenRLHF where OpenRLHF has one (each
    name read from OpenRLHF's own code or docs; none is guessed)."""

    help: str
    openrlhf: str | None = None


class ServerKnobs(SpecModel):
    """vLLM's engine knobs autotune launches servers with and searches, by vLLM's names
    (`--kebab-case VALUE` on its command line), with vLLM's defaults as the simulator
    models them: the one home of their types, ranges and defaults for the simulator's
    flags, a study's search space, a bench suite's server_args and the recommendation."""

    what: ClassVar[str] = "server knobs"
    tensor_parallel_size: Annotated[
        Count, Knob("GPUs the model is split over", "--vllm.tensor_parallel_size")
    ] = 1
    gpu_memory_utilization: Annotated[
        Share,
        Knob("share of GPU memory for weights and KV cache", "--vllm.gpu_memory_utilization"),
    ] = 0.9
    max_num_seqs: Annotated[Count, Knob("sequences in a batch at most")] = 256
    max_num_batched_tokens: Annotated[Count, Knob("tokens in one step at most")] = 8192
    enable_prefix_caching: Annotated[
        Flag,
        Knob(
            "share the KV cache of identical prompts, as vLLM V1 does by default",
            "--vllm.enable_prefix_caching",
        ),
    ] = True
    # vLLM's own default is the model's context length; the simulator's models have long
    # contexts, so it starts at 8192, enough for any synthetic rollout it is given.
    max_model_len: Annotated[
        Count, Knob("longest prompt + output, in tokens: bounds each sequence's KV blocks")
    ] = 8192


KNOBS = ServerKnobs()
SERVER_KNOBS = tuple(ServerKnobs.model_fields)


def knob(name: str) -> Knob:
    """The description of one of SERVER_KNOBS."""
    return next(m for m in ServerKnobs.model_fields[name].metadata if isinstance(m, Knob))


def _server_args(values: dict[str, Any]) -> dict[str, Any]:
    """A mapping of server flags: the knobs autotune knows checked as ServerKnobs checks
    them (any other flag of the server passes as given)."""
    named = {name.lstrip("-").replace("-", "_"): value for name, value in values.items()}
    known = {name: value for name, value in named.items() if name in ServerKnobs.model_fields}
    ServerKnobs.model_validate(known)
    return values


ServerArgs = Annotated[
    dict[str, Any], must_be("a mapping of server flag to value", inner=False),
    AfterValidator(_server_args),
]  # fmt: skip
# A study with `resources` searches how its GPUs split into engines × tensor-parallel size
# (sweep/feasibility.py `splits`): one categorical parameter of this name, each trial's knobs
# holding the engines under ENGINES and the size under tensor_parallel_size.
SPLIT = "split"
ENGINES = "num_engines"


class ChoiceSpace(SpecModel):
    # bool first: `true` stays a flag's value instead of becoming the number 1
    choices: list[bool | int | float | str] = Field(min_length=1)


class IntSpace(SpecModel):
    low: int = Field(ge=1)
    high: int = Field(ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> IntSpace:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class FloatSpace(SpecModel):
    low: float
    high: float
    step: float | None = None
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> FloatSpace:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0 (got {self.low})")
        if self.step is not None:
            if self.step <= 0:
                raise ValueError(f"step must be > 0 (got {self.step})")
            if self.low < self.high and self.step > self.high - self.low:
                raise ValueError(
                    f"step ({self.step}) must not exceed high - low ({self.high - self.low:g})"
                )
        return self


IntOrChoices = IntSpace | ChoiceSpace
FloatOrChoices = FloatSpace | ChoiceSpace


class ParallelismSpace(SpecModel):
    """Client parallelism: measured by doubling from `low` within each configuration."""

    low: int = Field(default=4, ge=1)
    high: int = Field(default=1024, ge=1)
    plateau_gain: float = Field(default=0.05, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> ParallelismSpace:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


def _flag_name(flag: str) -> str:
    """`--max-num-seqs=8`, `max_num_seqs` → `max-num-seqs`."""
    return flag.partition("=")[0].lstrip("-").replace("_", "-")


def _launcher_flag(flag: str) -> str | None:
    """Why `flag` (a server flag, any spelling) is the launcher's to set, else None."""
    name = _flag_name(flag)
    if name == "port":
        return f"sets {flag}, which autotune picks itself (a free port per server); remove it"
    if name == "host":
        return f"sets {flag}; use the study's target.host instead (default 127.0.0.1)"
    if name == "model":
        return f"sets {flag}; use the study's target.model instead"
    return None


class SearchSpace(SpecModel):
    parallelism: ParallelismSpace = ParallelismSpace()
    tensor_parallel_size: ChoiceSpace | None = None
    gpu_memory_utilization: FloatOrChoices | None = None
    max_num_seqs: IntOrChoices | None = None
    max_num_batched_tokens: IntOrChoices | None = None
    # {choices: [true, false]}: whether the prefix cache pays (GRPO groups share a prompt)
    enable_prefix_caching: ChoiceSpace | None = None
    max_model_len: IntOrChoices | None = None
    flags: dict[str, IntSpace | FloatSpace | ChoiceSpace] = {}
    # The trainer's side, for objective informative_groups_per_s: groups per training
    # step, over-sampling share, and whether unfinished samples carry over ([true, false]).
    batch_groups: IntOrChoices | None = None
    over_sample: FloatOrChoices | None = None
    carry_over: ChoiceSpace | None = None
    # The RL loop's, for objective trained_samples_per_s: its mode, how many steps of
    # groups async generation may run ahead (max_ahead = ahead_steps × batch_groups), the
    # staleness past which a group is dropped, and what a sync does to requests in flight.
    mode: ChoiceSpace | None = None
    ahead_steps: IntOrChoices | None = None
    max_staleness: ChoiceSpace | None = None
    pause_mode: ChoiceSpace | None = None

    @model_validator(mode="after")
    def _no_launcher_flags(self) -> SearchSpace:
        for flag in self.flags:
            why = _launcher_flag(flag)
            if why is not None:
                raise ValueError(f"flags {why}")
            if _flag_name(flag) in ("data-parallel-size", ENGINES.replace("_", "-")):
                raise ValueError(
                    f"flags sets {flag}, which resources.gpus decides (engines × "
                    "tensor_parallel_size); remove it"
                )
        for name in ("enable_prefix_caching", "carry_over"):
            switch = getattr(self, name)
            if switch is not None and not all(isinstance(c, bool) for c in switch.choices):
                raise problem("[true, false] or one of them", switch.choices, f"{name}.choices")
        for name, allowed in (("mode", get_args(LoopMode)), ("pause_mode", get_args(PauseMode))):
            space = getattr(self, name)
            if space is not None and not set(space.choices) <= set(allowed):
                raise problem(f"some of {', '.join(allowed)}", space.choices, f"{name}.choices")
        staleness = self.max_staleness
        if staleness is not None and not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in staleness.choices
        ):
            raise problem("whole numbers of at least 0", staleness.choices, "max_staleness.choices")
        return self

    def batch_knobs(self) -> dict[str, IntSpace | FloatSpace | ChoiceSpace]:
        """Every searched batch setting (BATCH_KNOBS) by name."""
        spaces = {name: getattr(self, name) for name in BATCH_KNOBS}
        return {name: space for name, space in spaces.items() if space is not None}

    def loop_knobs(self) -> dict[str, IntSpace | FloatSpace | ChoiceSpace]:
        """Every searched RL loop setting (LOOP_KNOBS) by name."""
        spaces = {name: getattr(self, name) for name in LOOP_KNOBS}
        return {name: space for name, space in spaces.items() if space is not None}

    def trainer_knobs(self) -> dict[str, IntSpace | FloatSpace | ChoiceSpace]:
        """The trainer's searched settings (no server sees them): batch and loop ones."""
        return {**self.batch_knobs(), **self.loop_knobs()}

    def server_knobs(self) -> dict[str, IntSpace | FloatSpace | ChoiceSpace]:
        """Every searched server flag by its knob name (vLLM's, with underscores)."""
        knobs: dict[str, IntSpace | FloatSpace | ChoiceSpace] = {}
        for name in SERVER_KNOBS:
            space = getattr(self, name)
            if space is not None:
                knobs[name] = space
        for flag, space in self.flags.items():
            knobs[flag.lstrip("-").replace("-", "_")] = space
        return knobs


class TargetSpec(ServerFields):
    what: ClassVar[str] = "a target"
    kind: Literal["server", "sim", "vllm", "command", "nemo-gym-agent"]
    args: list[str] = []  # fixed flags for sim / vllm
    command: list[str] = ["vllm", "serve"]  # vllm: overridable (a CPU build's module form)
    # command: the user's own collector, with {parallelism}, {output} and {limit} in it
    template: str | None = None
    env: dict[str, str] = {}
    # sim / vllm: the interface the launched server listens on (None: 127.0.0.1, this
    # machine only: vLLM's API has no authentication; 0.0.0.0 opens it to the network)
    host: Text | None = None
    # nemo-gym-agent: the agent server, and the model server's /metrics it calls (optional)
    agent_url: Text | None = None
    metrics_url: Text | None = None

    @model_validator(mode="after")
    def _complete(self) -> TargetSpec:
        if self.kind == "nemo-gym-agent" and not self.agent_url:
            raise ValueError(
                "kind: nemo-gym-agent needs agent_url (an agent of ng_run's /server_instances)"
            )
        if self.kind != "nemo-gym-agent" and self.agent_url:
            raise ValueError(f"agent_url is for kind: nemo-gym-agent, not kind: {self.kind}")
        for name, url in (("agent_url", self.agent_url), ("metrics_url", self.metrics_url)):
            found = base_url_problem(url) if url else None
            if found is not None:
                raise ValueError(f"{name} {url} {found}, e.g. http://host:port")
        if self.kind == "server" and not self.base_url:
            raise ValueError("kind: server needs base_url (e.g. http://host:8000/v1)")
        if self.kind == "command" and not self.template:
            raise ValueError(
                "kind: command needs template, e.g. 'ng_collect_rollouts ... "
                "+num_samples_in_parallel={parallelism} +output_jsonl_fpath={output}'"
            )
        if self.kind == "vllm" and not self.model:
            raise ValueError("kind: vllm needs model (a path or a model name)")
        if self.host is not None and self.kind in ("server", "command", "nemo-gym-agent"):
            raise ValueError(
                f"kind: {self.kind} starts no server, so host does not apply; remove it"
            )
        # `--model` of the simulator picks the simulated model: the sim keeps it.
        launched = [*self.args, *self.command] if self.kind == "vllm" else self.args
        for flag in launched:
            why = _launcher_flag(flag) if flag.startswith("-") else None
            if why is not None and (self.kind == "vllm" or _flag_name(flag) != "model"):
                raise ValueError(f"{'args' if flag in self.args else 'command'} {why}")
        return self


LoopMode = Literal["sync", "colocated", "async"]
PauseMode = Literal["keep", "wait", "abort"]


class LoopSpec(SpecModel):
    """The RL loop (`autotune loop`): a trainer stand-in takes `batch_groups` groups a step,
    trains for `train_s`, then syncs weights (pause, sync, caches, resume)."""

    what: ClassVar[str] = "a loop setting"
    mode: Annotated[
        LoopMode,
        must_be("sync, colocated or async"),
        Option(
            ("--mode",),
            "sync: generate, then train, then sync; colocated: the same with the server "
            "asleep while the trainer trains (its GPUs are shared); async: generation goes on "
            "while the trainer trains, at most --max-ahead groups ahead (default: sync)",
            "MODE",
        ),
    ] = "sync"
    batch_groups: Annotated[
        Count, Option(("--batch-groups",), "groups the trainer takes a step (default: 8)", "B")
    ] = 8
    steps: Annotated[Count, Option(("--steps",), "training steps to run (default: 10)", "N")] = 10
    train_s: Annotated[
        Duration,
        Option(
            ("--train-s",),
            "one training step's time: seconds, normal:MEAN,SD or uniform:LOW,HIGH (default: 1)",
            "T",
            text=str,
        ),
    ] = ("fixed", 1.0, 0.0)
    train_command: Annotated[
        Text | None,
        Option(
            ("--train-command",),
            "a shell command run once a step as the training step (its run time is the "
            "step's; it sees AUTOTUNE_STEP, AUTOTUNE_POLICY_VERSION, AUTOTUNE_BATCH_SAMPLES)",
            "CMD",
        ),
    ] = None
    sync_s: Annotated[
        Duration,
        Option(
            ("--sync-s",),
            "the weight transfer's time while generation is paused: seconds or a "
            "distribution as --train-s (default: 0)",
            "S",
            text=str,
        ),
    ] = ("fixed", 0.0, 0.0)
    sync_via_server: Annotated[
        Flag,
        Option(
            ("--sync-via-server",),
            "the transfer is the server's own POST /update_weights (the simulator charges "
            "the model's weights at its --weight-sync-gbps) instead of --sync-s",
            switch=True,
        ),
    ] = False
    sync_command: Annotated[
        Text | None,
        Option(
            ("--sync-command",),
            "a shell command run at each sync, while generation is paused, as the transfer",
            "CMD",
        ),
    ] = None
    pause_mode: Annotated[
        PauseMode,
        must_be("keep, wait or abort"),
        Option(
            ("--pause-mode",),
            "what a sync does to requests in flight (vLLM's POST /pause): keep freezes them "
            "until the resume, wait lets them finish first, abort ends them (they are sent "
            "again after the sync) (default: keep)",
            "MODE",
        ),
    ] = "keep"
    clear_cache: Annotated[
        Flag,
        Option(
            ("--no-clear-cache",),
            "keep the prefix cache across a sync (default: cleared, as new weights make it stale)",
            switch=True,
        ),
    ] = True
    max_ahead: Annotated[
        Count | None,
        Option(
            ("--max-ahead",),
            "async: groups started and not yet trained on, at most (OpenRLHF's async queue; "
            "default: --batch-groups, one step ahead)",
            "Q",
        ),
    ] = None
    max_staleness: Annotated[
        Count0 | None,
        Option(
            ("--max-staleness",),
            "async: drop (and count) a group generated more than K policy versions before "
            "the step that would train on it (default: keep every group)",
            "K",
        ),
    ] = None
    sleep_level: Annotated[
        int,
        Field(ge=1, le=2),
        must_be("1 or 2"),
        Option(
            ("--sleep-level",),
            "colocated: vLLM's sleep level while the trainer trains (1: weights to host "
            "memory, 2: dropped) (default: 1)",
            "LEVEL",
        ),
    ] = 1

    @model_validator(mode="after")
    def _coherent(self) -> LoopSpec:
        if self.mode != "async" and (self.max_ahead is not None or self.max_staleness is not None):
            raise ValueError(
                "max_ahead (--max-ahead) and max_staleness (--max-staleness) bound the async "
                "mode: drop them or pass mode async (--mode async)"
            )
        if self.max_ahead is not None and self.max_ahead < self.batch_groups:
            raise ValueError(
                f"max_ahead ({self.max_ahead}) must be at least batch_groups "
                f"({self.batch_groups}), or no step could ever start"
            )
        transfers = [self.sync_via_server, self.sync_command is not None, self.sync_s[1] > 0]
        if sum(transfers) > 1:
            raise ValueError(
                "give one weight transfer: --sync-s, --sync-via-server or --sync-command"
            )
        if self.train_command is not None and self.train_s != ("fixed", 1.0, 0.0):
            raise ValueError("give one training step: --train-s or --train-command")
        return self

    @property
    def ahead(self) -> int:
        """Groups started and not yet trained on, at most: a step's in the synchronous modes."""
        return self.max_ahead or self.batch_groups


class BatchSpec(SpecModel):
    """Batch-synchronous collection: steps of `batch_groups` GRPO groups, as a synchronous
    trainer consumes them between weight syncs, and the remedies for their stragglers."""

    what: ClassVar[str] = "a batch setting"
    batch_groups: Annotated[
        Count | None,
        Option(
            ("--batch-groups",),
            "collect in training steps of B groups (of --num-repeats samples), each step "
            "ending when its groups are complete, as a synchronous trainer waits",
            "B",
        ),
    ] = None
    over_sample: Annotated[
        NonNegative,
        Option(
            ("--over-sample",),
            "start ceil(B*(1+R)) groups a step and end it at B informative groups; the rest "
            "are cancelled on the server (default: 0)",
            "R",
        ),
    ] = 0.0
    carry_over: Annotated[
        Flag,
        Option(
            ("--carry-over",),
            "samples still running when a step ends go on into the next (partial rollouts), "
            "counted to the step in which they finish",
            switch=True,
        ),
    ] = False

    @model_validator(mode="after")
    def _needs_batches(self) -> BatchSpec:
        if self.batch_groups is None and (self.over_sample or self.carry_over):
            raise ValueError(
                "over-sampling and carry-over act on batch steps: give batch_groups "
                "(--batch-groups) too"
            )
        return self


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


GOODPUT = "informative_groups_per_s"  # the RL objective: groups a trainer can learn from
TRAINED = "trained_samples_per_s"  # the RL loop's: samples a trainer stand-in trains on
BATCH_KNOBS = ("batch_groups", "over_sample", "carry_over")
LOOP_KNOBS = ("mode", "ahead_steps", "max_staleness", "pause_mode")


def server_part(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's knobs that its server is launched with: the batch and loop settings
    (BATCH_KNOBS, LOOP_KNOBS) are the trainer's, which no server sees."""
    trainer = (*BATCH_KNOBS, *LOOP_KNOBS)
    return {name: value for name, value in knobs.items() if name not in trainer}


def loop_spec(fixed: LoopSpec | None, knobs: Mapping[str, Any]) -> LoopSpec:
    """A loop trial's settings: the searched ones over the workload's fixed ones. The
    async bounds are dropped for the other modes, which have none (a draw may hold them)."""
    values = fixed.model_dump() if fixed is not None else {}
    values.update({k: knobs[k] for k in ("mode", "pause_mode", "batch_groups") if k in knobs})
    if "max_staleness" in knobs:
        values["max_staleness"] = knobs["max_staleness"]
    if "ahead_steps" in knobs:
        groups = values.get("batch_groups", LoopSpec.model_fields["batch_groups"].default)
        values["max_ahead"] = knobs["ahead_steps"] * groups
    if values.get("mode", "sync") != "async":
        values["max_ahead"] = values["max_staleness"] = None
    return LoopSpec.model_validate(values)


class ObjectiveSpec(SpecModel):
    # informative_groups_per_s: each trial runs training steps of GRPO groups (as
    # `collect --batch-groups`) instead of a parallelism curve; see Study._steps.
    metric: Literal[
        "rollouts_per_s", "output_tokens_per_s", "informative_groups_per_s", "trained_samples_per_s"
    ] = "rollouts_per_s"
    max_error_rate: float = Field(default=0.05, ge=0, le=1)
    # Latency budgets: a trial's value is its best throughput at a parallelism that meets
    # them, and the recommendation stays at or under them (sweep/recommend.py).
    p95_latency_slo_s: Positive | None = None  # p95 rollout latency, seconds
    p99_latency_slo_s: Positive | None = None  # p99 rollout latency, seconds
    p95_ttft_slo_s: Positive | None = None  # p95 time to first token (streamed), seconds
    second_objective: Literal["p95_latency"] | None = None
    # informative_groups_per_s: the p95 training-step time allowed, seconds
    max_step_s: Positive | None = None
    # trained_samples_per_s: the most policy versions a trained sample may lag (the
    # off-policyness accepted); a trial that trained older samples is infeasible
    staleness_limit: Count0 | None = None


VALIDATE_ROLLOUTS = 1000  # the validation run's length against a real server
VALIDATE_ROLLOUTS_SIM = 300  # on the simulator, where a demo should stay short


class BudgetSpec(SpecModel):
    trials: int = Field(default=30, ge=1)
    time_s: float | None = Field(default=None, gt=0)
    patience: int | None = Field(default=None, ge=1)  # stop after N trials without a 1% gain
    # Rollouts of the run that validates the recommendation before it is written; 0: none.
    # None: 1,000 against a real server, VALIDATE_ROLLOUTS_SIM on the simulator.
    validate_rollouts: Count0 | None = None

    def rollouts_to_validate(self, kind: str) -> int:
        if self.validate_rollouts is not None:
            return self.validate_rollouts
        return VALIDATE_ROLLOUTS_SIM if kind == "sim" else VALIDATE_ROLLOUTS


class PriorSpec(SpecModel):
    """A calibrated simulator the study ranks its configurations on before launching any
    (sweep/prior.py): `autotune sim calibrate` writes the profile."""

    what: ClassVar[str] = "prior"
    profile: Path  # a profile.json of `autotune sim calibrate` (relative: to the study file)
    # `sim serve` flags the target holds fixed (e.g. [--max-num-seqs, "64"]); the searched
    # knobs are added per configuration, as for the target.
    args: list[str] = []
    # Launch only the configurations the prior puts within this share of its best (its
    # worst calibrated point missed by ~16%).
    keep_within: Share = 0.25
    # The lengths it simulates; None: the workload's synthetic ones.
    prompt_tokens: Tokens | None = None
    output_tokens: Tokens | None = None


class ResourcesSpec(SpecModel):
    """The GPUs a study may spend: it then searches how to split them into engines
    (replicas of the model) × tensor-parallel size, engines × TP ≤ gpus."""

    what: ClassVar[str] = "resources"
    gpus: Count
    # servers: one server per engine on its own port and GPUs, the client balancing calls
    # across them; data-parallel: one server with --data-parallel-size engines
    replicas: Annotated[
        Literal["servers", "data-parallel"], must_be("servers or data-parallel")
    ] = "servers"
    # The hardware and model by profile name (autotune sim --gpu / --model), for the
    # roofline and the fit when the target is not the simulator (which names its own).
    gpu: Text | None = None
    model_profile: Text | None = None


class Study(SpecModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    target: TargetSpec
    workload: WorkloadSpec = WorkloadSpec()
    search_space: SearchSpace = SearchSpace()
    objective: ObjectiveSpec = ObjectiveSpec()
    budget: BudgetSpec = BudgetSpec()
    probe: ProbeSpec = ProbeSpec()
    resources: ResourcesSpec | None = None
    prior: PriorSpec | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _prior(self) -> Study:
        """The prior ranks configurations by a throughput curve on the simulated engine;
        the step and loop objectives measure what it does not simulate."""
        if self.prior is not None and self.objective.metric in (GOODPUT, TRAINED):
            raise ValueError(
                f"prior ranks throughput curves; objective {self.objective.metric} cannot "
                "use it: remove prior"
            )
        return self

    @model_validator(mode="after")
    def _loop(self) -> Study:
        """trained_samples_per_s runs the RL loop's trainer stand-in beside the rollouts;
        its settings and staleness limit mean nothing without it."""
        objective, workload = self.objective, self.workload
        searched = self.search_space.loop_knobs()
        if objective.metric != TRAINED:
            if searched or workload.loop is not None or objective.staleness_limit is not None:
                raise ValueError(
                    "search_space loop settings, workload.loop and objective.staleness_limit "
                    f"act on the RL loop: set objective.metric: {TRAINED}"
                )
            return self
        if workload.num_repeats < 2:
            raise ValueError(
                f"objective {TRAINED} trains on GRPO groups: set workload.num_repeats to the "
                "group size (2 or more)"
            )
        if self.search_space.over_sample or self.search_space.carry_over or workload.batch:
            raise ValueError(
                f"objective {TRAINED} takes its batch from workload.loop.batch_groups or "
                "search_space.batch_groups: remove over_sample, carry_over and workload.batch"
            )
        if self.target.kind not in ("sim", "vllm", "server"):
            raise ValueError(
                f"objective {TRAINED} runs the loop through autotune's engine: use kind: sim, "
                f"vllm or server, not {self.target.kind}"
            )
        if objective.second_objective is not None:
            raise ValueError(f"objective {TRAINED} has no second objective; remove it")
        return self

    @model_validator(mode="after")
    def _steps(self) -> Study:
        """informative_groups_per_s measures training steps of GRPO groups through
        autotune's own engine; batch settings and a step SLO mean nothing without it."""
        objective, workload = self.objective, self.workload
        searched = self.search_space.batch_knobs()
        if objective.metric == TRAINED:
            return self  # the loop's own batch (Study._loop)
        if objective.metric != GOODPUT:
            if searched or objective.max_step_s is not None:
                raise ValueError(
                    "search_space batch settings and objective.max_step_s act on training "
                    f"steps: set objective.metric: {GOODPUT}"
                )
            return self
        if workload.num_repeats < 2:
            raise ValueError(
                f"objective {GOODPUT} counts groups whose rewards differ: set "
                "workload.num_repeats to the group size (2 or more)"
            )
        fixed = workload.batch.batch_groups if workload.batch else None
        if fixed is None and "batch_groups" not in searched:
            raise ValueError(
                f"objective {GOODPUT} runs training steps: give workload.batch.batch_groups "
                "or search search_space.batch_groups"
            )
        if self.target.kind not in ("sim", "vllm", "server"):
            raise ValueError(
                f"objective {GOODPUT} runs training steps through autotune's engine: use "
                f"kind: sim, vllm or server, not {self.target.kind}"
            )
        if objective.second_objective is not None:
            raise ValueError(f"objective {GOODPUT} has no second objective; remove it")
        return self

    @model_validator(mode="after")
    def _knobs_need_a_launcher(self) -> Study:
        kind, resources = self.target.kind, self.resources
        if kind == "sim" and resources is not None and (resources.gpu or resources.model_profile):
            raise ValueError(
                "resources.gpu and resources.model_profile are for a real server: the "
                "simulator takes its own as --gpu and --model in target.args"
            )
        if kind not in ("sim", "vllm") and resources is not None:
            raise ValueError(
                f"kind: {kind} starts no server, so no GPUs can be split into engines; "
                "remove resources, or use kind: vllm or kind: sim"
            )
        if kind not in ("sim", "vllm") and self.search_space.server_knobs():
            raise ValueError(
                f"kind: {kind} starts no server, so no server flag can change; "
                "search only parallelism, or use kind: vllm or kind: sim"
            )
        tp = self.search_space.tensor_parallel_size
        if resources is not None and tp is not None:
            gpus = resources.gpus
            for choice in tp.choices:
                if isinstance(choice, bool) or not isinstance(choice, int) or choice < 1:
                    raise ValueError(
                        "search_space.tensor_parallel_size.choices must be whole numbers of "
                        f"GPUs, not {choice!r}"
                    )
                if choice > gpus:
                    raise ValueError(
                        f"search_space.tensor_parallel_size.choices holds {choice}, more than "
                        f"resources.gpus ({gpus}); an engine needs that many GPUs of the budget"
                    )
        return self


def _location(error: Any) -> str:
    return ".".join(str(part) for part in error["loc"] if not str(part).startswith("function-"))


def load_study(path: Path) -> Study:
    """Read and validate a study file; every problem becomes one UsageError sentence."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"study file {path} does not exist; check the path.") from None
    except IsADirectoryError:
        raise UsageError(f"study file {path} is a directory; pass its YAML file.") from None
    except OSError as error:
        raise UsageError(
            f"study file {path} cannot be read ({error.strerror}); check its permissions."
        ) from None
    except UnicodeDecodeError:
        raise UsageError(f"study file {path} is not UTF-8 text; pass the study YAML.") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"study file {path} is not valid YAML{where}; fix its syntax.") from None
    if not isinstance(raw, dict):
        raise UsageError(f"study file {path} must be a YAML mapping (name:, target:, ...).")
    raw.setdefault("name", path.stem)
    try:
        study = Study.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = _location(first) or "the file"
        message = first["msg"].removeprefix("Value error, ")
        raise UsageError(f"study file {path}: {where}: {message}.") from None
    if study.prior is not None and not study.prior.profile.is_absolute():
        profile = (path.parent / study.prior.profile).resolve()
        prior = study.prior.model_copy(update={"profile": profile})
        study = study.model_copy(update={"prior": prior})
    if study.workload.input is not None and not study.workload.input.is_absolute():
        study = study.model_copy(
            update={
                "workload": study.workload.model_copy(
                    update={"input": (path.parent / study.workload.input).resolve()}
                )
            }
        )
    return study
