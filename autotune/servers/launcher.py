"""The one way autotune starts, health-checks and stops a server process: a `ServerSpec`
says what to run and where it answers, a `ServerProcess` runs it in its own process group,
a `ServerGroup` runs replicas side by side. Why: docs/design/servers.md.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import aiohttp

from autotune.errors import ServerStartupError
from autotune.processes.lifeline import die_with_parent

HEALTH_POLL_S = 0.2
STOP_GRACE_S = 10.0
GROUP_EXIT_WAIT_S = 5.0  # for SIGKILLed stragglers to exit (zombies do not count)
LOCALHOST = "127.0.0.1"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding autotune/

# `ValueError: message` (not a traceback's `raise ValueError(` line), or CUDA's OOM.
_ERROR_LINE = re.compile(r"\b(?:[A-Za-z_][\w.]*(?:Error|Exception): |CUDA out of memory\b).*")
# Wrapper errors that only point at the real one above them (vLLM's engine start-up).
_POINTER_LINE = re.compile(r"root cause above|stack trace above", re.IGNORECASE)


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it if its parent dies.

    A server runs in its own session (so a stop reaches its whole group), which also
    shields it from the terminal's Ctrl-C; this makes sure that even a `kill -9` of
    autotune leaves no server behind. SIGTERM, so that it still shuts down cleanly.
    """
    die_with_parent(signal.SIGTERM)


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Until no live (non-zombie) process is left in process group `pgid`, or the timeout."""
    if not sys.platform.startswith("linux"):
        return
    deadline = time.monotonic() + timeout_s
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _group_members(pgid: int) -> list[int]:
    """The live processes of a group, from /proc (a zombie holds no memory any more)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (another process may still take it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different TCP ports free on 127.0.0.1 right now (each held until all are
    found, so two replicas never get the same one)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((LOCALHOST, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def sim_command(args: Sequence[str], port: int, host: str = LOCALHOST) -> list[str]:
    """The command line that runs the simulated server with vLLM-style `args` on
    `host`:`port`."""
    command = [sys.executable, "-m", "autotune.servers.sim", *args]
    return [*command, "--host", host, "--port", str(port)]


def client_host(host: str) -> str:
    """How a client on this machine names a server listening on `host` in a URL: the
    loopback address for every-interface ones, an IPv6 address in brackets."""
    if host in ("", "0.0.0.0", "::"):
        return LOCALHOST
    return f"[{host}]" if ":" in host else host


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


def _module_env() -> dict[str, str | None]:
    """The environment for `python -m autotune....`: this autotune first on the path, so the
    server runs the same code as its parent even from a checkout (a benchmark script)."""
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), path]))}


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What to run and how to tell it is up: everything a ServerProcess needs."""

    command: Sequence[str]
    health_url: str  # answers 200 once the server serves
    base_url: str | None = None  # the OpenAI-compatible root (http://host:port/v1)
    env: Mapping[str, str | None] = field(default_factory=dict)  # None unsets a variable
    startup_timeout_s: float = 120.0
    log_path: Path | None = None  # None: a temporary file, kept only if something failed
    cwd: Path | None = None
    stop_grace_s: float = STOP_GRACE_S  # after SIGTERM, before SIGKILL

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", dict(self.env))
        if self.log_path is not None:
            object.__setattr__(self, "log_path", Path(self.log_path))

    @classmethod
    def local(
        cls,
        command: Sequence[str],
        port: int,
        *,
        host: str = LOCALHOST,
        env: Mapping[str, str | None] | None = None,
        startup_timeout_s: float = 120.0,
        log_path: str | Path | None = None,
    ) -> ServerSpec:
        """A command that serves `/health` and `/v1` on `host`:`port` (the command itself
        must say `host`; the default, 127.0.0.1, keeps it from the network)."""
        root = f"http://{client_host(host)}:{port}"
        return cls(
            command,
            f"{root}/health",
            f"{root}/v1",
            env=env or {},
            startup_timeout_s=startup_timeout_s,
            log_path=Path(log_path) if log_path else None,
        )

    @classmethod
    def launch(
        cls,
        template: Sequence[str],
        *,
        port: int | None = None,
        startup_timeout_s: float = 600.0,
        log_path: str | Path | None = None,
    ) -> ServerSpec:
        """A user's server command with `{port}` where the port goes (a free one)."""
        port = port or free_port()
        command = [part.replace("{port}", str(port)) for part in template]
        return cls.local(command, port, startup_timeout_s=startup_timeout_s, log_path=log_path)

    @classmethod
    def sim(
        cls,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        host: str = LOCALHOST,
        startup_timeout_s: float = 30.0,
        log_path: str | Path | None = None,
    ) -> ServerSpec:
        """The simulated server with vLLM-style `args` on `host`:`port` (default: a free
        port on 127.0.0.1)."""
        port = port or free_port()
        return cls.local(
            sim_command(args, port, host),
            port,
            host=host,
            env=_module_env(),
            startup_timeout_s=startup_timeout_s,
            log_path=log_path,
        )

    @classmethod
    def null(
        cls,
        *,
        core: int | None = None,
        port: int | None = None,
        startup_timeout_s: float = 60.0,
        log_path: str | Path | None = None,
        tool_turns: int = 1,
    ) -> ServerSpec:
        """The null server (answers at once), pinned to `core` when given; with
        `tool_turns` > 1 it calls a tool until a rollout's last turn (servers.null)."""
        port = port or free_port()
        command = [sys.executable, "-m", "autotune.servers.null", "--host", LOCALHOST]
        command += ["--port", str(port)]
        if tool_turns > 1:
            command += ["--tool-turns", str(tool_turns)]
        if core is not None:
            command += ["--cpu", str(core)]  # the child pins itself before it serves
        return cls.local(
            command,
            port,
            env=_module_env(),
            startup_timeout_s=startup_timeout_s,
            log_path=log_path,
        )

    def process(self) -> ServerProcess:
        """The (unstarted) process: `async with spec.process() as server:` runs it."""
        return ServerProcess(self)


class ServerProcess:
    """One server process: `async with ServerProcess(spec) as proc:` runs it.

    Leaving the block (normally, on an error or on cancellation) stops the whole process
    group. Where no event loop runs, `with` does the same synchronously. `stop_sync()` is
    safe from atexit and signal handlers; start() registers it with atexit so an
    interpreter exit never leaves a server behind.
    """

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.log_path = spec.log_path  # a temporary file from start() when None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._owns_log = False  # a temporary log we created: removed after a clean stop
        self._keep_log = False  # set when an error message points at the log

    @property
    def cmd(self) -> list[str]:
        return list(self.spec.command)

    @property
    def health_url(self) -> str:
        return self.spec.health_url

    @property
    def base_url(self) -> str | None:
        return self.spec.base_url

    @property
    def env(self) -> dict[str, str | None]:
        return dict(self.spec.env)

    @property
    def startup_timeout_s(self) -> float:
        return self.spec.startup_timeout_s

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
                cwd=self.spec.cwd,
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
        env = {**os.environ, **self.spec.env}
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
        """After the leader exited: kill stragglers left in its group and wait until they
        are gone (what they had mapped, such as vLLM's shared memory, is free only then),
        release resources."""
        self._signal_group(signal.SIGKILL)
        if self._proc is not None:
            _wait_group_gone(self._proc.pid, GROUP_EXIT_WAIT_S)
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
                proc.wait(timeout=self.spec.stop_grace_s)
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
                deadline = time.monotonic() + self.spec.stop_grace_s
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

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __enter__(self) -> Self:
        """Start it from synchronous code (no event loop may be running in this thread)."""
        asyncio.run(self.start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_sync()


class ServerGroup:
    """Replicas of one model, started side by side (a vLLM start takes minutes) and
    stopped together: `async with ServerGroup([...]) as group:` → `group.base_urls`.

    When one replica cannot start, the others (started or still starting) are stopped
    and its ServerStartupError, with the server's own error line, is raised.
    """

    def __init__(
        self, processes: Sequence[ServerProcess], gpus: Sequence[Sequence[int]] = ()
    ) -> None:
        if not processes:
            raise ValueError("a server group needs at least one server")
        self.processes = list(processes)
        self.gpus = tuple(tuple(devices) for devices in gpus)  # each replica's, if known

    @property
    def base_urls(self) -> tuple[str, ...]:
        return tuple(process.base_url or "" for process in self.processes)

    async def start(self) -> None:
        starts = [asyncio.create_task(process.start()) for process in self.processes]
        try:
            await asyncio.wait(starts, return_when=asyncio.FIRST_EXCEPTION)
        finally:  # on a failed start, and when cancelled, nothing may stay up
            failed = [t for t in starts if t.done() and not t.cancelled() and t.exception()]
            if failed or not all(task.done() for task in starts):
                for task in starts:
                    task.cancel()
                await asyncio.gather(*starts, return_exceptions=True)
                await self.stop()
        error = failed[0].exception() if failed else None
        if error is not None:
            raise error

    async def stop(self) -> None:
        """Stops every replica (each stop is idempotent), then raises the first error."""
        stopped = await asyncio.gather(
            *(process.stop() for process in self.processes), return_exceptions=True
        )
        for outcome in stopped:
            if isinstance(outcome, BaseException):
                raise outcome

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def replica_devices(engines: int, tp: int, visible: str | None) -> list[list[str]]:
    """Each engine's GPUs: the i-th run of `tp` among `visible` (CUDA_VISIBLE_DEVICES:
    indices or UUIDs), or among 0, 1, ... when it names none. Raises ServerStartupError
    when it names too few (the configuration cannot start here)."""
    names = [name.strip() for name in (visible or "").split(",") if name.strip()]
    if not names:
        names = [str(index) for index in range(engines * tp)]
    if len(names) < engines * tp:
        reason = (
            f"{engines} engines of tensor-parallel size {tp} need {engines * tp} GPUs, but "
            f"CUDA_VISIBLE_DEVICES names {len(names)}"
        )
        raise ServerStartupError(f"{reason}; name more GPUs or lower resources.gpus.", reason)
    return [names[i * tp : (i + 1) * tp] for i in range(engines)]


ServerMaker = Callable[[Mapping[str, object], int, Mapping[str, str]], ServerProcess]


def replica_group(
    make: ServerMaker,
    flags: Mapping[str, object],
    engines: int,
    *,
    data_parallel: bool,
    env: Mapping[str, str],
) -> ServerGroup:
    """`engines` replicas, each `make(flags, port, env)`: one server each on disjoint GPUs
    (CUDA_VISIBLE_DEVICES) and ports, or with `data_parallel` one server whose flags hold
    data_parallel_size = engines."""
    if data_parallel or engines == 1:
        extra = {"data_parallel_size": engines} if engines > 1 else {}
        return ServerGroup([make({**flags, **extra}, free_port(), env)])
    tp = int(str(flags.get("tensor_parallel_size") or 1))
    visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    devices = replica_devices(engines, tp, visible)
    servers = [
        make(flags, port, {**env, "CUDA_VISIBLE_DEVICES": ",".join(gpus)})
        for gpus, port in zip(devices, free_ports(engines), strict=True)
    ]
    numbered = all(name.isdigit() for gpus in devices for name in gpus)
    return ServerGroup(servers, [[int(n) for n in gpus] for gpus in devices] if numbered else ())
