"""The sweep Launcher contract (sweep/curve.py's `Launcher`), over every implementation.

`running(knobs)` starts one server configuration and yields a Probe of it; a
configuration the server refuses raises ServerStartupError with the server's own reason
(the sweep records it on an infeasible trial); leaving the block, however it is left,
leaves no process behind. A new Launcher joins `LAUNCHERS` and the `launcher` fixture.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from autotune.config.study import Study
from autotune.errors import ServerStartupError
from autotune.probe import Launcher, ProbeSettings
from autotune.probe.launchers import CommandLauncher, http_launcher
from autotune.probe.virtual import VirtualSimLauncher
from autotune.results.probes import ProbeResult
from autotune.verifiers import load_verifier
from tests.helpers import COLLECTOR_TEMPLATE, SIM_FAST

LAUNCHERS = ["http-sim", "command", "virtual-sim"]
ACCEPTED: dict[str, Any] = {"max_num_seqs": 32, "gpu_memory_utilization": 0.9}
# An 8B model's 15 GiB of weights do not fit in 10% of an 80 GB GPU: vLLM (and the
# simulator) refuse to start.
REFUSED: dict[str, Any] = {"max_num_seqs": 32, "gpu_memory_utilization": 0.1}
REFUSAL = "No available memory for the cache blocks"
COMMAND = f"{COLLECTOR_TEMPLATE} --latency 0.02"
PROBE = {"min_s": 0.5, "max_s": 2.0}


@pytest.fixture(params=LAUNCHERS)
async def launcher(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Launcher]:
    kind = request.param
    if kind == "http-sim":
        # What `autotune sweep` builds for `target: {kind: sim}`: a server per configuration.
        study = Study.model_validate(
            {
                "name": "contract",
                "target": {"kind": "sim", "args": list(SIM_FAST), "startup_timeout_s": 30},
                "workload": {"verifier": "none", "synthetic": {"output_tokens": [32, 4]}},
                "probe": PROBE,
            }
        )
        verifier = await load_verifier("none")
        try:
            yield http_launcher(study, verifier)
        finally:
            await verifier.aclose()
    elif kind == "command":
        yield CommandLauncher(COMMAND, limit=60, workdir=tmp_path)
    elif kind == "virtual-sim":
        yield VirtualSimLauncher([], ProbeSettings(parallelism=1, warmup_s=0.2, **PROBE))
    else:
        raise AssertionError(f"no fixture for the launcher {kind!r}")


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


async def test_running_yields_a_probe_of_the_configuration(launcher: Launcher) -> None:
    before = _children()
    async with launcher.running(ACCEPTED) as probe:
        result = await probe.measure(2)
        assert isinstance(result, ProbeResult)
        assert result.parallelism == 2 and result.rollouts_per_s > 0
    assert _children() <= before, "a process outlived its configuration"


async def test_a_refused_configuration_raises_with_the_servers_reason(
    launcher: Launcher,
) -> None:
    if isinstance(launcher, CommandLauncher):
        pytest.skip("a collector command starts no server, so no configuration is refused")
    before = _children()
    with pytest.raises(ServerStartupError) as caught:
        async with launcher.running(REFUSED):
            pytest.fail("a refused configuration yielded a probe")
    assert caught.value.reason.strip(), "the reason is what the infeasible trial records"
    assert REFUSAL in caught.value.reason
    assert _children() <= before, "a refused server was left running"


async def test_an_error_inside_the_block_still_stops_the_configuration(
    launcher: Launcher,
) -> None:
    """A trial that fails (or a sweep cancelled) mid-curve leaves nothing running."""
    before = _children()
    with pytest.raises(RuntimeError, match="mid-curve"):
        async with launcher.running(ACCEPTED):
            raise RuntimeError("mid-curve")
    assert _children() <= before, "a process outlived its configuration"


async def test_each_configuration_starts_afresh(launcher: Launcher) -> None:
    """Two configurations one after the other, as a sweep's trials run."""
    for knobs in (ACCEPTED, {**ACCEPTED, "max_num_seqs": 8}):
        async with launcher.running(knobs) as probe:
            assert (await probe.measure(4)).completed > 0
