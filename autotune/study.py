"""Study files (YAML) for `autotune sweep`, validated with one clear error per mistake.

    name: my-study
    target: {kind: sim, args: [--gpu, h100-80gb, --model, llama-3.1-70b]}
    workload: {verifier: synthetic, synthetic: {num_tasks: 500}}
    search_space:
      parallelism: {low: 4, high: 512}
      tensor_parallel_size: {choices: [2, 4, 8]}
      gpu_memory_utilization: {low: 0.80, high: 0.95, step: 0.05}
      max_num_seqs: {low: 16, high: 512, log: true}
      max_num_batched_tokens: {choices: [2048, 4096, 8192]}
    objective: {metric: rollouts_per_s, max_error_rate: 0.05}
    budget: {trials: 30}
    seed: 0

Target kinds: `server` (a running server: only parallelism is searched), `sim` (the
embedded simulated engine, relaunched per configuration), `vllm` (a command that
starts vLLM, relaunched per configuration).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autotune.errors import UsageError
from autotune.target import base_url_problem

# Server knobs with vLLM's names; each becomes `--kebab-case VALUE` on the command line.
SERVER_KNOBS = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_num_seqs",
    "max_num_batched_tokens",
)


def knob_flags(knobs: Mapping[str, Any]) -> list[str]:
    """`{"max_num_seqs": 64}` → `["--max-num-seqs", "64"]` (vLLM's flag spelling)."""
    flags: list[str] = []
    for name, value in knobs.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChoiceSpace(_Strict):
    choices: list[int | float | str] = Field(min_length=1)


class IntSpace(_Strict):
    low: int = Field(ge=1)
    high: int = Field(ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> IntSpace:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class FloatSpace(_Strict):
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


class ParallelismSpace(_Strict):
    """Client parallelism: measured by doubling from `low` within each configuration."""

    low: int = Field(default=4, ge=1)
    high: int = Field(default=1024, ge=1)
    plateau_gain: float = Field(default=0.05, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> ParallelismSpace:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class SearchSpace(_Strict):
    parallelism: ParallelismSpace = ParallelismSpace()
    tensor_parallel_size: ChoiceSpace | None = None
    gpu_memory_utilization: FloatOrChoices | None = None
    max_num_seqs: IntOrChoices | None = None
    max_num_batched_tokens: IntOrChoices | None = None
    flags: dict[str, IntSpace | FloatSpace | ChoiceSpace] = {}

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


class TargetSpec(_Strict):
    kind: Literal["server", "sim", "vllm", "command"]
    base_url: str | None = None  # server
    model: str | None = None  # server, vllm
    args: list[str] = []  # fixed flags for sim / vllm
    command: list[str] = ["vllm", "serve"]  # vllm: overridable (a CPU build's module form)
    # command: the user's own collector, with {parallelism}, {output} and {limit} in it
    template: str | None = None
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(default=600.0, gt=0)
    api_key_env: str = "OPENAI_API_KEY"

    @model_validator(mode="after")
    def _complete(self) -> TargetSpec:
        if self.kind == "server" and not self.base_url:
            raise ValueError("kind: server needs base_url (e.g. http://host:8000/v1)")
        problem = base_url_problem(self.base_url) if self.base_url else None
        if problem is not None:
            raise ValueError(f"base_url {self.base_url} {problem}, e.g. http://host:8000/v1")
        if self.kind == "command" and not self.template:
            raise ValueError(
                "kind: command needs template, e.g. 'ng_collect_rollouts ... "
                "+num_samples_in_parallel={parallelism} +output_jsonl_fpath={output}'"
            )
        if self.kind == "vllm" and not self.model:
            raise ValueError("kind: vllm needs model (a path or a model name)")
        return self


class SyntheticSpec(_Strict):
    num_tasks: int = Field(default=500, ge=1)
    prompt_tokens: tuple[int, int] = (256, 64)
    output_tokens: tuple[int, int] = (128, 32)
    seed: int = 0


class WorkloadSpec(_Strict):
    input: Path | None = None
    synthetic: SyntheticSpec = SyntheticSpec()
    limit: int | None = Field(default=None, ge=1)
    verifier: str = "synthetic"
    verifier_workers: int | None = Field(default=None, ge=1)
    verifier_cost_ms: float = Field(default=0.0, ge=0)
    api: Literal["chat", "completions"] = "chat"
    stream: bool = True
    extra_body: dict[str, Any] | None = None  # None: ignore_eos for synthetic work on the sim


class ObjectiveSpec(_Strict):
    metric: Literal["rollouts_per_s", "output_tokens_per_s"] = "rollouts_per_s"
    max_error_rate: float = Field(default=0.05, ge=0, le=1)
    p95_latency_slo_s: float | None = Field(default=None, gt=0)
    second_objective: Literal["p95_latency"] | None = None


class BudgetSpec(_Strict):
    trials: int = Field(default=30, ge=1)
    time_s: float | None = Field(default=None, gt=0)
    patience: int | None = Field(default=None, ge=1)  # stop after N trials without a 1% gain


class ProbeSpec(_Strict):
    min_s: float = Field(default=2.0, gt=0)
    max_s: float = Field(default=10.0, gt=0)
    target_halfwidth: float = Field(default=0.05, gt=0, lt=1)


class Study(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    target: TargetSpec
    workload: WorkloadSpec = WorkloadSpec()
    search_space: SearchSpace = SearchSpace()
    objective: ObjectiveSpec = ObjectiveSpec()
    budget: BudgetSpec = BudgetSpec()
    probe: ProbeSpec = ProbeSpec()
    seed: int = 0

    @model_validator(mode="after")
    def _knobs_need_a_launcher(self) -> Study:
        if self.target.kind in ("server", "command") and self.search_space.server_knobs():
            raise ValueError(
                f"kind: {self.target.kind} starts no server, so no server flag can change; "
                "search only parallelism, or use kind: vllm or kind: sim"
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
    if study.workload.input is not None and not study.workload.input.is_absolute():
        study = study.model_copy(
            update={
                "workload": study.workload.model_copy(
                    update={"input": (path.parent / study.workload.input).resolve()}
                )
            }
        )
    return study
