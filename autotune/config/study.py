"""A study file: target, workload, search space, objective, budget, prior and resources,
validated whole (`load_study`); `autotune sweep --schema` prints its JSON Schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    Field,
    ValidationError,
    model_validator,
)

from autotune.config.collection import (
    ProbeSpec,
    ServerFields,
    TargetConfig,
    WorkloadSpec,
    lengths_sampled,
    target_config,
)
from autotune.config.fields import (
    Count,
    Count0,
    Positive,
    Share,
    SpecModel,
    Text,
    Tokens,
    base_url_problem,
    must_be,
)
from autotune.config.flags import field_name
from autotune.config.knobs import SearchSpace, launcher_flag_problem
from autotune.config.rl_specs import BATCH_KNOBS, LOOP_KNOBS, LoopSpec
from autotune.engines import ENGINES, Engine
from autotune.engines.description import LAUNCHER_SETS
from autotune.errors import UsageError


class TargetSpec(ServerFields):
    what: ClassVar[str] = "a target"
    kind: Literal["server", "sim", "vllm", "sglang", "trtllm", "command", "nemo-gym-agent"]
    args: list[str] = []  # fixed flags for sim or a launched engine, in its own spelling
    # A launched engine's command before its model (none: the engine's own, `vllm serve`,
    # `python -m sglang.launch_server`, `trtllm-serve`): a CPU build's module form, say.
    command: list[str] = []
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
        if self.kind in ENGINES and not self.model:
            raise ValueError(f"kind: {self.kind} needs model (a path or a model name)")
        if self.host is not None and self.kind in ("server", "command", "nemo-gym-agent"):
            raise ValueError(
                f"kind: {self.kind} starts no server, so host does not apply; remove it"
            )
        # `--model` of the simulator picks the simulated model: the sim keeps it.
        engine = ENGINES.get(self.kind)
        launched = [*self.args, *self.command] if engine else self.args
        for flag in launched:
            name = engine.field_of(flag) if engine else field_name(flag)
            name = "model" if name == "model_path" else name  # SGLang's --model-path
            why = launcher_flag_problem(flag, name) if flag.startswith("-") else None
            if why is not None and (engine is not None or name != "model"):
                raise ValueError(f"{'args' if flag in self.args else 'command'} {why}")
        return self

    @property
    def engine(self) -> Engine | None:
        """The engine a launched kind starts (vllm, sglang, trtllm), else None."""
        return ENGINES.get(self.kind)

    @property
    def starts_server(self) -> bool:
        """Whether each configuration starts its own server (the sim or an engine)."""
        return self.kind == "sim" or self.kind in ENGINES


GOODPUT = "informative_groups_per_s"  # the RL objective: groups a trainer can learn from


TRAINED = "trained_samples_per_s"  # the RL loop's: samples a trainer stand-in trains on


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
    # The objective (sweep/objectives: rollouts_per_s, output_tokens_per_s,
    # informative_groups_per_s, trained_samples_per_s), which says how a trial is measured.
    metric: Text = "rollouts_per_s"
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
    # The parallelism to recommend on a curve that runs level to its server's ceiling:
    # 80% of the peak (the NeMo Gym guide's headroom), or the ceiling itself.
    recommend: Literal["headroom", "ceiling"] = "headroom"
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
        self._groups_on_engine(TRAINED, "trains on GRPO groups", "the loop")
        if self.search_space.over_sample or self.search_space.carry_over or workload.batch:
            raise ValueError(
                f"objective {TRAINED} takes its batch from workload.loop.batch_groups or "
                "search_space.batch_groups: remove over_sample, carry_over and workload.batch"
            )
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
        self._groups_on_engine(GOODPUT, "counts groups whose rewards differ", "training steps")
        fixed = workload.batch.batch_groups if workload.batch else None
        if fixed is None and "batch_groups" not in searched:
            raise ValueError(
                f"objective {GOODPUT} runs training steps: give workload.batch.batch_groups "
                "or search search_space.batch_groups"
            )
        return self

    def _groups_on_engine(self, metric: str, why_groups: str, what: str) -> None:
        """An objective that runs GRPO groups through autotune's engine needs groups, a
        target the engine calls, and no second objective."""
        if self.workload.num_repeats < 2:
            raise ValueError(
                f"objective {metric} {why_groups}: set workload.num_repeats to the group size "
                "(2 or more)"
            )
        if not self.target.starts_server and self.target.kind != "server":
            raise ValueError(
                f"objective {metric} runs {what} through autotune's engine: use kind: sim, "
                f"server or a launched engine ({', '.join(ENGINES)}), not {self.target.kind}"
            )
        if self.objective.second_objective is not None:
            raise ValueError(f"objective {metric} has no second objective; remove it")

    @model_validator(mode="after")
    def _knobs_need_a_launcher(self) -> Study:
        kind, resources = self.target.kind, self.resources
        if kind == "sim" and resources is not None and (resources.gpu or resources.model_profile):
            raise ValueError(
                "resources.gpu and resources.model_profile are for a real server: the "
                "simulator takes its own as --gpu and --model in target.args"
            )
        if not self.target.starts_server and resources is not None:
            raise ValueError(
                f"kind: {kind} starts no server, so no GPUs can be split into engines; "
                "remove resources, or use kind: vllm, sglang, trtllm or sim"
            )
        if not self.target.starts_server and self.search_space.server_knobs():
            raise ValueError(
                f"kind: {kind} starts no server, so no server flag can change; "
                "search only parallelism, or use kind: vllm, sglang, trtllm or sim"
            )
        engine = self.target.engine
        knobs = self.search_space.server_knobs() if engine is not None else {}
        for name in knobs:
            why = engine.knob_problem(name) if engine is not None else None
            if why is not None and engine is not None:
                raise ValueError(f"search_space.{name}: {engine.title} has none: {why}")
        for flag in self.search_space.flags if engine is not None else ():
            name = engine.field_of(flag) if engine is not None else flag
            if name in LAUNCHER_SETS:
                raise ValueError(f"search_space.flags sets {flag}, which autotune sets itself")
            if name == "data_parallel_size":
                raise ValueError(
                    f"search_space.flags sets {flag}, which resources.gpus decides (engines × "
                    "tensor_parallel_size); remove it"
                )
        why = engine.knob_problem("data_parallel_size") if engine is not None else None
        if why is not None and resources is not None and resources.replicas == "data-parallel":
            raise ValueError(f"resources.replicas: data-parallel, but {why}")
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


def study_target_config(study: Study) -> TargetConfig:
    """What the study's probes call the server with (ignore_eos where automatic)."""
    workload = study.workload
    extra_body = workload.extra_body
    if extra_body is None:
        synthetic_on_sim = workload.input is None and study.target.kind == "sim"
        if synthetic_on_sim and not lengths_sampled(study.target.args):
            extra_body = {"ignore_eos": True}
        else:
            extra_body = {}
    # A launched engine serves target.model: calls then name the model it lists.
    server = (
        study.target
        if study.target.engine is None
        else study.target.model_copy(update={"model": None})
    )
    return target_config(workload, server, extra_body=extra_body)
