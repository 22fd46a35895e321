"""The Probe contract, over every implementation.

A probe measures one running configuration at any parallelism it is asked for, as many
times as a curve asks (sweep/curve.py doubles on one probe), and its result feeds a
CurvePoint and a saved file. A new Probe joins `PROBES` and the `probe` fixture, and
must pass the same tests.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from autotune.probe import Probe, ProbeSettings
from autotune.probe.command_probe import CommandProbe
from autotune.probe.virtual import VirtualSimLauncher
from autotune.results.codec import to_json
from autotune.results.probes import CurvePoint, ProbeResult
from tests.helpers import COLLECTOR_TEMPLATE, SimProcess, engine_probe

PROBES = ["engine", "command", "virtual"]
# Every way a probe may end; reports and the curve algorithm read these words.
STOP_REASONS = {
    *("precision", "time cap", "precision (in tokens)", "time cap (in tokens)"),
    *("rows timed", "whole run timed"),
}
# Short probes: warm-up, then at least half a second, at most two.
SETTINGS = ProbeSettings(parallelism=1, warmup_s=0.2, min_s=0.5, max_s=2.0)
COMMAND = f"{COLLECTOR_TEMPLATE} --latency 0.02"


@pytest.fixture(params=PROBES)
async def probe(
    request: pytest.FixtureRequest, sim_process: SimProcess, tmp_path: Path
) -> AsyncIterator[Probe]:
    kind = request.param
    if kind == "engine":
        server = sim_process()
        async with server, engine_probe(server.base_url or "", SETTINGS) as found:
            yield found
    elif kind == "command":
        yield CommandProbe(COMMAND, limit=60, workdir=tmp_path)
    elif kind == "virtual":
        async with VirtualSimLauncher([], SETTINGS).running({}) as virtual_probe:
            yield virtual_probe
    else:
        raise AssertionError(f"no fixture for the probe {kind!r}")


def _check(result: ProbeResult, parallelism: int) -> None:
    """What every probe's result promises, at the parallelism it was asked for."""
    assert isinstance(result, ProbeResult)
    assert result.parallelism == parallelism
    assert result.stop_reason in STOP_REASONS, result.stop_reason
    low, high = result.rollouts_per_s_ci
    assert result.rollouts_per_s > 0
    assert low <= result.rollouts_per_s <= high, (low, result.rollouts_per_s, high)
    assert result.completed > 0 and result.failed == 0 and result.error_rate == 0.0
    assert result.warmup_s >= 0 and result.measured_s > 0
    assert result.probe_s == pytest.approx(result.warmup_s + result.measured_s)
    # The rate is a rate over the measured window, not over the whole probe.
    assert result.rollouts_per_s == pytest.approx(result.completed / result.measured_s, rel=0.01)
    assert all(math.isfinite(v) for v in (result.rollouts_per_s, low, high, result.probe_s))
    point = CurvePoint.of(result)
    assert (point.parallelism, point.rollouts_per_s, point.error_rate) == (
        parallelism,
        result.rollouts_per_s,
        0.0,
    )
    assert point.probe_s == result.probe_s and point.stop_reason == result.stop_reason
    assert point.metric("rollouts_per_s") == result.rollouts_per_s
    assert point.metric("output_tokens_per_s") == result.output_tokens_per_s
    # Saved as diagnose.json saves it, it reads back the same.
    assert ProbeResult.from_dict(orjson.loads(to_json(result))) == result


async def test_a_probe_measures_each_parallelism_it_is_asked_for(probe: Probe) -> None:
    """Two parallelisms on one probe, as a curve asks them (a lower one after a higher
    one, as it halves): nothing of the first measurement leaks into the second."""
    for parallelism in (4, 2):
        _check(await probe.measure(parallelism), parallelism)
