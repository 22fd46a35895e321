"""The server's knobs, declared once (`ServerKnobs`: type, range, default, meaning), and the
search space a study draws them from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, get_args

from pydantic import AfterValidator, Field, create_model, model_validator

from autotune.config.fields import Count, Flag, Share, SpecModel, must_be, problem
from autotune.config.flags import field_name
from autotune.config.rl_specs import BATCH_KNOBS, LOOP_KNOBS, LoopMode, PauseMode


@dataclass(frozen=True, slots=True)
class Knob:
    """What a server knob means, and its flag in OpenRLHF where OpenRLHF has one (each
    name read from OpenRLHF's own code or docs; none is guessed)."""

    help: str
    openrlhf: str | None = None
    choices_only: bool = False  # a search space lists its values (no range)


class ServerKnobs(SpecModel):
    """vLLM's engine knobs autotune launches servers with and searches, by vLLM's names
    (`--kebab-case VALUE` on its command line), with vLLM's defaults as the simulator
    models them: the one home of their types, ranges and defaults for the simulator's
    flags, a study's search space, a bench suite's server_args and the recommendation."""

    what: ClassVar[str] = "server knobs"
    tensor_parallel_size: Annotated[
        Count,
        Knob("GPUs the model is split over", "--vllm.tensor_parallel_size", choices_only=True),
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
    named = {field_name(name): value for name, value in values.items()}
    known = {name: value for name, value in named.items() if name in ServerKnobs.model_fields}
    ServerKnobs.model_validate(known)
    return values


ServerArgs = Annotated[
    dict[str, Any], must_be("a mapping of server flag to value", inner=False),
    AfterValidator(_server_args),
]  # fmt: skip


# A study with `resources` searches how its GPUs split into engines × tensor-parallel size
# (sweep/feasibility.py `splits`): one categorical parameter of this name, each trial's knobs
# holding the engines under NUM_ENGINES and the size under tensor_parallel_size.
SPLIT = "split"


NUM_ENGINES = "num_engines"


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


def launcher_flag_problem(flag: str, name: str | None = None) -> str | None:
    """Why `flag` (a server flag, any spelling; `name`: its field, where an engine spells
    it otherwise) is the launcher's to set, else None."""
    name = name or field_name(flag)
    if name == "port":
        return f"sets {flag}, which autotune picks itself (a free port per server); remove it"
    if name == "host":
        return f"sets {flag}; use the study's target.host instead (default 127.0.0.1)"
    if name == "model":
        return f"sets {flag}; use the study's target.model instead"
    return None


def _knob_space(name: str) -> Any:
    """The space a study searches a knob in, from its declaration: listed values for a
    flag or a choices-only knob, else a range or listed values of its type."""
    field = ServerKnobs.model_fields[name]
    if field.annotation is bool or knob(name).choices_only:
        return ChoiceSpace
    return FloatOrChoices if field.annotation is float else IntOrChoices


# Client parallelism, then one optional space per server knob, in ServerKnobs' order
# (enable_prefix_caching {choices: [true, false]}: whether the prefix cache pays).
_SPACES: dict[str, Any] = {
    "parallelism": (ParallelismSpace, ParallelismSpace()),
    **{name: (_knob_space(name) | None, None) for name in SERVER_KNOBS},
}
KnobSpaces = create_model("KnobSpaces", __base__=SpecModel, **_SPACES)


class SearchSpace(KnobSpaces):  # type: ignore[valid-type, misc]
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
            why = launcher_flag_problem(flag)
            if why is not None:
                raise ValueError(f"flags {why}")
            if field_name(flag) in ("data_parallel_size", NUM_ENGINES):
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
            knobs[field_name(flag)] = space
        return knobs
