"""Whether a model can start on given GPUs, known before launching it (vLLM's start-up
refusals the model's shape and the GPU's memory predict), and a GPU budget's splits.
Why: docs/design/hardware.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.hardware.memory import InsufficientMemory, kv_capacity_tokens
from autotune.hardware.profiles import GpuProfile, ModelProfile

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
GpuMemory = Callable[[], int | None]  # bytes of one GPU, None when no GPU can be read


@dataclass(frozen=True, slots=True)
class Split:
    """A GPU budget spent as `engines` replicas of the model, each over `tp` GPUs."""

    engines: int
    tp: int

    @property
    def name(self) -> str:
        """`4x2`: the sampler's categorical value and the report's label."""
        return f"{self.engines}x{self.tp}"

    @classmethod
    def parse(cls, name: str) -> Split:
        engines, tp = name.split("x")
        return cls(int(engines), int(tp))


def tp_problem(model: ModelProfile, tp: int) -> str | None:
    """Why vLLM cannot shard `model` over `tp` GPUs (its attention heads, or its KV
    heads, which are split or replicated evenly), else None."""
    if tp < 1 or model.attention_heads % tp:
        return (
            f"Total number of attention heads ({model.attention_heads}) must be divisible by "
            f"tensor parallel size ({tp})."
        )
    kv = model.kv_heads
    if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
        return (
            f"The {kv} KV heads of {model.name} cannot be split evenly over tensor parallel "
            f"size {tp}: one must divide the other."
        )
    return None


def weights_fit(model: ModelProfile, memory: int, tp: int, gpu_memory_utilization: float) -> bool:
    """The weights, runtime and one block of KV fit a GPU of `memory` bytes at
    `gpu_memory_utilization`."""
    gpu = GpuProfile("this GPU", memory, 0.0, 0.0, 0.0, "NVML")
    try:
        kv_capacity_tokens(gpu, model, tp, gpu_memory_utilization, 16)
    except InsufficientMemory:
        return False
    return True


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
    refused = tp_problem(model, tp)
    if refused is not None:
        return refused, None
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


def gpu_bytes() -> int | None:
    """The smallest visible GPU's memory (what a tensor-parallel rank gets), via NVML."""
    from autotune.telemetry.gpu import gpu_inventory

    sizes = [gpu["memory_total_gib"] for gpu in gpu_inventory()]
    return math.floor(min(sizes) * (1 << 30)) if sizes else None


Lengths = tuple[tuple[int, int], tuple[int, int]]  # (prompt, output) tokens as (mean, std)


@dataclass(frozen=True, slots=True)
class Batch:
    """How many of a workload's sequences one engine runs at once, known before launch."""

    problem: str | None  # why the workload cannot run on it, in the server's own words
    ceiling: int | None  # the most requests it runs at once, if known
    # The KV cache holds max_num_seqs whole rollouts: memory utilisation sizes nothing
    # that limits a batch, so it changes nothing a sweep measures.
    cache_to_spare: bool = False


def batch_fit(lengths: Lengths | None, settings: Mapping[str, Any], kv_tokens: int | None) -> Batch:
    """The ceiling: max_num_seqs, or the sequences the KV cache holds at once if fewer,
    each holding its prompt and half its output on average while it decodes (`settings`:
    the server's knobs as far as they are known; `lengths` None: a task file's lengths are
    not known before it runs)."""
    seqs = int(settings["max_num_seqs"]) if "max_num_seqs" in settings else None
    context = int(settings["max_model_len"]) if "max_model_len" in settings else None
    if lengths is not None and context is not None:
        prompt, output = lengths
        if prompt[0] + output[0] > context:
            return Batch(
                f"a mean rollout ({prompt[0]} prompt + {output[0]} output tokens) is longer "
                f"than max_model_len ({context}): vLLM refuses such a request with a 400; "
                "raise max_model_len",
                None,
            )
    if kv_tokens is None or lengths is None:
        return Batch(None, seqs)
    prompt, output = lengths
    held = max(1, kv_tokens // (prompt[0] + output[0] // 2))
    if seqs is None:
        return Batch(None, held)
    # Every sequence at its longest (mean + 3 std of both lengths) still fits; none is
    # longer than max_model_len, whose KV blocks are all one sequence can hold.
    longest = prompt[0] + 3 * prompt[1] + output[0] + 3 * output[1]
    if context is not None:
        longest = min(longest, context)
    return Batch(None, min(seqs, held), cache_to_spare=kv_tokens >= seqs * longest)
