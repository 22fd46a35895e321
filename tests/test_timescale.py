"""Simulated time: the simulator says its time scale, and a probe of it is converted."""

from __future__ import annotations

import aiohttp
import pytest

from autotune.probe.timescale import in_simulated_time
from autotune.results.probes import ProbeResult
from autotune.results.stages import StageLatency, no_latencies
from autotune.rollout.target import resolve_target
from autotune.servers.sim.server import serve_in_process


@pytest.mark.parametrize("scale", ["0.05", "1.0"])
async def test_the_simulator_says_its_time_scale(
    session: aiohttp.ClientSession, scale: str
) -> None:
    async with serve_in_process(["--port", "0", "--time-scale", scale]) as url:
        target = await resolve_target(session, url, None, None)
    assert target.simulated and target.time_scale == float(scale)


def _wall_clock_probe() -> ProbeResult:
    """What a probe of a simulator 20× faster than real time measures by the wall clock."""
    latency = no_latencies()
    latency["model"] = StageLatency(50, 0.09, 0.087, 0.12)
    return ProbeResult(
        parallelism=20,
        rollouts_per_s=219.0,
        rollouts_per_s_ci=(210.0, 228.0),
        output_tokens_per_s=56_000.0,
        error_rate=0.0,
        completed=500,
        failed=0,
        measured_s=2.0,
        warmup_s=0.5,
        stop_reason="precision",
        latency_s=latency,
        verifier_capacity_rps=4000.0,
        token_check={
            "client_tokens_per_s": 56_000.0,
            "server_tokens_per_s": 55_000.0,
            "relative_difference": 0.018,
            "mismatch": 0.0,
        },
        series=[{"t": 1000.5, "source": "server", "vllm:num_requests_running": 20.0}],
        timeline=[(0.25, 200.0), (1.0, 220.0)],
        phases=[("warm-up", 0.0, 0.5), ("measured", 0.5, 2.5)],
    )


def test_wall_clock_figures_become_simulated_time() -> None:
    """The issue's figures: 219 rollouts/s and 56,000 tok/s, model p50 87 ms, at time
    scale 0.05, are 10.95 rollouts/s, 2,800 tok/s and 1.74 s of simulated time."""
    simulated = in_simulated_time(_wall_clock_probe(), 0.05, origin=1000.0)
    assert simulated.rollouts_per_s == pytest.approx(10.95)
    assert simulated.rollouts_per_s_ci == pytest.approx((10.5, 11.4))
    assert simulated.output_tokens_per_s == pytest.approx(2800)
    assert simulated.latency_s["model"].p50 == pytest.approx(1.74)
    assert simulated.latency_s["model"].count == 50
    assert simulated.measured_s == pytest.approx(40) and simulated.warmup_s == pytest.approx(10)
    assert simulated.verifier_capacity_rps == pytest.approx(200)
    assert simulated.token_check is not None
    assert simulated.token_check["server_tokens_per_s"] == pytest.approx(2750)
    assert simulated.token_check["relative_difference"] == 0.018  # a ratio: unchanged
    assert simulated.series[0]["t"] == pytest.approx(1010.0)
    assert [pytest.approx(point) for point in simulated.timeline] == [(5, 10), (20, 11)]
    assert simulated.phases == [("warm-up", 0.0, 10.0), ("measured", 10.0, 50.0)]
    assert simulated.completed == 500 and simulated.parallelism == 20


@pytest.mark.parametrize("scale", [0.0, 1.0])
def test_real_time_or_unpaced_runs_are_left_as_measured(scale: float) -> None:
    probe = _wall_clock_probe()
    assert in_simulated_time(probe, scale, origin=1000.0) is probe
