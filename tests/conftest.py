"""Shared fixtures: the real NeMo Gym example data, an aiohttp client session, small
aiohttp apps on free ports, and the simulated server as a subprocess."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Literal

import aiohttp
import pytest
from aiohttp import web
from xdist.scheduler import LoadScopeScheduling

from autotune.servers.launcher import ServerProcess, ServerSpec
from tests.helpers import SIM_FAST, ServeApp, SimProcess

REPO = Path(__file__).resolve().parents[1]
NEMO_GYM_DATA = REPO.parent / "shared" / "data" / "nemo-gym"
# InferenceX's real serving runs (Data from InferenceX (SemiAnalysis), Apache-2.0).
INFERENCEX_TABLE = REPO.parent / "shared" / "data" / "perf" / "inferencex_runs.csv"
# Real RL runs' step telemetry, each file naming its source.
RL_RUNS = REPO.parent / "shared" / "data" / "rlruns"


@pytest.fixture
def nemo_gym_data() -> Path:
    if not NEMO_GYM_DATA.is_dir():
        pytest.skip("the shared NeMo Gym example data is not beside this checkout")
    return NEMO_GYM_DATA


@pytest.fixture
def rl_runs() -> Path:
    if not RL_RUNS.is_dir():
        pytest.skip("the shared RL runs' telemetry is not beside this checkout")
    return RL_RUNS


@pytest.fixture
def table() -> Path:
    """The shared table of measured serving runs (InferenceX's)."""
    if not INFERENCEX_TABLE.is_file():
        pytest.skip("the shared InferenceX table is not beside this checkout")
    return INFERENCEX_TABLE


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


# The real stacks' packages: each runs whole on one worker (one vLLM or NeMo Gym stack
# loading the machine at a time, its package-scoped fixtures started once).
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
    """Files go out with the most tests first (xdist's default order), which measured
    best: the measuring session starts tests/test_diagnose.py (16 tests, 549 s) on one
    worker and the rest fill the other, 603 s in all; in the files' own order `bench ab`
    went beside it and the session took 706 s. The other session took about as long either
    way (1,969 s in this order, 1,953 s in the files' own)."""
    return StackScheduling(config, log)


Kind = Literal["ordinary", "measures", "alone"]  # who a test may run beside (MachineLock)


class MachineLock:
    """Under `pytest -n 2`, who may run beside whom. A test marked `measures` judges
    throughput measured in real time (as a diagnose's verdict does): it runs beside
    another measuring test, never beside an ordinary one. A test marked `alone` (it
    measures the client's own CPU cost, or runs a real stack on both cores) runs with the
    machine to itself. Ordinary tests run side by side.

    Why measuring tests may pair: one uses about a quarter of a core (a diagnose on the
    simulator: 5.6 CPU-seconds in 21.5 s), so two leave the machine half idle; run two at a
    time, the 35 on the simulator took 1,292 test-seconds against 1,294 one at a time.
    Ordinary tests (command-line start-ups, report rendering, real stacks) take whole cores.

    Three flock(2) files: `ordinary` and `measuring`, each held shared by the tests of its
    kind and taken exclusive, for a moment, by a test of the other kind coming in (so it
    waits until that kind has left); a test run alone holds both exclusive. A turnstile,
    taken before them and kept while waiting, queues the other worker's next tests behind a
    waiting one instead of letting them starve it. A test keeps what it holds for the
    module's next test of the same kind, so that those run back to back.
    """

    def __init__(self, run_id: str) -> None:
        stem = Path(tempfile.gettempdir()) / f"autotune-tests-{run_id}"
        self._turnstile = stem.with_suffix(".turnstile").open("a")
        self._ordinary = stem.with_suffix(".ordinary").open("a")
        self._measuring = stem.with_suffix(".measuring").open("a")
        self.kind: Kind | None = None  # what it holds, if anything

    def hold(self, kind: Kind) -> None:
        if self.kind == kind:
            return
        self.release()
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        if kind == "alone":
            fcntl.flock(self._ordinary, fcntl.LOCK_EX)
            fcntl.flock(self._measuring, fcntl.LOCK_EX)
        else:
            own, other = (
                (self._ordinary, self._measuring)
                if kind == "ordinary"
                else (self._measuring, self._ordinary)
            )
            fcntl.flock(other, fcntl.LOCK_EX)  # waits until no test of the other kind runs
            fcntl.flock(own, fcntl.LOCK_SH)
            fcntl.flock(other, fcntl.LOCK_UN)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self.kind = kind

    def release(self) -> None:
        fcntl.flock(self._ordinary, fcntl.LOCK_UN)
        fcntl.flock(self._measuring, fcntl.LOCK_UN)
        self.kind = None


MACHINE_LOCK = pytest.StashKey[MachineLock]()


def _kind(item: pytest.Item) -> Kind:
    if item.get_closest_marker("alone") is not None:
        return "alone"
    return "measures" if item.get_closest_marker("measures") is not None else "ordinary"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    lock: MachineLock | None = item.config.stash.get(MACHINE_LOCK, None)
    if lock is None:
        yield
        return
    kind = _kind(item)
    lock.hold(kind)
    yield
    if kind == "ordinary" or nextitem is None or _kind(nextitem) != kind:
        lock.release()


def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", None)  # set on an xdist worker only
    if worker is not None:
        config.stash[MACHINE_LOCK] = MachineLock(worker["testrunuid"])
