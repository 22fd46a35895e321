"""No process of autotune's outlives it, however it is stopped: SIGTERM (exit 143), Ctrl-C
(SIGINT to the terminal's process group, exit 130) or kill -9, in the middle of
`collect`, `diagnose` and `sweep`; and `collect` resumes after each with every rollout
exactly once.

Each run starts in its own session, so its process group is what a terminal would
signal; the simulated server (in a session of its own) and the verifier pool's
forkserver, workers and resource tracker are found as autotune's descendants before
the signal, so the test knows they existed and can tell when they are gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from autotune.results.saved import load_result
from autotune.results.trials import SweepResult
from tests.helpers import REPO, as_in_a_terminal, read_rows

pytestmark = pytest.mark.slow

GONE_WITHIN_S = 10.0  # measured: well under a second (SIGTERM ~0.3 s, kill -9 ~0.1 s)
WORKLOAD = (
    "--output-tokens", "48", "--verifier", "synthetic", "--verifier-cost-ms", "5",
    "--sim-arg=--time-scale=0.02",
)  # fmt: skip
TASKS, REPEATS = 200, 2


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)


def _family(pid: int) -> dict[int, str]:
    """autotune's live descendants by role: sim, forkserver, worker, tracker or other."""
    roles: dict[int, str] = {}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            cmdline, parent = " ".join(child.cmdline()), child.ppid()
        except psutil.Error:
            continue
        if "autotune.servers.sim" in cmdline:
            roles[child.pid] = "sim"
        elif "multiprocessing.forkserver" in cmdline:  # its workers are forks of it
            roles[child.pid] = "forkserver" if parent == pid else "worker"
        elif "multiprocessing.resource_tracker" in cmdline:
            roles[child.pid] = "tracker"
        else:
            roles[child.pid] = "other"
    return roles


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group(pgid: int) -> list[int]:
    """The live members of a process group."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and _alive(process.pid):
                members.append(process.pid)
        except (OSError, psutil.Error):
            continue
    return members


def _rows(path: Path) -> int:
    """Complete rows in a rollout file being written."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


class Run:
    """`autotune ARGS` in a session of its own, its output in a log file."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.log = tmp_path / "autotune.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "autotune", *args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=as_in_a_terminal,
            )
        self.family: dict[int, str] = {}

    def busy(self) -> bool:
        """Its server and verifier workers are running (noted, to check they end)."""
        assert self.process.poll() is None, self.log.read_text()
        self.family = _family(self.process.pid)
        return {"sim", "forkserver", "worker", "tracker"} <= set(self.family.values())

    def stop(self, how: signal.Signals) -> int:
        """Signal it as a user would; wait until it and every process of its is gone."""
        assert self.family, "busy() saw its processes first"
        pid = self.process.pid
        started = time.monotonic()
        if how == signal.SIGINT:
            os.killpg(pid, how)  # Ctrl-C reaches the terminal's whole process group
        else:
            os.kill(pid, how)
        code = self.process.wait(timeout=60)
        _wait_for(
            lambda: not _group(pid) and not any(map(_alive, self.family)),
            GONE_WITHIN_S,
            f"every process of autotune to end after {how.name}: "
            f"{ {p: r for p, r in self.family.items() if _alive(p)} } {_group(pid)}",
        )
        assert time.monotonic() - started < GONE_WITHIN_S
        return code

    def output(self) -> str:
        return self.log.read_text()


STOPS = [
    (signal.SIGTERM, 143, "autotune: terminated;"),
    (signal.SIGINT, 130, "autotune: interrupted;"),
    (signal.SIGKILL, -signal.SIGKILL, ""),
]


def test_collect_stopped_every_way_resumes_with_every_rollout_once(tmp_path: Path) -> None:
    out = tmp_path / "rollouts.jsonl"
    args = (
        "collect", "--synthetic", str(TASKS), "--num-repeats", str(REPEATS), *WORKLOAD,
        "--parallelism", "8", "--output-dir", str(tmp_path), "--resume", "-q",
    )  # fmt: skip
    for how, code, says in STOPS:
        wanted = _rows(out) + 10
        run = Run(tmp_path, *args)
        _wait_for(run.busy, 60, "the simulated server and the verifier workers")
        _wait_for(lambda: _rows(out) >= wanted, 60, "new rollouts")  # noqa: B023
        assert run.stop(how) == code, run.output()
        assert says in run.output() and "Traceback" not in run.output()
        if how != signal.SIGKILL:  # stopped cleanly: no row cut short
            assert out.read_bytes().endswith(b"\n")
        assert _rows(out) < TASKS * REPEATS, "it finished before it was stopped"
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=REPO, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    keys = [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in read_rows(out)]
    assert len(keys) == TASKS * REPEATS
    assert set(keys) == {(t, r) for t in range(TASKS) for r in range(REPEATS)}


@pytest.mark.parametrize(("how", "code", "says"), STOPS)
def test_diagnose_stopped_leaves_no_process(
    tmp_path: Path, how: signal.Signals, code: int, says: str
) -> None:
    run = Run(
        tmp_path, "diagnose", "--synthetic", "500", *WORKLOAD,
        "--low", "2", "--high", "8", "--min-s", "2", "--max-s", "20",
    )  # fmt: skip
    _wait_for(run.busy, 60, "the simulated server and the verifier workers")
    assert run.stop(how) == code, run.output()
    assert says in run.output() and "Traceback" not in run.output()


@pytest.mark.parametrize(("how", "code", "says"), STOPS)
def test_sweep_stopped_leaves_no_process_and_resumes(
    tmp_path: Path, how: signal.Signals, code: int, says: str
) -> None:
    study = tmp_path / "stopped.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "stopped",
                "target": {"kind": "sim", "args": ["--time-scale", "0.02"]},
                "workload": {
                    "verifier_cost_ms": 5,
                    "synthetic": {"num_tasks": 200, "output_tokens": [48, 8]},
                },
                "search_space": {
                    "parallelism": {"low": 4, "high": 16},
                    "max_num_seqs": {"choices": [8, 32]},
                },
                "probe": {"min_s": 0.5, "max_s": 2},
                "budget": {"trials": 1},
            }
        )
    )
    args = (
        "sweep", str(study), "--studies-dir", str(tmp_path / "studies"),
        "--output-dir", str(tmp_path / "reports" / "stopped"), "--quiet",
    )  # fmt: skip
    run = Run(tmp_path, *args)
    _wait_for(run.busy, 60, "a trial's simulated server and the verifier workers")
    assert run.stop(how) == code, run.output()
    assert says in run.output() and "Traceback" not in run.output()
    resumed = subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=REPO, capture_output=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    saved = load_result(tmp_path / "reports" / "stopped" / "sweep.json")
    assert isinstance(saved, SweepResult) and len(saved.completed) == 1
