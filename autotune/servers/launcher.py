"""Start, health-check and stop a model server process (the simulator now, vLLM later).

The server runs in its own session (process group), so stopping it reaches every worker it
forked; its stdout and stderr go to one log file, whose last error line becomes the
`reason` of a ServerStartupError (a sweep records it on the infeasible trial). Without a
`log_path` the log is a temporary file, removed after a clean stop and kept whenever
something went wrong (the error message names it).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import aiohttp

from autotune.errors import ServerStartupError

HEALTH_POLL_S = 0.2
STOP_GRACE_S = 10.0

# `ValueError: message` (not a traceback's `raise ValueError(` line), or CUDA's OOM.
_ERROR_LINE = re.compile(r"\b(?:[A-Za-z_][\w.]*(?:Error|Exception): |CUDA out of memory\b).*")
# Wrapper errors that only point at the real one above them (vLLM's engine start-up).
_POINTER_LINE = re.compile(r"root cause above|stack trace above", re.IGNORECASE)


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it if its parent dies.

    A server runs in its own session (so a stop reaches its whole group), which also
    shields it from the terminal's Ctrl-C; this makes sure that even a `kill -9` of
    autotune leaves no server behind.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sim_command(args: Sequence[str], port: int) -> list[str]:
    """The command line that runs the simulated server with vLLM-style `args` on `port`."""
    return [sys.executable, "-m", "autotune.servers.sim", *args, "--port", str(port)]


def last_error_line(text: str) -> str:
    """The server's own last error line (`ValueError: ...`), else its last non-empty line.

    Lines that only say "see the root cause above" are passed over for the cause.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        match = _ERROR_LINE.search(line)
        if match and not _POINTER_LINE.search(line):
            return match.group(0)
    return lines[-1] if lines else ""


class ServerProcess:
    """One server process: `async with ServerProcess(cmd, health_url) as proc:` runs it.

    Leaving the block (normally, on an error or on cancellation) stops the whole process
    group. `stop_sync()` is safe from atexit and signal handlers; start() registers it with
    atexit so an interpreter exit never leaves a server behind.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        health_url: str,
        *,
        env: Mapping[str, str | None] | None = None,
        base_url: str | None = None,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 120.0,
        cwd: str | Path | None = None,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.cmd = list(cmd)
        self.health_url = health_url
        self.base_url = base_url
        self.env = dict(env or {})  # a None value unsets an inherited variable
        self.startup_timeout_s = startup_timeout_s
        self.cwd = cwd
        self.stop_grace_s = stop_grace_s
        self.log_path = Path(log_path) if log_path else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._owns_log = False  # a temporary log we created: removed after a clean stop
        self._keep_log = False  # set when an error message points at the log

    @classmethod
    def sim(
        cls,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        startup_timeout_s: float = 30.0,
        log_path: str | Path | None = None,
    ) -> ServerProcess:
        """The simulated server as a subprocess on `port` (default: a free one)."""
        port = port or free_port()
        return cls(
            sim_command(args, port),
            f"http://127.0.0.1:{port}/health",
            base_url=f"http://127.0.0.1:{port}/v1",
            log_path=log_path,
            startup_timeout_s=startup_timeout_s,
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, n: int = 20) -> str:
        """The last `n` lines of the server's log ('' before start)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    # -- start -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the server and return once its health URL answers 200.

        Raises ServerStartupError (process stopped first) if it exits or never gets healthy.
        """
        if self._proc is not None:
            raise RuntimeError("ServerProcess.start() called twice")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="autotune-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._owns_log = True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self._environment(),
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as e:
            self._close_log()
            raise ServerStartupError(
                f"Could not run the server command {self.cmd[0]!r} ({e.strerror}); "
                "check that it is installed and on PATH.",
                reason=str(e),
            ) from None
        atexit.register(self.stop_sync)
        try:
            await self._wait_healthy()
        except BaseException as e:
            self._keep_log = isinstance(e, ServerStartupError)
            self.stop_sync()
            raise

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        return {name: value for name, value in env.items() if value is not None}

    async def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                code = self._proc.poll()
                if code is not None:
                    reason = last_error_line(self.log_tail(200))
                    raise ServerStartupError(
                        f"The server exited with status {code} while starting "
                        f"({reason or 'no output'}); fix its flags or environment "
                        f"(log: {self.log_path}).",
                        reason=reason or f"exit status {code}",
                    )
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.get(self.health_url) as resp:
                        if resp.status == 200 and self._proc.poll() is None:
                            return  # (a 200 from a dead server's port belongs to someone else)
                if time.monotonic() >= deadline:
                    reason = last_error_line(self.log_tail(200))
                    raise ServerStartupError(
                        f"The server did not answer {self.health_url} within "
                        f"{self.startup_timeout_s:g} s; raise the start-up timeout or read "
                        f"its log ({self.log_path}).",
                        reason=reason or "start-up timed out",
                    )
                await asyncio.sleep(HEALTH_POLL_S)

    # -- stop --------------------------------------------------------------------------------

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _finish_stop(self) -> None:
        """After the leader exited: kill stragglers left in its group, release resources."""
        self._signal_group(signal.SIGKILL)
        self._close_log()
        clean = self._proc is not None and self._proc.returncode in (0, -signal.SIGTERM)
        if self._owns_log and clean and not self._keep_log and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop_sync)

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def stop_sync(self) -> None:
        """SIGTERM the process group, wait up to `stop_grace_s`, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait()
        self._finish_stop()

    async def stop(self) -> None:
        """As stop_sync, without blocking the event loop (falls back to it if cancelled)."""
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                deadline = time.monotonic() + self.stop_grace_s
                while proc.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if proc.poll() is None:
                    # It ignored SIGTERM for the whole grace: no second grace, kill the group.
                    self._signal_group(signal.SIGKILL)
                    while proc.poll() is None:
                        await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.stop_sync()
            raise
        self.stop_sync()  # reaps it, kills stragglers in its group, releases the log

    async def __aenter__(self) -> ServerProcess:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
