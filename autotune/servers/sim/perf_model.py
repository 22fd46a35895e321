"""How long one engine step takes: the simulator's roofline performance model, no I/O.
Weights and KV/token below are hardware/memory.py's, which also says how much KV cache fits.

Time of one step (one forward pass of the whole running batch):

    t = SCHEDULER_OVERHEAD_S
      + max(bytes ÷ (hbm_bandwidth × MEMORY_EFFICIENCY), flops ÷ (peak × COMPUTE_EFFICIENCY))
      + (tp > 1) 2 × layers × (ALLREDUCE_LATENCY_S + act_bytes × 2(tp−1)/tp ÷ link_bandwidth)

    bytes = weights (every step reads all of them) + KV/token × context_tokens
    flops = 2 × params ÷ tp × (decode_seqs + prefill_tokens)
          + 4 × layers × heads × head_dim ÷ tp × context_tokens   (QKᵀ and A·V of decodes)
    act_bytes = (decode_seqs + prefill_tokens) × hidden_size × bytes_per_param

Decode at small batch is bound by reading the weights (8B on one H100: 16 GB ÷ 2.7 TB/s ≈
6 ms, ≈ 150 tokens/s per sequence); adding sequences costs almost nothing until the step's
flops or its KV reads catch up, which is why throughput grows with batch and then flattens.
Omitted: prefill attention's quadratic term (≤ ~15% at 8k-token prompts), MoE, quantisation.
"""

from __future__ import annotations

from autotune.hardware.memory import kv_bytes_per_token_per_gpu, weights_bytes_per_gpu
from autotune.hardware.profiles import GpuProfile, ModelProfile

MEMORY_EFFICIENCY = 0.80
"""Share of datasheet HBM bandwidth a decode step sustains (weight-streaming GEMV kernels)."""

COMPUTE_EFFICIENCY = 0.60
"""Share of datasheet dense bf16 FLOP/s that large prefill GEMMs sustain in vLLM."""

SCHEDULER_OVERHEAD_S = 0.0005
"""Fixed host-side cost per step: scheduling, input preparation, sampling, kernel launches."""

ALLREDUCE_LATENCY_S = 8e-6
"""Latency of one small tensor-parallel all-reduce (vLLM's custom all-reduce over NVLink)."""

LINK_EFFICIENCY = 0.70
"""Share of one direction of the GPU-to-GPU link an all-reduce achieves."""


def allreduce_time_s(gpu: GpuProfile, model: ModelProfile, tp: int, tokens: int) -> float:
    """Tensor-parallel communication per step: two ring all-reduces per layer (attention, MLP)."""
    if tp <= 1:
        return 0.0
    act_bytes = tokens * model.hidden_size * model.bytes_per_param
    one_direction = gpu.interconnect_bytes_per_s / 2 * LINK_EFFICIENCY
    per_allreduce = ALLREDUCE_LATENCY_S + act_bytes * 2 * (tp - 1) / tp / one_direction
    return 2 * model.layers * per_allreduce


def step_time_s(
    gpu: GpuProfile,
    model: ModelProfile,
    tp: int,
    decode_seqs: int,
    prefill_tokens: int,
    context_tokens: int,
) -> float:
    """Seconds one engine step takes (see the module docstring for the model).

    `context_tokens` is the number of cached tokens the step's attention reads (for a batch
    of decodes: the sum of their current lengths).
    """
    tokens = decode_seqs + prefill_tokens
    bytes_moved = (
        weights_bytes_per_gpu(model, tp) + kv_bytes_per_token_per_gpu(model, tp) * context_tokens
    )
    flops = 2 * model.params / tp * tokens + (
        4 * model.layers * model.attention_heads * model.head_dim / tp * context_tokens
    )
    memory_time = bytes_moved / (gpu.hbm_bytes_per_s * MEMORY_EFFICIENCY)
    compute_time = flops / (gpu.bf16_flops * COMPUTE_EFFICIENCY)
    return (
        SCHEDULER_OVERHEAD_S
        + max(memory_time, compute_time)
        + allreduce_time_s(gpu, model, tp, tokens)
    )
