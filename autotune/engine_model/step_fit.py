"""Fitting the step model's coefficients to measured runs, no I/O.
The closed form of a measured run and how the fit is made: docs/design/engine-model.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from autotune.engine_model.perf_model import step_time_s
from autotune.hardware.profiles import GpuProfile, ModelProfile, StepCoefficients

# Log-uniform ranges of the random start: wide enough for any GPU, engine and model.
RANGES = {
    "memory_efficiency": (0.1, 1.0),
    "compute_efficiency": (0.02, 1.0),
    "step_overhead_s": (1e-5, 2e-2),
    "allreduce_latency_s": (1e-7, 1e-4),
}
STARTS = 300  # random starts, of which the best REFINED are refined by least squares
REFINED = 4


@dataclass(frozen=True, slots=True)
class RunPoint:
    """One measured point: a TP at a client concurrency, its lengths, its medians."""

    tp: int
    concurrency: int
    input_tokens: int
    output_tokens: int
    tpot_s: float
    tokens_per_s_per_gpu: float


@dataclass(frozen=True, slots=True)
class Engine:
    """What the steady state depends on besides the coefficients."""

    gpu: GpuProfile
    model: ModelProfile
    max_num_batched_tokens: int


def steady_state(
    engine: Engine,
    coefficients: StepCoefficients,
    tp: int,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
) -> tuple[float, float]:
    """(TPOT in seconds, output tokens/s per GPU) of a closed loop (the module's formula)."""
    n = concurrency
    budget = max(engine.max_num_batched_tokens - n, 1)
    chunks = math.ceil(input_tokens / budget)
    context = n * (input_tokens + output_tokens // 2)

    def step(prefill_tokens: int) -> float:
        return step_time_s(engine.gpu, engine.model, tp, n, prefill_tokens, context, coefficients)

    prefill_step = step(math.ceil(input_tokens / chunks))
    decode_step = step(0)
    decodes = max(output_tokens - 1, 1)
    shared = min((n - 1) * chunks, decodes)
    tpot = (shared * prefill_step + (decodes - shared) * decode_step) / decodes
    ttft = chunks * prefill_step
    throughput = n * output_tokens / (ttft + decodes * tpot) / tp
    return tpot, throughput


def residuals(
    engine: Engine, coefficients: StepCoefficients, points: Sequence[RunPoint]
) -> list[float]:
    """Log errors of TPOT and of throughput at each point."""
    out = []
    for p in points:
        tpot, throughput = steady_state(
            engine, coefficients, p.tp, p.concurrency, p.input_tokens, p.output_tokens
        )
        out += [math.log(tpot / p.tpot_s), math.log(throughput / p.tokens_per_s_per_gpu)]
    return out


def fit(engine: Engine, points: Sequence[RunPoint], seed: int = 0) -> StepCoefficients:
    """The coefficients that fit `points` best (see the module docstring)."""
    rng = random.Random(seed)
    low = np.log([bounds[0] for bounds in RANGES.values()])
    high = np.log([bounds[1] for bounds in RANGES.values()])

    def coefficients(logs: Sequence[float]) -> StepCoefficients:
        values = {name: float(math.exp(log)) for name, log in zip(RANGES, logs, strict=True)}
        return replace(StepCoefficients(), **values)

    def cost(logs: Sequence[float]) -> float:
        return sum(r * r for r in residuals(engine, coefficients(logs), points))

    starts = [[rng.uniform(a, b) for a, b in zip(low, high, strict=True)] for _ in range(STARTS)]
    starts.sort(key=cost)
    best = min(
        (
            least_squares(
                lambda logs: residuals(engine, coefficients(logs), points),
                start,
                bounds=(low, high),
                x_scale=1.0,
            )
            for start in starts[:REFINED]
        ),
        key=lambda solution: solution.cost,
    )
    return coefficients(best.x)
