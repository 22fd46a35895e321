"""Real NeMo Gym (nemo-gym 0.7.0) for the integration tests marked `nemo_gym`.

`nemo_gym_install` runs scripts/setup_nemo_gym.sh once per session: nemo-gym in its own
venv, cached under $AUTOTUNE_CACHE (default ~/.cache/autotune) so a second run takes a
second. `nemo_gym_stack` starts one real stack with `ng_run` for these tests (scoped to
this package: stopped after its last test, so Ray and its servers do not load the machine
under the rest of the suite):
NeMo Gym's `simple_agent` in front of two resources servers (the single-tool-call example
and mcqa, a verifier-only environment), and its `vllm_model` model server pointed at
autotune's simulated server, which the fixture starts (and can swap for another on the
same port, `stack.sim(...)`). The server venvs ng_run builds with uv are cached too.

The stack runs in a session of its own: it is stopped with SIGINT to ng_run (which stops
its servers and Ray), then TERM and KILL to whatever is left in that session; a process
that outlives KILL fails the run. Without the cached install and without a route to
PyPI the tests are skipped (never under CI=true, where they must run);
`AUTOTUNE_NEMO_GYM=0` skips them on a developer's machine.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from autotune.processes.lifeline import die_with_parent
from autotune.servers.launcher import ServerProcess, ServerSpec
from tests.conftest import NEMO_GYM_DATA
from tests.helpers import free_port, stack_setup

START_TIMEOUT_S = 600  # the first start builds every server's venv (about 1.5 min here)
STOP_GRACE_S = 30.0
VERSION = "0.7.0"
CONFIGS = (
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "resources_servers/mcqa/configs/mcqa.yaml",
    "responses_api_models/vllm_model/configs/vllm_model.yaml",
)
TOOL_AGENT = "example_single_tool_call_simple_agent"
MCQA_AGENT = "mcqa_simple_agent"
# The policy model: real-time-ish, short natural answers, a tool call in half the turns
# that offer tools (so the single-tool-call environment runs its tool and earns rewards).
SIM_FLAGS = ("--time-scale", "0.5", "--natural-output-tokens", "48", "--tool-call-share", "0.5")
# For probes: four times slower than real time, every output as long as its task's limit.
WIDE = ("--time-scale", "4", "--natural-output-tokens", "100000")


@dataclass(frozen=True, slots=True)
class NemoGymInstall:
    """What scripts/setup_nemo_gym.sh printed: where nemo-gym's commands and caches are."""

    path: str  # goes before PATH
    cache: Path
    uv_config: str

    @property
    def python(self) -> str:
        """The Python of nemo-gym's venv (its models validate rows there)."""
        return str(Path(self.path.split(os.pathsep)[0]) / "python")

    def env(self) -> dict[str, str]:
        """The environment every NeMo Gym command runs in: its commands and Python first
        on PATH, uv's Python check relaxed, Ray on 127.0.0.1 and writing no token."""
        return {
            **os.environ,
            "PATH": f"{self.path}{os.pathsep}{os.environ.get('PATH', '')}",
            "UV_CONFIG_FILE": self.uv_config,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_AUTH_MODE": "disabled",
        }


def _pypi_reachable() -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def nemo_gym_install() -> NemoGymInstall:
    in_ci = os.environ.get("CI") == "true"
    cache = Path(os.environ.get("AUTOTUNE_CACHE") or Path.home() / ".cache" / "autotune")
    cached = (cache / f"nemo-gym-{VERSION}" / "venv" / ".ready").exists()
    if not cached and not in_ci and not _pypi_reachable():
        pytest.skip("nemo-gym is not installed and PyPI cannot be reached to install it")
    printed = stack_setup("setup_nemo_gym.sh", "AUTOTUNE_NEMO_GYM", "real NeMo Gym")
    return NemoGymInstall(
        printed["NEMO_GYM_PATH"], Path(printed["NEMO_GYM_CACHE"]), printed["UV_CONFIG_FILE"]
    )


@pytest.fixture(scope="session")
def nemo_gym_data(
    nemo_gym_install: NemoGymInstall, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The example tasks of both environments, as `<environment>.example.jsonl`: from the
    shared data beside the checkout where it is, else from the installed nemo-gym package,
    which ships the same files (so a clean clone in CI runs these tests, never skips them)."""
    if NEMO_GYM_DATA.is_dir():
        return NEMO_GYM_DATA
    folder = tmp_path_factory.mktemp("nemo-gym-data")
    for packaged in nemo_gym_install.cache.glob(
        "venv/lib/python*/site-packages/resources_servers/*/data/example.jsonl"
    ):
        environment = packaged.parent.parent.name
        (folder / f"{environment}.example.jsonl").write_bytes(packaged.read_bytes())
    return folder


@pytest.fixture(scope="session")
def probe_tasks(tmp_path_factory: pytest.TempPathFactory, nemo_gym_data: Path) -> Path:
    """mcqa's five example tasks, repeated to 200, each with its own output limit (32 to
    95 tokens, which the WIDE simulator generates in full): rollouts of one length would
    finish in waves, and the waves would blur every interval."""
    rows = [
        orjson.loads(line)
        for line in (nemo_gym_data / "mcqa.example.jsonl").read_bytes().splitlines()
    ]
    path = tmp_path_factory.mktemp("tasks") / "mcqa.jsonl"
    with path.open("wb") as handle:
        for index in range(200):
            row = rows[index % len(rows)]
            params = {**row["responses_create_params"], "max_output_tokens": 32 + 37 * index % 64}
            handle.write(orjson.dumps({**row, "responses_create_params": params}) + b"\n")
    return path


@dataclass(slots=True)
class NemoGymStack:
    """A running `ng_run` stack and the simulated server it calls as its policy model."""

    install: NemoGymInstall
    workdir: Path
    head_port: int
    sim_port: int
    servers: dict[str, str] = field(default_factory=dict)  # ng_run's process name -> URL
    policy: ServerProcess | None = None

    @property
    def sim_base_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}/v1"

    @property
    def metrics_url(self) -> str:
        """The policy model's vLLM-style /metrics (the simulator's)."""
        return f"http://127.0.0.1:{self.sim_port}/metrics"

    def url(self, process_name: str) -> str:
        return self.servers[process_name]

    def start_policy(self, *flags: str) -> None:
        """(Re)start the simulated policy model on its port with SIM_FLAGS and `flags`."""
        self.stop_policy()
        spec = ServerSpec.sim([*SIM_FLAGS, *flags], port=self.sim_port)
        self.policy = spec.process().__enter__()

    def stop_policy(self) -> None:
        if self.policy is not None:
            self.policy.stop_sync()
            self.policy = None

    @contextmanager
    def sim(self, *flags: str) -> Iterator[None]:
        """The policy model restarted with extra `flags` for the block, then as it was."""
        self.start_policy(*flags)
        try:
            yield
        finally:
            self.start_policy()

    def collect_command(self, agent: str, tasks: Path) -> str:
        """`ng_collect_rollouts` of `tasks` through `agent`, as a `--command` template."""
        path = self.install.env()["PATH"]
        return (
            f"env PATH={path} RAY_AUTH_MODE=disabled ng_collect_rollouts +agent_name={agent} "
            f"+input_jsonl_fpath={tasks} +output_jsonl_fpath={{output}} +limit={{limit}} "
            f"+num_samples_in_parallel={{parallelism}} +head_server.port={self.head_port}"
        )

    def collect(self, agent: str, tasks: Path, output: Path, parallelism: int) -> list[Any]:
        """Rows `ng_collect_rollouts` writes for `tasks` (sorted by task and rollout)."""
        argv = [
            "ng_collect_rollouts", f"+agent_name={agent}", f"+input_jsonl_fpath={tasks}",
            f"+output_jsonl_fpath={output}", f"+num_samples_in_parallel={parallelism}",
            f"+head_server.port={self.head_port}",
        ]  # fmt: skip
        done = subprocess.run(  # from output's folder: Hydra writes its outputs/ there
            argv,
            capture_output=True,
            text=True,
            env=self.install.env(),
            timeout=300,
            cwd=output.parent,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return read_rows(output)


def read_rows(path: Path) -> list[Any]:
    """A rollout JSONL's rows, in (task, rollout) order."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return sorted(rows, key=lambda row: (row["_ng_task_index"], row["_ng_rollout_index"]))


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return orjson.loads(response.read())


def _wait_ready(process: subprocess.Popen[bytes], head: str, log: Path) -> None:
    """Until the head server's /readyz answers 200 (every server up), or fail."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"ng_run exited with status {process.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{head}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    pytest.fail(f"NeMo Gym was not ready within {START_TIMEOUT_S} s (log: {log})")


def _session_members(sid: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid:
                members.append(process)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def stop_session(leader: subprocess.Popen[bytes]) -> None:
    """ng_run and everything it started: SIGINT to ng_run (its own shutdown), then TERM and
    KILL to each process left in its session; fails if any survives."""
    sid = leader.pid  # start_new_session: the leader's pid is the session id
    if leader.poll() is None:
        leader.send_signal(signal.SIGINT)
        with suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=STOP_GRACE_S)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        members = _session_members(sid)
        for member in members:
            try:
                member.send_signal(sig)
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(members, timeout=10)
    if leader.poll() is None:
        leader.wait(timeout=10)
    left = _session_members(sid)
    assert not left, f"NeMo Gym left processes behind: {[p.pid for p in left]}"


@pytest.fixture(scope="package")
def nemo_gym_stack(
    nemo_gym_install: NemoGymInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NemoGymStack]:
    workdir = tmp_path_factory.mktemp("nemo-gym")
    stack = NemoGymStack(nemo_gym_install, workdir, head_port=free_port(), sim_port=free_port())
    stack.start_policy()
    (workdir / "env.yaml").write_text(
        f"policy_base_url: {stack.sim_base_url}\npolicy_api_key: none\n"
        "policy_model_name: sim/llama-3.1-8b\n"
    )
    cache = nemo_gym_install.cache
    argv = [
        "ng_run", f"+config_paths=[{','.join(CONFIGS)}]", f"+head_server.port={stack.head_port}",
        f"+uv_venv_dir={cache / 'venvs'}", f"+cache_dir={cache / 'ng-cache'}",
        "+skip_venv_if_present=true",
    ]  # fmt: skip
    log = workdir / "ng_run.log"
    started = time.monotonic()
    with log.open("wb") as sink:
        leader = subprocess.Popen(
            argv,
            cwd=workdir,
            env=nemo_gym_install.env(),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, signal.SIGINT),
        )
    try:
        head = f"http://127.0.0.1:{stack.head_port}"
        _wait_ready(leader, head, log)
        print(f"NeMo Gym stack ready in {time.monotonic() - started:.0f} s")
        instances = _get_json(f"{head}/server_instances")
        stack.servers = {server["process_name"]: server["url"] for server in instances}
        yield stack
    finally:
        stop_session(leader)
        stack.stop_policy()
