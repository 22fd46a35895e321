"""What a measurement needs around it: the servers it runs against, the command line,
the machine's identity, the arms' order over rounds, medians and progress lines."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from autotune.bench.overhead import NullServer

REPO = Path(__file__).resolve().parents[2]  # the checkout
T = TypeVar("T")


def machine() -> dict[str, Any]:
    """Enough of the machine's identity to tell whether two results are comparable."""
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def rotations(arms: Sequence[T], rounds: int) -> Iterator[list[T]]:
    """Each round's order of the arms, rotating one place a round, so that machine noise
    and drift hit every arm alike."""
    for index in range(rounds):
        shift = index % len(arms)
        yield [*arms[shift:], *arms[:shift]]


def log(*parts: Any) -> None:
    """Progress, on stderr (stdout carries the figures)."""
    print(*parts, file=sys.stderr, flush=True)


def pin_client() -> tuple[int | None, int | None]:
    """(client core, server core): this process pinned to the first, the second left for
    a null server, so the client is bound by its own CPU. Nones where there is no pinning."""
    from autotune.bench.overhead import core_plan, pin_self

    client_core, server_core = core_plan()
    pin_self(client_core)
    return client_core, server_core


@contextlib.contextmanager
def null_server(core: int | None, **options: Any) -> Iterator[NullServer]:
    """The null server (answers at once) on `core`, stopped on leaving; `options` as
    NullServer takes them (tool_turns)."""
    from autotune.bench.overhead import NullServer

    with NullServer(core=core, **options) as server:
        log(f"null server {server.base_url} (core {core})")
        yield server


@contextlib.asynccontextmanager
async def sim_server(flags: Sequence[str]) -> AsyncIterator[str]:
    """A fresh simulated server with vLLM-style `flags`; its base URL, stopped on leaving."""
    from autotune.servers.launcher import ServerSpec

    async with ServerSpec.sim(list(flags)).process() as server:
        assert server.base_url is not None
        yield server.base_url


def autotune_cli(
    *args: str,
    timeout: float | None = None,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -m autotune ARGS` as a user runs it, from the checkout (or `cwd`), its
    output captured; `env` added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )
