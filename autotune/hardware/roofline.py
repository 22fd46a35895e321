"""The output-token ceiling of replicas of one model at datasheet peaks: a bound, no I/O,
that every sweep trial is scored against.
The formula, and why: docs/design/hardware.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.hardware.memory import (
    InsufficientMemory,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
)
from autotune.hardware.profiles import GpuProfile, ModelProfile


@dataclass(frozen=True)
class Roofline:
    """The ceiling and the figures it comes from (times of one engine)."""

    output_tokens_per_s: float
    batch: int  # sequences per engine
    decode_step_s: float
    prefill_s: float  # prefill of one batch
    bound: str  # "memory" or "compute": what limits the decode step


def roofline(
    gpu: GpuProfile,
    model: ModelProfile,
    tp: int,
    engines: int,
    prompt_tokens: float,
    output_tokens: float,
    *,
    max_num_seqs: int = 256,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    cached_prompt_share: float = 0.0,
    batch: int | None = None,
) -> Roofline:
    """The output-tokens/s ceiling of `engines` replicas of tensor-parallel size `tp`
    (see the module docstring for the formula).

    Raises InsufficientMemory when the weights leave no KV cache or, without `batch`,
    when one request of prompt + output tokens does not fit it; ValueError on nonsense.
    """
    if tp < 1 or engines < 1 or max_num_seqs < 1 or (batch is not None and batch < 1):
        raise ValueError("tp, engines, max_num_seqs and batch must each be at least 1")
    if not (prompt_tokens > 0 and output_tokens > 0):
        raise ValueError("prompt_tokens and output_tokens must both be above 0")
    if not 0 <= cached_prompt_share <= 1:
        raise ValueError("cached_prompt_share must be a share from 0 to 1")
    capacity = kv_capacity_tokens(gpu, model, tp, gpu_memory_utilization, block_size)
    if batch is None:
        batch = min(max_num_seqs, int(capacity // (prompt_tokens + output_tokens)))
        if batch < 1:
            raise InsufficientMemory(
                f"one request of {prompt_tokens + output_tokens:g} tokens exceeds the KV "
                f"cache ({capacity} tokens per engine). Try increasing "
                "`gpu_memory_utilization` or `tensor_parallel_size`."
            )
    flops_per_token = 2 * model.active_params / tp
    context = batch * (prompt_tokens + output_tokens / 2)
    peak = gpu.dense_flops(model.bytes_per_param)
    prefill_s = flops_per_token * (1 - cached_prompt_share) * prompt_tokens * batch / peak
    step_bytes = (
        model.weight_bytes_read(batch) / tp + kv_bytes_per_token_per_gpu(model, tp) * context
    )
    attention = 4 * model.kv_layers * model.attention_heads * model.head_dim / tp * context
    memory_s = step_bytes / gpu.hbm_bytes_per_s
    compute_s = (flops_per_token * batch + attention) / peak
    step_s = max(memory_s, compute_s)
    return Roofline(
        output_tokens_per_s=engines * batch * output_tokens / (prefill_s + output_tokens * step_s),
        batch=batch,
        decode_step_s=step_s,
        prefill_s=prefill_s,
        bound="memory" if memory_s >= compute_s else "compute",
    )
