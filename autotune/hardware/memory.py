"""How much KV cache fits on a GPU beside a model's weights: vLLM's memory budget, no I/O.
The formula, and why it lives here: docs/design/hardware.md.
"""

from __future__ import annotations

from autotune.hardware.profiles import GiB, GpuProfile, ModelProfile

RUNTIME_RESERVE_BYTES = 2 * GiB
"""Per-GPU memory that is neither weights nor KV cache (activations, CUDA graphs, NCCL)."""


class InsufficientMemory(ValueError):
    """The model's weights, or its weights plus the runtime reserve, leave no room for KV cache."""


def weights_bytes_per_gpu(model: ModelProfile, tp: int) -> float:
    """Weight bytes each GPU holds (weights are sharded evenly across tensor-parallel ranks)."""
    return model.weight_bytes / tp


def kv_bytes_per_token_per_gpu(model: ModelProfile, tp: int) -> float:
    """Bytes of K and V one token occupies on each GPU (KV heads replicated past tp = kv_heads)."""
    kv_heads_per_gpu = max(model.kv_heads / tp, 1.0)
    return 2 * model.kv_layers * kv_heads_per_gpu * model.head_dim * model.bytes_per_param


def kv_capacity_tokens(
    gpu: GpuProfile,
    model: ModelProfile,
    tp: int,
    gpu_memory_utilization: float,
    block_size: int,
) -> int:
    """Tokens the KV cache holds across the whole batch, in whole blocks of `block_size`.

    Raises InsufficientMemory, worded like vLLM's error, when nothing is left for KV blocks.
    """
    budget = int(gpu.memory_bytes * gpu_memory_utilization)
    weights = weights_bytes_per_gpu(model, tp)
    advice = "Try increasing `gpu_memory_utilization` or `tensor_parallel_size`."
    where = (
        f"gpu_memory_utilization={gpu_memory_utilization:.2f} of {gpu.name} "
        f"leaves {budget / GiB:.1f} GiB"
    )
    if weights >= budget:
        raise InsufficientMemory(
            "No available memory for the cache blocks: model weights need "
            f"{weights / GiB:.1f} GiB per GPU but {where}. {advice}"
        )
    free = budget - weights - RUNTIME_RESERVE_BYTES
    blocks = int(free // (kv_bytes_per_token_per_gpu(model, tp) * block_size)) if free > 0 else 0
    if blocks < 1:
        raise InsufficientMemory(
            "No available memory for the cache blocks: model weights need "
            f"{weights / GiB:.1f} GiB per GPU plus {RUNTIME_RESERVE_BYTES / GiB:.1f} GiB of "
            f"activations and runtime but {where}. {advice}"
        )
    return blocks * block_size
