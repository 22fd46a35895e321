"""A real run's step replayed by the RL loop on the simulator: its generation, its trainer's
passes and what neither hides, in time compressed to a second or two a step; and what-ifs
(asynchronous training at another split of the GPUs) run in the same lanes."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.config.rl_specs import LoopMode, LoopSpec
from autotune.doctor.remedies import Lanes
from autotune.results.runs import LoopSummary
from autotune.rl.loop_job import loop
from autotune.servers.launcher import ServerSpec

GROUPS, SAMPLES, TOKENS = 4, 4, 64  # a step's batch: B groups of n samples, fixed lengths
STEP_S = 1.5  # a replayed step lasts about this long
# The simulator's time scales a batch is timed at: about the scales a replay runs at (a
# step of 1.5 s generates at 1 to 3), since a few ms of jitter in a batch timed at 0.1 (45 ms)
# moved the slope extrapolated from it by 7% on a busy machine.
CALIBRATION_SCALES = (0.5, 2.0)
CALIBRATION_STEPS = 5
STEPS = 6


BatchTime = tuple[float, float]  # a batch's seconds per unit of time scale, a fixed part


async def replay(
    lanes: Lanes, batch_time: BatchTime, mode: LoopMode = "sync", scale_from: Lanes | None = None
) -> float:
    """The lanes (doctor.remedies' model of a step) run by the loop's trainer stand-in on a
    fresh simulator, `mode` (async: one step ahead): its median step back in the run's
    seconds. `scale_from`: the lanes whose step sets the compression (a what-if is
    compressed as the run it changes)."""
    compress = STEP_S / (scale_from or lanes).step_s
    per_scale, overhead = batch_time
    scale = max(1e-4, (lanes.generation_s * compress - overhead) / per_scale)
    spec = LoopSpec.model_validate(
        {
            "mode": mode,
            "batch_groups": GROUPS,
            "steps": STEPS,
            "train_s": ("fixed", lanes.trainer_s * compress, 0.0),
            "sync_s": ("fixed", lanes.exposed_s * compress, 0.0),
            **({"max_ahead": GROUPS} if mode == "async" else {}),
        }
    )
    async with _simulator(scale) as base_url:
        summary = await loop(_config(base_url), spec)
    return step_period(summary) / compress


async def calibrate() -> BatchTime:
    """A batch's generation time as seconds per unit of time scale and a fixed part (the
    client's and the server's own work), from batches timed at two time scales."""
    times = []
    for scale in CALIBRATION_SCALES:
        async with _simulator(scale) as base_url:
            summary = await loop(
                _config(base_url),
                LoopSpec(batch_groups=GROUPS, steps=CALIBRATION_STEPS, train_s=("fixed", 0.0, 0.0)),
            )
        times.append(statistics.median(step.wait_s for step in summary.steps[1:]))
    (low, high), (t_low, t_high) = CALIBRATION_SCALES, times
    per_scale = max(1e-6, (t_high - t_low) / (high - low))
    return per_scale, max(0.0, t_low - per_scale * low)


@asynccontextmanager
async def _simulator(time_scale: float) -> AsyncIterator[str]:
    spec = ServerSpec.sim(["--time-scale", f"{time_scale:.6g}"], startup_timeout_s=30.0)
    async with spec.process():
        yield spec.base_url or ""


def _config(base_url: str) -> CollectConfig:
    return CollectConfig(
        target=TargetConfig(base_url=base_url),
        synthetic=SyntheticWorkload(num_tasks=64, output_tokens_mean=TOKENS, output_tokens_std=0),
        num_repeats=SAMPLES,
        verifier="synthetic",
        progress=False,
    )


def step_period(summary: LoopSummary, skip: int = 2) -> float:
    """The median time from one step's training start to the next's, after `skip` steps
    (while the asynchronous queue fills)."""
    starts = [step.train_start for step in summary.steps]
    return statistics.median(b - a for a, b in itertools.pairwise(starts[skip:]))
