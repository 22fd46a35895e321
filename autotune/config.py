"""Validated run configuration, built once by the CLI (or a study file) and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.errors import UsageError

Api = Literal["chat", "completions"]


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    """Generated tasks for the embedded default: lengths in tokens (~4 characters each)."""

    num_tasks: int = 2000
    prompt_tokens_mean: int = 256
    prompt_tokens_std: int = 64
    output_tokens_mean: int = 256
    output_tokens_std: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_tasks < 1:
            raise UsageError("--synthetic needs at least 1 task; pass a positive count.")
        if self.prompt_tokens_mean < 1 or self.output_tokens_mean < 1:
            raise UsageError("synthetic prompt and output lengths must be at least 1 token.")


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
    model: str | None = None  # None: the server's first /v1/models entry
    api: Api = "chat"
    stream: bool = True
    api_key_env: str = "OPENAI_API_KEY"
    extra_body: dict[str, Any] = field(default_factory=dict)
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    max_retries: int = 3
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    pool_limit: int = 1024
    rpm: float | None = None
    tpm: float | None = None
    sim_args: tuple[str, ...] = ()  # flags for the embedded simulated server


@dataclass(frozen=True, slots=True)
class CollectConfig:
    """One collection run: tasks, target, verifier, parallelism, output."""

    target: TargetConfig = field(default_factory=TargetConfig)
    input: Path | None = None  # None: the synthetic workload
    synthetic: SyntheticWorkload = field(default_factory=SyntheticWorkload)
    limit: int | None = None
    num_repeats: int = 1
    shard: Shard | None = None
    parallelism: int | None = 64  # None: unlimited (bounded by target.pool_limit)
    verifier: str = "none"
    verifier_workers: int | None = None
    verifier_cost_ms: float = 0.0
    output: Path | None = None  # None: rollouts are not written (probes)
    resume: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.parallelism is not None and self.parallelism < 1:
            raise UsageError("--parallelism must be at least 1; omit it for unlimited.")
        if self.num_repeats < 1:
            raise UsageError("--num-repeats must be at least 1.")
        if self.limit is not None and self.limit < 0:
            raise UsageError("--limit must be zero or more.")
        if self.resume and self.output is None:
            raise UsageError("--resume needs --output, the file to continue.")
