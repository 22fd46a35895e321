"""What the benchmarks share: the null server in its own process, core pinning, stats.

The server runs in another process on another core so that the client process measured
owns one core outright: its own overhead then shows up undiluted as requests per second.
"""

from __future__ import annotations

import http.client
import os
import platform
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
READY_PREFIX = "autotune-null ready"  # what autotune.servers.null prints once listening


def core_plan() -> tuple[int | None, int | None]:
    """(client core, server core): two distinct allowed cores, or Nones where we can't pin."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    return allowed[0], allowed[1]


def pin_self(core: int | None) -> None:
    """Pin this process to one core (no-op where affinity is not supported)."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


def machine() -> dict[str, Any]:
    """Enough of the machine's identity to tell whether two results are comparable."""
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass
class NullServer:
    """`python -m autotune.servers.null` in its own session, optionally pinned to a core.

    Use as a context manager: entering waits for the ready line and `/health`; leaving
    sends SIGTERM to its process group (SIGKILL after 5 s).
    """

    core: int | None = None
    host: str = "127.0.0.1"
    startup_timeout_s: float = 20.0
    proc: subprocess.Popen[str] | None = None
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> NullServer:
        cmd = [sys.executable, "-m", "autotune.servers.null", "--host", self.host, "--port", "0"]
        if self.core is not None:
            cmd += ["--cpu", str(self.core)]  # the child pins itself before it serves
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            self.port = self._read_port()
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _read_port(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=0.2):
                    if self.proc.poll() is not None:
                        break
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.startswith(READY_PREFIX):
                    return int(line.strip().rsplit(":", 1)[1])
        raise RuntimeError(
            f"the null server did not start (exit code {self.proc.poll()}); "
            f"try `python -m autotune.servers.null --port 0` by hand"
        )

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=1.0)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the null server never answered GET /health with 200")
            time.sleep(0.05)

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    t = os.times()
    return t.user + t.system
