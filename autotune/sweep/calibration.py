"""`autotune sim calibrate`: the simulator's step model fitted to a table of measured runs,
and the error it then makes, measured on its own engine in virtual time.
Why: docs/design/sweep.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from autotune.config.knobs import KNOBS
from autotune.engine_model.step_fit import Engine, RunPoint, fit, steady_state
from autotune.errors import UsageError
from autotune.hardware.calibrated import CalibratedProfile, PointError
from autotune.hardware.measured import MeasuredBlock, SurfaceError, load_block
from autotune.hardware.profiles import (
    GPUS,
    GpuProfile,
    ModelProfile,
    StepCoefficients,
    find_model,
)
from autotune.probe.virtual import VirtualSimLauncher
from autotune.results.probes import ProbeResult
from autotune.window import ProbeSettings

FLAGS = ("TABLE", "--where")
WINDOW_LATENCIES = 24.0  # a point's probe runs at most this many request latencies
WARMUP_LATENCIES = 2.0


def table_hardware(block: MeasuredBlock, gpu_name: str | None) -> tuple[GpuProfile, ModelProfile]:
    """The GPU (`gpu_name`, else the one the block's `hw` names) and model profiles of a
    block; UsageError, in one sentence, for one autotune has no profile of."""
    hw = block.key.get("hw", "")
    if gpu_name is not None:
        gpu = GPUS.get(gpu_name)
        if gpu is None:
            raise UsageError(f"--gpu {gpu_name}: not a GPU profile; use one of {', '.join(GPUS)}.")
    else:
        named = [profile for name, profile in GPUS.items() if name.split("-")[0] == hw.lower()]
        if len(named) != 1:
            raise UsageError(
                f"the table's hw {hw!r} names no one GPU profile; pass --gpu, one of "
                f"{', '.join(GPUS)}."
            )
        gpu = named[0]
    model = find_model(block.key.get("model", ""))
    if model is None:
        raise UsageError(
            f"the table's model {block.key.get('model')!r} has no model profile in autotune "
            "(hardware/profiles.py); calibrate a model it has."
        )
    return gpu, model


def _points(block: MeasuredBlock) -> list[RunPoint]:
    return [
        RunPoint(
            tp,
            concurrency,
            block.input_tokens,
            block.output_tokens,
            point.median_tpot_s,
            point.output_tokens_per_s_per_gpu,
        )
        for tp, by_concurrency in block.points.items()
        for concurrency, point in by_concurrency.items()
    ]


async def run_point(
    profile: Path, coefficients: StepCoefficients, engine: Engine, point: RunPoint
) -> ProbeResult:
    """The engine that `sim serve --profile PROFILE` runs, at one point's TP, concurrency
    and lengths, in virtual time; the probe's window spans a set number of its request
    latencies, as the profile's `coefficients` predict them."""
    _, throughput = steady_state(
        engine,
        coefficients,
        point.tp,
        point.concurrency,
        point.input_tokens,
        point.output_tokens,
    )
    latency = point.concurrency * point.output_tokens / throughput / point.tp
    settings = ProbeSettings(
        point.concurrency,
        warmup_s=WARMUP_LATENCIES * latency,
        min_s=WINDOW_LATENCIES / 2 * latency,
        max_s=WINDOW_LATENCIES * latency,
    )
    launcher = VirtualSimLauncher(
        ["--profile", str(profile)],
        settings,
        prompt_tokens=(point.input_tokens, 0),
        output_tokens=(point.output_tokens, 0),
    )
    knobs = {
        "tensor_parallel_size": point.tp,
        "max_num_seqs": max(KNOBS.max_num_seqs, point.concurrency),
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "max_model_len": point.input_tokens + point.output_tokens + 1,
    }
    async with launcher.running(knobs) as probe:
        return await probe.measure(point.concurrency)


def tpot_s(result: ProbeResult, output_tokens: int) -> float:
    """The median time per output token after the first, from the probe's medians."""
    total, first = result.latency_s["total"].p50, result.latency_s["ttft"].p50
    assert total is not None and first is not None  # a window holds completions
    return (total - first) / max(output_tokens - 1, 1)


async def simulate(
    profile: Path, coefficients: StepCoefficients, engine: Engine, point: RunPoint
) -> PointError:
    """The simulator's error at one measured point (run_point)."""
    result = await run_point(profile, coefficients, engine, point)
    return PointError(
        tp=point.tp,
        concurrency=point.concurrency,
        measured_tokens_per_s_per_gpu=point.tokens_per_s_per_gpu,
        simulated_tokens_per_s_per_gpu=result.output_tokens_per_s / point.tp,
        measured_tpot_s=point.tpot_s,
        simulated_tpot_s=tpot_s(result, point.output_tokens),
    )


def fit_profile(
    table: Path,
    where: Mapping[str, str],
    gpu_name: str | None = None,
    max_num_batched_tokens: int = KNOBS.max_num_batched_tokens,
) -> tuple[CalibratedProfile, MeasuredBlock]:
    """The profile fitted to the configuration `where` picks out of `table` (its error
    not yet measured), and that configuration's measured block."""
    try:
        block = load_block(table, where, FLAGS)
    except SurfaceError as error:
        raise UsageError(f"{error}.") from None
    gpu, model = table_hardware(block, gpu_name)
    coefficients = fit(Engine(gpu, model, max_num_batched_tokens), _points(block))
    return CalibratedProfile(gpu, model, coefficients, table.name, dict(block.key)), block


def calibrate(
    table: Path,
    where: Mapping[str, str],
    output: Path,
    gpu_name: str | None = None,
    max_num_batched_tokens: int = KNOBS.max_num_batched_tokens,
) -> CalibratedProfile:
    """Fit the configuration `where` picks out of `table`, write its profile to `output`,
    measure the simulator's error at each point and write the profile again with it."""
    profile, block = fit_profile(table, where, gpu_name, max_num_batched_tokens)
    profile.save(output)
    engine = Engine(profile.gpu, profile.model, max_num_batched_tokens)
    coefficients = profile.coefficients
    points = _points(block)

    async def every_point() -> list[PointError]:
        return [await simulate(output, coefficients, engine, point) for point in points]

    errors = asyncio.run(every_point())
    profile = dataclasses.replace(profile, points=tuple(errors))
    profile.save(output)
    return profile
