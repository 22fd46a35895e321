"""benchmarks/gpu_check.py's GPU figures: each probe's over its own measured blocks, the
figures diagnose.json holds and a verdict cites, beside nvidia-smi's of the same seconds,
with their sample counts (pure: no GPU, no server)."""

from __future__ import annotations

from typing import Any

import benchmarks.gpu_check as gpu_check
from autotune.probe.realtime import _summarise_windows
from autotune.telemetry import Sample

# Seconds of two alternating probes as diagnose runs them: each block has a warm-up
# before it and a drain after it; the other probe's block comes in between.
LOW_BLOCKS = [(5.0, 15.0), (45.0, 55.0)]
HIGH_BLOCKS = [(25.0, 35.0), (65.0, 75.0)]
BUSY = {4: 40.0, 16: 80.0}  # the GPU's utilisation while each probe is measured


def utilisation(t: float) -> float:
    """What the GPU does at second t: each probe's level inside its measured blocks,
    idle in the warm-ups and drains."""
    for blocks, level in ((LOW_BLOCKS, BUSY[4]), (HIGH_BLOCKS, BUSY[16])):
        if any(start <= t <= end for start, end in blocks):
            return level
    return 0.0


def probe(parallelism: int, blocks: list[tuple[float, float]]) -> dict[str, Any]:
    """A probe as diagnose.json holds it: NVML read every 0.5 s from each block's warm-up
    (5 s) to its drain (3 s), its telemetry summarised over the measured blocks."""
    times = [start - 5 + i / 2 for start, end in blocks for i in range(2 * int(end - start + 8))]
    samples = [
        Sample(t, "gpu", {"gpu0_util_samples": 2.0, "gpu_util_pct_mean": utilisation(t)})
        for t in times
    ]
    return {
        "parallelism": parallelism,
        "rollouts_per_s": 1.0,
        "output_tokens_per_s": 64.0,
        "measured_s": sum(end - start for start, end in blocks),
        "warmup_s": 10.0,
        "blocks": [{"at": start, "measured_s": end - start} for start, end in blocks],
        "series": [{"t": s.t, "source": s.source, **s.values} for s in samples],
        "telemetry": _summarise_windows(samples, blocks),
        "telemetry_unavailable": {},
    }


def smi() -> list[gpu_check.Reading]:
    """nvidia-smi every 0.25 s through both probes, reading what the GPU does."""
    return [(t / 4, 0, utilisation(t / 4), 50.0, 300.0) for t in range(0, 4 * 80)]


def test_each_probes_gpu_figures_cover_its_measured_blocks_alone() -> None:
    readings = smi()
    for parallelism, blocks in ((4, LOW_BLOCKS), (16, HIGH_BLOCKS)):
        result = probe(parallelism, blocks)
        summary = gpu_check.probe_summary(result, readings, origin=5.0)
        # NVML's figure is diagnose.json's own, the one a verdict cites
        assert summary["util_pct"] == result["telemetry"]["gpu/gpu_util_pct_mean"]
        assert summary["util_pct"]["mean"] == BUSY[parallelism]
        assert summary["util_pct"]["samples"] == 2 * 21  # 21 readings in each 10-s block
        assert summary["driver_samples"] == 2 * 42
        # nvidia-smi over the same seconds: neither the warm-ups, the drains nor the other
        # probe's blocks
        assert summary["nvidia_smi"]["util_pct"] == BUSY[parallelism]
        assert summary["nvidia_smi"]["samples"] == 2 * 41
        assert summary["compared"]["difference"] == 0.0 and summary["compared"]["agree"]
        assert [(b["from_s"], b["to_s"]) for b in summary["blocks"]] == [
            (start - 5.0, end - 5.0) for start, end in blocks
        ]
        for b in summary["blocks"]:
            assert b["nvml"]["util_pct"] == b["nvidia_smi"]["util_pct"] == BUSY[parallelism]
            assert (b["nvml"]["readings"], b["nvidia_smi"]["samples"]) == (21, 41)


def test_a_difference_over_five_points_says_why() -> None:
    steady = {"util_pct": 60.0, "util_readings": [60.0] * 40}
    assert gpu_check.agreement(63.0, [63.0] * 20, steady)["reason"] is None
    # a load that switches on and off between readings: 8 points apart, within noise
    swinging = {"util_pct": 50.0, "util_readings": [0.0, 100.0] * 10}
    noisy = gpu_check.agreement(58.0, [0.0, 100.0, 100.0, 32.0] * 3, swinging)
    assert noisy["agree"] and noisy["reason"].startswith("within sampling error (±")
    # steady readings 8 points apart: sampling does not explain it
    apart = gpu_check.agreement(
        68.0, [68.0, 69.0, 67.0] * 10, steady | {"util_readings": [59.0, 61.0] * 20}
    )
    assert not apart["agree"] and apart["reason"].startswith("more than sampling error")
