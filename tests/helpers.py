"""Test helpers: run the CLI as a user would, start servers as subprocesses."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import orjson
import pytest
import yaml
from aiohttp import web

from autotune.config.collection import SyntheticWorkload, TargetConfig
from autotune.probe import ProbeSettings
from autotune.probe.realtime import EngineProbe
from autotune.rollout.backends.openai import OpenAIBackend
from autotune.rollout.target import open_session, resolve_target
from autotune.rollout.workload import Workload
from autotune.servers.launcher import ServerProcess, ServerSpec
from autotune.verifiers import load_verifier

REPO = Path(__file__).resolve().parents[1]
# A subprocess that has not done its part by now has hung. Only a hang limit, never a
# speed check: one CLI's start-up alone took 36 s on a loaded CI host.
HANG_S = 120.0
# The simulated server 100 times faster than real time: a probe measures in a second.
SIM_FAST = ("--time-scale", "0.01")
# A stand-in for a user's collector (tests/fixtures/fake_collector.py) as a command
# template; add `--latency S`, `--capacity N`, `--fail` after it.
COLLECTOR_TEMPLATE = (
    f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'fake_collector.py'} "
    "--parallelism {parallelism} --limit {limit} --output {output}"
)

ServeApp = Callable[[web.Application], Awaitable[str]]
"""The `serve_app` fixture: runs an aiohttp app on a free port, returns its root URL."""
SimProcess = Callable[..., ServerProcess]
"""The `sim_process` fixture: `sim_process(*flags)` is an unstarted simulated server."""


def as_in_a_terminal() -> None:
    """`preexec_fn` for a child that Ctrl-C must reach: SIGINT back to its default. A
    shell without job control (a CI script's `cmd &`) starts background jobs with SIGINT
    ignored, and the child would inherit that and never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def autotune(
    *args: str, timeout: float = HANG_S, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """`autotune ARGS` in a subprocess, as a user runs it (from the checkout's root)."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def study_name(study: Path) -> str:
    """The name a study file gives its study (its `name:`, else the file's stem)."""
    try:
        raw = yaml.safe_load(study.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raw = None
    name = raw.get("name") if isinstance(raw, dict) else None
    return str(name or study.stem)


def sweep(study: Path, root: Path) -> subprocess.CompletedProcess[str]:
    """`autotune sweep STUDY` keeping its storage under `root` and its reports in
    `root`/reports/NAME (NAME the study's)."""
    return autotune(
        "sweep", str(study), "--studies-dir", str(root / "studies"),
        "--output-dir", str(root / "reports" / study_name(study)), "--quiet", timeout=300,
    )  # fmt: skip


@contextmanager
def server_process(spec: ServerSpec) -> Iterator[str]:
    """A server (`ServerSpec.sim(...)`, `ServerSpec.null()`) running; yields its base URL."""
    with spec.process() as server:
        assert server.base_url is not None
        yield server.base_url


def read_rows(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def one_sentence_error(result: subprocess.CompletedProcess[str]) -> str:
    """The CLI failed with exactly one `autotune: error:` line and no traceback: that line."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("autotune: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


PLANTED_AT = "    def _row(self, item: WorkItem, generation: Generation) -> dict[str, Any]:\n"


def plant_slowdown(destination: Path, micros: float) -> Path:
    """A copy of this autotune whose engine burns `micros` µs of CPU per rollout (the
    regression a gate must catch); returns the folder to put on PYTHONPATH."""
    shutil.copytree(REPO / "autotune", destination / "autotune")
    engine = destination / "autotune" / "rollout" / "engine.py"
    text = engine.read_text()
    assert PLANTED_AT in text, "the engine changed: move the planted slowdown"
    burn = (
        "        _until = time.perf_counter() + %r  # planted\n"
        "        while time.perf_counter() < _until:\n"
        "            pass\n" % (micros / 1e6)
    )
    engine.write_text(text.replace(PLANTED_AT, PLANTED_AT + burn))
    return destination


@asynccontextmanager
async def engine_probe(
    base_url: str, settings: ProbeSettings, output_tokens_std: int = 0
) -> AsyncIterator[EngineProbe]:
    """autotune's engine, with short synthetic tasks (32 output tokens, every one alike
    unless `output_tokens_std`), against the server at `base_url`."""
    target = TargetConfig(base_url=base_url, extra_body={"ignore_eos": True})
    tasks = SyntheticWorkload(
        num_tasks=64, output_tokens_mean=32, output_tokens_std=output_tokens_std
    )
    workload = Workload(None, tasks)
    verifier = await load_verifier("none")
    try:
        async with open_session(target) as session:
            resolved = await resolve_target(session, base_url, None, None)
            backend = OpenAIBackend(session, target, resolved.model, None)
            yield EngineProbe(
                session, backend, verifier, workload.probe_tasks(), base_url, settings
            )
    finally:
        await verifier.aclose()


STACK_SETUP_TIMEOUT_S = 1200  # a real stack's cached set-up, cold: downloads and unpacking
_PRINTED = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")


def stack_setup(script: str, switch: str, what: str) -> dict[str, str]:
    """Runs scripts/`script` (a real stack's cached set-up) and returns the `KEY=value`
    lines it printed; skipped where `switch`=0 outside CI, a failure with its error else."""
    if os.environ.get(switch) == "0" and os.environ.get("CI") != "true":
        pytest.skip(f"{switch}=0: the {what} tests are switched off")
    setup = subprocess.run(
        ["bash", str(REPO / "scripts" / script)],
        capture_output=True,
        text=True,
        timeout=STACK_SETUP_TIMEOUT_S,
    )
    if setup.returncode != 0:
        pytest.fail(f"scripts/{script} failed:\n{setup.stderr[-3000:]}")
    return dict(m.groups() for line in setup.stdout.splitlines() if (m := _PRINTED.match(line)))
