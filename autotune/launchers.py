"""Server configurations for a sweep: start one, measure points on it, stop it.

A `Launcher` turns a set of server knobs into a running configuration (a
`ConfigSession`) that can measure throughput at any parallelism. The sweep only sees
these two Protocols, so the same search runs against real vLLM, the simulated server
over HTTP, a server someone else runs, or (for benchmarks) the simulated engine in
virtual time. A configuration the server refuses raises ServerStartupError, whose
`reason` is the server's own error line.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from autotune.backends.openai import OpenAIBackend
from autotune.config import TargetConfig
from autotune.errors import CollectionError
from autotune.probe import ProbeResult, ProbeSettings, run_probe
from autotune.servers.launcher import ServerProcess
from autotune.target import api_key, open_session, resolve_target
from autotune.verifiers import Verifier
from autotune.workload import Task

log = logging.getLogger("autotune")


@dataclass(frozen=True, slots=True)
class Point:
    """One measured point of a configuration's throughput curve."""

    parallelism: int
    rollouts_per_s: float
    output_tokens_per_s: float
    error_rate: float
    p95_latency_s: float | None
    probe_s: float  # time the probe took (simulated seconds on the virtual engine)
    stop_reason: str

    @classmethod
    def of(cls, result: ProbeResult) -> Point:
        """The curve point a full probe result makes."""
        return cls(
            parallelism=result.parallelism,
            rollouts_per_s=result.rollouts_per_s,
            output_tokens_per_s=result.output_tokens_per_s,
            error_rate=result.error_rate,
            p95_latency_s=result.latency_s["total"].p95,
            probe_s=result.measured_s + result.warmup_s,
            stop_reason=result.stop_reason,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ConfigSession(Protocol):
    async def measure(self, parallelism: int) -> Point: ...


class Launcher(Protocol):
    """Starts a server configuration and stops it when the block ends."""

    def running(self, knobs: Mapping[str, Any]) -> Any:
        """An async context manager yielding a ConfigSession for these knobs."""
        ...


@dataclass(slots=True)
class HttpSession:
    """Measures a configuration over HTTP with steady-state probes."""

    session: aiohttp.ClientSession
    backend: OpenAIBackend
    verifier: Verifier
    tasks: Sequence[Task]
    base_url: str
    settings: ProbeSettings

    async def measure(self, parallelism: int) -> Point:
        result = await run_probe(
            replace(self.settings, parallelism=parallelism),
            self.tasks,
            self.backend,
            self.verifier,
            self.session,
            self.base_url,
        )
        return Point.of(result)


@dataclass(slots=True)
class HttpLauncher:
    """Launches a server process per configuration (the sim or vLLM), or uses a running one.

    `server(knobs)` makes the (unstarted) server process for a configuration; None means
    the server at `target.base_url` is used as it is (no knobs can change).
    """

    target: TargetConfig
    verifier: Verifier
    tasks: Sequence[Task]
    settings: ProbeSettings
    server: Callable[[Mapping[str, Any]], ServerProcess] | None = None

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[HttpSession]:
        if self.server is None:
            async with self._session(self.target.base_url or "") as session:
                yield session
            return
        process = self.server(knobs)
        async with process, self._session(process.base_url or "") as session:
            yield session

    @asynccontextmanager
    async def _session(self, base_url: str) -> AsyncIterator[HttpSession]:
        async with open_session(self.target) as session:
            key = api_key(self.target)
            target = await resolve_target(
                session, base_url, self.target.model, key, self.target.api_key_env
            )
            backend = OpenAIBackend(
                session, replace(self.target, base_url=target.base_url), target.model, key
            )
            yield HttpSession(
                session, backend, self.verifier, self.tasks, target.base_url, self.settings
            )


@dataclass(slots=True)
class CommandSession:
    """Measures a user's own collector command (NeMo Gym's, say) at one parallelism a run."""

    template: str
    limit: int
    workdir: Path

    async def measure(self, parallelism: int) -> Point:
        from autotune.servers.command import run_command_probe

        try:
            result = await run_command_probe(self.template, parallelism, self.limit, self.workdir)
        except CollectionError as error:  # the command failed at this parallelism
            log.warning("%s", error)
            return Point(parallelism, 0.0, 0.0, 1.0, None, 0.0, "command failed")
        return Point.of(result)


@dataclass(slots=True)
class CommandLauncher:
    """No server to start: the command is the whole collection stack, run per point."""

    template: str
    limit: int
    workdir: Path

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[CommandSession]:
        yield CommandSession(self.template, self.limit, self.workdir)
