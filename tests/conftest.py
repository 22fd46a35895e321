"""Shared fixtures: the real NeMo Gym example data, an aiohttp client session, small
aiohttp apps on free ports, and the simulated server as a subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from autotune.servers.launcher import ServerProcess, ServerSpec
from tests.helpers import SIM_FAST, ServeApp, SimProcess

REPO = Path(__file__).resolve().parents[1]
NEMO_GYM_DATA = REPO.parent / "shared" / "data" / "nemo-gym"


@pytest.fixture
def nemo_gym_data() -> Path:
    if not NEMO_GYM_DATA.is_dir():
        pytest.skip("the shared NeMo Gym example data is not beside this checkout")
    return NEMO_GYM_DATA


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session, closed after the test."""
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
async def serve_app() -> AsyncIterator[ServeApp]:
    """`await serve_app(app)` runs an aiohttp app on a free port and returns its root URL
    (`http://127.0.0.1:PORT`); every app is stopped after the test."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def sim_process() -> SimProcess:
    """`sim_process(*flags)`: the simulated server as an unstarted subprocess on a free
    port, fast (SIM_FAST) and with vLLM-style `flags`; `async with` it to run it, then
    `.base_url`. The one place tests spell how a server process is made."""

    def make(*flags: str) -> ServerProcess:
        return ServerSpec.sim([*SIM_FAST, *flags]).process()

    return make


# The real stacks' packages: each runs on one worker at a time (one vLLM or NeMo Gym stack
# loading the machine, its package-scoped fixtures started once) and goes first, being the
# longest group.
STACKS = ("vllm", "nemo_gym")


def _group(item: pytest.Item) -> str:
    """The xdist group of a test: its real stack's package, else its own file (a module's
    fixtures then start once, not once a worker)."""
    path = item.path.relative_to(Path(__file__).parent)
    return path.parts[0] if path.parts[0] in STACKS else str(path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for `pytest -n 2 --dist loadgroup` (make test): the stacks first, so that the
    longest groups do not start last and leave one worker idle at the end."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    items.sort(key=lambda item: _group(item) not in STACKS)
