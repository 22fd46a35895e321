"""How long one engine step takes: the simulator's roofline performance model, no I/O.
Weights and KV/token are hardware/memory.py's, which also says how much KV cache fits.
The model's formula, and why: docs/design/engine-model.md.
"""

from __future__ import annotations

from autotune.hardware.memory import kv_bytes_per_token_per_gpu
from autotune.hardware.profiles import GpuProfile, ModelProfile, StepCoefficients

DEFAULT_COEFFICIENTS = StepCoefficients()


def allreduce_time_s(
    gpu: GpuProfile,
    model: ModelProfile,
    tp: int,
    tokens: int,
    coefficients: StepCoefficients = DEFAULT_COEFFICIENTS,
) -> float:
    """Tensor-parallel communication per step: two ring all-reduces per layer (attention, MLP)."""
    if tp <= 1:
        return 0.0
    act_bytes = tokens * model.hidden_size * model.bytes_per_param
    one_direction = gpu.interconnect_bytes_per_s / 2 * coefficients.link_efficiency
    per_allreduce = coefficients.allreduce_latency_s + act_bytes * 2 * (tp - 1) / tp / one_direction
    return 2 * model.layers * per_allreduce


def step_time_s(
    gpu: GpuProfile,
    model: ModelProfile,
    tp: int,
    decode_seqs: int,
    prefill_tokens: int,
    context_tokens: int,
    coefficients: StepCoefficients = DEFAULT_COEFFICIENTS,
) -> float:
    """Seconds one engine step takes (see the module docstring for the model).

    `context_tokens` is the number of cached tokens the step's attention reads (for a batch
    of decodes: the sum of their current lengths).
    """
    tokens = decode_seqs + prefill_tokens
    bytes_moved = (
        model.weight_bytes_read(tokens) / tp
        + kv_bytes_per_token_per_gpu(model, tp) * context_tokens
    )
    flops = 2 * model.active_params / tp * tokens + (
        4 * model.kv_layers * model.attention_heads * model.head_dim / tp * context_tokens
    )
    memory_time = bytes_moved / (gpu.hbm_bytes_per_s * coefficients.memory_efficiency)
    peak = gpu.dense_flops(model.bytes_per_param)
    compute_time = flops / (peak * coefficients.compute_efficiency)
    return (
        coefficients.step_overhead_s
        + max(memory_time, compute_time)
        + allreduce_time_s(gpu, model, tp, tokens, coefficients)
    )
