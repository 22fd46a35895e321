"""The engine loop with in-process fakes: verification overlap, failures, no hang."""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.backends import CallCounters, Generation
from autotune.config import SyntheticWorkload
from autotune.engine import Engine
from autotune.store import RolloutSink
from autotune.workload import Task, WorkItem, synthetic_tasks


class FakeBackend:
    model = "fake"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.counters = CallCounters()
        self.delay_s = delay_s

    async def generate(self, task: Task) -> Generation:
        start = time.time()
        await asyncio.sleep(self.delay_s)
        return Generation("42", [], 3, 1, "stop", str(task.index), start, time.time(), time.time())


class QueuedVerifier:
    """A verifier that queues (capacity 1) and takes `cost_s` each."""

    name = "fake"

    def __init__(self, capacity: int | None, cost_s: float = 0.0) -> None:
        self.capacity = capacity
        self.cost_s = cost_s

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(self.cost_s)
        return {"reward": 1.0}

    async def aclose(self) -> None:
        pass


class FullDisk(RolloutSink):
    def write(self, row: dict[str, Any]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def items(count: int) -> list[WorkItem]:
    return [WorkItem(t, 0) for t in synthetic_tasks(SyntheticWorkload(num_tasks=count))]


async def test_a_dying_verifier_stage_stops_the_run_instead_of_hanging(tmp_path: Path) -> None:
    engine = Engine(FakeBackend(), QueuedVerifier(capacity=1), FullDisk(None, False), 8)
    with pytest.raises(OSError, match="No space left"):
        await asyncio.wait_for(engine.run(iter(items(50))), timeout=5)


async def test_a_slow_verifier_holds_back_model_calls_only_when_its_queue_is_full() -> None:
    sink = RolloutSink(None, False)
    engine = Engine(FakeBackend(delay_s=0.001), QueuedVerifier(capacity=2, cost_s=0.02), sink, 8)
    stats = await engine.run(iter(items(40)))
    assert stats.completed == 40
    waits = list(stats.samples.samples["verify_wait"])
    # Rollouts queue for the verifier (its capacity is the limit), so they wait for it...
    assert max(waits) > 0.02
    # ...and throughput is the verifier's: 2 workers × 50 per second.
    assert 40 / stats.elapsed_s < 2 * 50 * 1.2
