"""What is known before launching a configuration: whether it can start at all.

A launch costs 30 s to minutes on real hardware, and a configuration that cannot fit
(the weights and a KV cache at its tensor-parallel size and memory utilisation) or
cannot shard (a tensor-parallel size that does not divide the attention heads) would
only be refused after it. Such a configuration is rejected without a launch and recorded
as an infeasible trial with the reason, so the sampler learns from it for free.

The simulator's own start-up checks answer for `kind: sim`. For `kind: vllm` the model's
`config.json` (a local model directory) gives the heads and the weights' size, and NVML
the GPUs' memory; whatever cannot be read is not checked (vLLM's own refusal then
decides).

The same figures say how many requests a configuration can run at once, its `ceiling`:
`max_num_seqs`, or fewer when the KV cache holds fewer of the study's rollouts (prompt
and half the output, on average, while they decode). Parallelism past the ceiling only
queues, so a curve's ladder ends there. They also seed a study: its first trial is the
configuration that can run the most requests at once (ties: the larger knob values),
since a batching server's throughput grows with the batch it can hold, and a strong
first trial lets every later one be pruned against it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config import ChoiceSpace, FloatSpace, IntSpace, Study
from autotune.servers.flags import server_flags
from autotune.servers.sim.perf_model import InsufficientMemory, kv_capacity_tokens
from autotune.servers.sim.profiles import GpuProfile, ModelProfile

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
GpuMemory = Callable[[], int | None]  # bytes of one GPU, None when no GPU can be read


@dataclass(frozen=True, slots=True)
class Prelaunch:
    """What is known of a configuration before it is started."""

    problem: str | None  # why it cannot start, in the server's own words
    ceiling: int | None  # the most requests it can run at once, if known
    # The KV cache holds max_num_seqs whole rollouts: memory utilisation sizes nothing
    # that limits a batch, so it changes nothing the sweep measures.
    cache_to_spare: bool = False


def effective_knobs(knobs: Mapping[str, Any], known: Prelaunch) -> dict[str, Any]:
    """The knobs that decide what a configuration runs: without gpu_memory_utilization
    when its KV cache has room to spare (two such configurations are measured once)."""
    if known.cache_to_spare:
        return {name: value for name, value in knobs.items() if name != "gpu_memory_utilization"}
    return dict(knobs)


def prelaunch(
    study: Study, knobs: Mapping[str, Any], gpu_memory: GpuMemory | None = None
) -> Prelaunch:
    """Whether the configuration can start and how many requests it can run at once."""
    settings = {**_flag_values(study.target.args), **knobs}
    seqs = int(settings["max_num_seqs"]) if "max_num_seqs" in settings else None
    if study.target.kind == "sim":
        from autotune.servers.sim.server import SimConfigError, load_config

        try:
            config = load_config([*study.target.args, *server_flags(dict(knobs))])
        except SimConfigError as error:
            return Prelaunch(str(error), None)
        return _known(study, config.max_num_seqs, config.kv_capacity_tokens)
    if study.target.kind == "vllm" and study.target.model:
        model = model_profile(Path(study.target.model))
        if model is not None:
            memory = (gpu_memory or gpu_bytes)()
            problem, capacity = vllm_fit(model, settings, memory)
            if problem is not None:
                return Prelaunch(problem, None)
            return _known(study, seqs, capacity)
    return Prelaunch(None, seqs)


def seed_configuration(study: Study, gpu_count: int = 0) -> dict[str, Any] | None:
    """The first trial's knobs: among every choice and range end of the server knobs
    (tensor-parallel sizes limited to the visible GPUs), the configuration with the
    highest known ceiling, then the larger values in the knobs' order; None when no
    knob is searched or nothing is known to fit."""
    spaces = study.search_space.server_knobs()
    if not spaces:
        return None
    memory = gpu_bytes() if study.target.kind == "vllm" else None
    values = {name: _ends(space) for name, space in spaces.items()}
    if gpu_count and "tensor_parallel_size" in values:
        usable = [tp for tp in values["tensor_parallel_size"] if int(tp) <= gpu_count]
        values["tensor_parallel_size"] = usable or [1]
    ranked = []
    for combination in itertools.product(*values.values()):
        knobs = dict(zip(values, combination, strict=True))
        known = prelaunch(study, knobs, lambda: memory)
        if known.problem is None and known.ceiling is not None:
            order = [v if isinstance(v, int | float) else 0 for v in combination]
            ranked.append(((known.ceiling, *order), knobs))
    return max(ranked, key=lambda item: item[0])[1] if ranked else None


def _ends(space: IntSpace | FloatSpace | ChoiceSpace) -> list[Any]:
    """A knob's candidates for the seed: its choices, or its range's two ends."""
    if isinstance(space, ChoiceSpace):
        return list(space.choices)
    return [space.low, space.high]


def _known(study: Study, seqs: int | None, kv_tokens: int | None) -> Prelaunch:
    """The ceiling: max_num_seqs, or the rollouts the KV cache holds at once if fewer
    (synthetic work only: a task file's lengths are not known before it runs)."""
    if kv_tokens is None or study.workload.input is not None:
        return Prelaunch(None, seqs)
    prompt, output = study.workload.synthetic.prompt_tokens, study.workload.synthetic.output_tokens
    held = max(1, kv_tokens // (prompt[0] + output[0] // 2))
    if seqs is None:
        return Prelaunch(None, held)
    # Every sequence at its longest (mean + 3 std of both lengths) still fits.
    longest = prompt[0] + 3 * prompt[1] + output[0] + 3 * output[1]
    return Prelaunch(None, min(seqs, held), cache_to_spare=kv_tokens >= seqs * longest)


def model_profile(directory: Path) -> ModelProfile | None:
    """A local model's shape from its config.json and weight files; None if unreadable."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "num_attention_heads" not in config:
        return None
    width = DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype")), 2)
    weights = sum(
        path.stat().st_size
        for pattern in ("*.safetensors", "*.bin")
        for path in directory.glob(pattern)
    )
    heads = int(config["num_attention_heads"])
    hidden = int(config.get("hidden_size", 0))
    return ModelProfile(
        name=directory.name,
        params=weights // width,
        layers=int(config.get("num_hidden_layers", 0)),
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=int(config.get("num_key_value_heads", heads)),
        head_dim=int(config.get("head_dim") or (hidden // heads if heads else 0)),
        max_position_embeddings=int(config.get("max_position_embeddings", 0)),
        bytes_per_param=width,
        source=str(directory / "config.json"),
    )


def vllm_fit(
    model: ModelProfile, settings: Mapping[str, Any], gpu_memory: int | None
) -> tuple[str | None, int | None]:
    """vLLM's start-up refusals that the model's shape and the GPU's memory predict, and
    the KV cache's tokens (None without a GPU to read)."""
    tp = int(settings.get("tensor_parallel_size", 1))
    if tp < 1 or model.attention_heads % tp:
        return (
            f"Total number of attention heads ({model.attention_heads}) must be divisible by "
            f"tensor parallel size ({tp})."
        ), None
    if gpu_memory is None or model.params == 0:
        return None, None
    gpu = GpuProfile("this GPU", gpu_memory, 0.0, 0.0, 0.0, "NVML")
    block = int(settings.get("block_size", 16))
    try:
        capacity = kv_capacity_tokens(
            gpu, model, tp, float(settings.get("gpu_memory_utilization", 0.9)), block
        )
    except InsufficientMemory as error:
        return str(error), None
    wanted = int(settings.get("max_model_len", model.max_position_embeddings))  # vLLM's default
    if wanted > capacity:
        return (
            f"The model's max seq len ({wanted}) is larger than the maximum number of tokens "
            f"that can be stored in KV cache ({capacity}). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len`."
        ), capacity
    return None, capacity


def _flag_values(args: list[str]) -> dict[str, str]:
    """`--max-model-len 2048` and `--block-size=32` in fixed args, by knob name."""
    values: dict[str, str] = {}
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, equals, value = arg[2:].partition("=")
        if not equals and index + 1 < len(args) and not args[index + 1].startswith("--"):
            value = args[index + 1]
        if value:
            values[name.replace("-", "_")] = value
    return values


def gpu_bytes() -> int | None:
    """The smallest visible GPU's memory (what a tensor-parallel rank gets), via NVML."""
    from autotune.telemetry.gpu import gpu_inventory

    sizes = [gpu["memory_total_gib"] for gpu in gpu_inventory()]
    return math.floor(min(sizes) * (1 << 30)) if sizes else None
