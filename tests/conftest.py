"""Shared fixtures: the real NeMo Gym example data, an aiohttp client session, small
aiohttp apps on free ports, and the simulated server as a subprocess."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from xdist.scheduler import LoadScopeScheduling

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
STACKS = ("tests/vllm/", "tests/nemo_gym/")


def _scope(nodeid: str) -> str:
    """What one worker runs whole: a real stack's package, else one file (a module's
    fixtures then start once, not once a worker)."""
    path = nodeid.split("::", 1)[0]
    return next((stack for stack in STACKS if path.startswith(stack)), path)


class StackScheduling(LoadScopeScheduling):
    """`pytest -n 2` (make test) hands out whole files, and each stack's package whole."""

    def _split_scope(self, nodeid: str) -> str:
        return _scope(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> StackScheduling:
    return StackScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The stacks first (scopes are handed out in the order collected), so that the
    longest do not start last and leave one worker idle at the end."""
    items.sort(key=lambda item: _scope(item.nodeid) not in STACKS)


class MachineLock:
    """Under `pytest -n 2`, a test marked `measures` (it judges throughput measured in real
    time, as a diagnose's verdict does) runs with the machine to itself: the other worker
    waits for it, as a user runs `autotune diagnose` on a quiet machine. Every other test
    holds the lock shared, so those run side by side.

    Two flock(2) files: `machine`, held shared or exclusive, and a turnstile taken before
    it, which a waiting measuring test keeps, so that the other worker's next tests queue
    behind it instead of starving it. A measuring test keeps the machine for the module's
    following measuring tests, so that they run back to back.
    """

    def __init__(self, run_id: str) -> None:
        stem = Path(tempfile.gettempdir()) / f"autotune-tests-{run_id}"
        self._turnstile = stem.with_suffix(".turnstile").open("a")
        self._machine = stem.with_suffix(".machine").open("a")
        self.exclusive: bool | None = None  # held exclusive, held shared, or not held

    def hold(self, exclusive: bool) -> None:
        if self.exclusive == exclusive:
            return
        self.release()
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        fcntl.flock(self._machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self.exclusive = exclusive

    def release(self) -> None:
        fcntl.flock(self._machine, fcntl.LOCK_UN)
        self.exclusive = None


MACHINE_LOCK = pytest.StashKey[MachineLock]()


def _measures(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("measures") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    lock: MachineLock | None = item.config.stash.get(MACHINE_LOCK, None)
    if lock is None:
        yield
        return
    lock.hold(exclusive=_measures(item))
    yield
    if not (_measures(item) and _measures(nextitem)):
        lock.release()


def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", None)  # set on an xdist worker only
    if worker is not None:
        config.stash[MACHINE_LOCK] = MachineLock(worker["testrunuid"])
