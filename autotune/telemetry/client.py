"""The harness's own health (CPU share, loop lag, memory), so that a diagnosis can say
"the client is the bottleneck". Why: docs/design/telemetry.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import psutil

HEARTBEAT_S = 0.05
CHILDREN_RESCAN_S = 5.0
"""Listing children walks all of /proc (~12 µs a process): done rarely, the list cached."""


class ClientSampler:
    """Samples the current process; its heartbeat task starts with the first `sample()`."""

    name = "client"
    available = True
    reason: str | None = None

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._heartbeat: asyncio.Task[None] | None = None
        self._max_lag_s = 0.0
        self._last_wall: float | None = None
        self._last_cpu = 0.0
        self._children: dict[int, psutil.Process] = {}
        self._child_cpu: dict[int, float] = {}  # CPU seconds at the last read
        self._next_rescan: float | None = None

    async def sample(self) -> dict[str, float] | None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat(), name="telemetry-heartbeat")
        wall = time.perf_counter()
        times = os.times()
        cpu = times.user + times.system
        children_cpu = self._children_cpu(wall)
        values = {"rss_mb": self._process.memory_info().rss / 2**20}
        if self._last_wall is not None:
            elapsed = wall - self._last_wall
            values["cpu_fraction"] = (cpu - self._last_cpu) / elapsed
            values["children_cpu_fraction"] = children_cpu / elapsed
            values["loop_lag_ms"] = self._max_lag_s * 1000
        self._last_wall, self._last_cpu, self._max_lag_s = wall, cpu, 0.0
        return values

    async def aclose(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None

    async def _beat(self) -> None:
        """Sleep 50 ms at a time; anything past that is time the loop could not run us."""
        while True:
            due = time.perf_counter() + HEARTBEAT_S
            await asyncio.sleep(HEARTBEAT_S)
            self._max_lag_s = max(self._max_lag_s, time.perf_counter() - due)

    def _children_cpu(self, now: float) -> float:
        """CPU seconds the live children used since the last call.

        A child first seen after the first call counts its whole life (it started since
        the last listing, give or take a rescan). A child that exits between samples
        loses its last interval: pool workers live long, so that is rare.
        """
        if self._next_rescan is None or now >= self._next_rescan:
            with contextlib.suppress(psutil.Error):
                self._list_children(first=self._next_rescan is None)
            self._next_rescan = now + CHILDREN_RESCAN_S
        used = 0.0
        for pid, child in list(self._children.items()):
            try:
                times = child.cpu_times()
            except psutil.Error:
                del self._children[pid]
                self._child_cpu.pop(pid, None)
                continue
            total = times.user + times.system
            used += total - self._child_cpu.get(pid, total)
            self._child_cpu[pid] = total
        return used

    def _list_children(self, *, first: bool) -> None:
        children: dict[int, psutil.Process] = {}
        for child in self._process.children(recursive=True):
            known = self._children.get(child.pid)
            if known is not None and known == child:  # psutil compares pid and start time
                children[child.pid] = known
                continue
            children[child.pid] = child
            if not first:
                self._child_cpu[child.pid] = 0.0  # born since the last listing: count it all
        self._child_cpu = {pid: cpu for pid, cpu in self._child_cpu.items() if pid in children}
        self._children = children
