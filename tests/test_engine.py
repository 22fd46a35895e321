"""The engine loop with in-process fakes: verification overlap, failures, no hang."""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.config.collection import SyntheticWorkload
from autotune.rollout.backends import CallCounters, Generation
from autotune.rollout.engine import Engine
from autotune.rollout.store import RolloutSink, completed_keys, failures_path
from autotune.rollout.workload import Task, WorkItem, synthetic_tasks
from tests.helpers import read_rows


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


class ScriptedVerifier:
    """Answers task i with `answers[i]`: what a user's verifier might return."""

    name = "scripted"
    capacity = None

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.answers[row["_ng_task_index"]]
        return answer

    async def aclose(self) -> None:
        pass


BAD_ANSWERS = [
    ({"reward": 1.0, "tags": {"a", "b"}}, "the verifier's 'tags' is a set JSON cannot hold"),
    ({"reward": float("nan")}, "the verifier's 'reward' is nan; return a finite float"),
    ({"reward": float("-inf")}, "the verifier's 'reward' is -inf"),
    ({"reward": 10**400}, "the verifier's 'reward' is inf"),
    ({"reward": "high"}, "the verifier's 'reward' is a str ('high'), not a number"),
    ({"score": 1.0}, "the verifier's answer has no 'reward'"),
    ("yes", "the verifier returned a str, not a dict"),
    ({"reward": 0.0, 3: "x"}, "the verifier's answer has a int key (3)"),
    ({"reward": 0.0, "deep": {"x": [object()]}}, "the verifier's 'deep' is a dict JSON cannot"),
]
GOOD_ANSWERS = [
    {"reward": True},  # NeMo Gym's float field takes a bool as 1.0
    {"reward": 0, "note": "kept", "_ng_task_index": 99, "_ng_rollout_index": 7,
     "response": "echoed", "responses_create_params": {}, "agent_ref": "x", "_autotune": 1},
    {"reward": None},  # no verification (the `none` verifier)
]  # fmt: skip


async def test_bad_verifier_answers_fail_their_rollout_and_never_the_run(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    answers = [answer for answer, _ in BAD_ANSWERS] + GOOD_ANSWERS
    sink = RolloutSink(out, False)
    engine = Engine(FakeBackend(), ScriptedVerifier(answers), sink, 4)
    stats = await engine.run(iter(items(len(answers))))
    sink.close()
    assert (stats.completed, stats.failed) == (len(GOOD_ANSWERS), len(BAD_ANSWERS))
    assert stats.errors_by_class == {"verifier_error": len(BAD_ANSWERS)}
    failures = {f["_ng_task_index"]: f["message"] for f in read_rows(failures_path(out))}
    for index, (_, says) in enumerate(BAD_ANSWERS):
        assert says in failures[index], failures[index]
    rows = {r["_ng_task_index"]: r for r in read_rows(out)}
    first = len(BAD_ANSWERS)
    assert sorted(rows) == [first, first + 1, first + 2]
    assert rows[first]["reward"] == 1.0 and type(rows[first]["reward"]) is float
    echoed = rows[first + 1]  # the engine's own keys win over the verifier's
    assert echoed["reward"] == 0.0 and echoed["note"] == "kept"
    assert (echoed["_ng_task_index"], echoed["_ng_rollout_index"]) == (first + 1, 0)
    assert echoed["response"]["output"] and echoed["responses_create_params"]["input"]
    assert echoed["agent_ref"] == {"name": "autotune"} and "timings" in echoed["_autotune"]
    assert (stats.reward_sum, stats.reward_count) == (1.0, 2)
    assert len(completed_keys(out)) == 3  # --resume reads the file back
