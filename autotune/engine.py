"""The async rollout loop: model calls and verification, overlapped.

`parallelism` workers each take the next rollout, call the model and then either
verify inline (cheap verifiers) or hand the rollout to the verifier stage through a
queue bounded by the verifier's capacity. So a slow verifier holds back new model
requests only once its own queue is full, never before.

The loop is the hot path of every measurement autotune makes, so it does as little
as it can per rollout: no task objects per rollout, no locks, one write per row.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.backends import Generation, ModelBackend, ModelCallError
from autotune.responses import build_response
from autotune.results import StageSamples, stage_durations
from autotune.store import RolloutSink
from autotune.verifiers import Verifier
from autotune.workload import WorkItem

# After this many model calls in a row fail to connect, the server is taken for dead.
DEAD_SERVER_CONSECUTIVE_FAILURES = 20
AGENT_REF = {"name": "autotune"}

# A rollout waiting for the verifier: (item, generation, row so far, queued time).
_VerifyJob = tuple[WorkItem, Generation, dict[str, Any], float]


class EngineObserver(Protocol):
    """Told of every finished rollout: the progress bar, a probe's steady-state meter."""

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None: ...

    def rollout_failed(self, failure_class: str) -> None: ...


@dataclass(slots=True)
class RunStats:
    """Running totals of one engine run."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reward_sum: float = 0.0
    reward_count: int = 0
    errors_by_class: dict[str, int] = field(default_factory=dict)
    samples: StageSamples = field(default_factory=StageSamples)
    started: float = 0.0  # perf_counter at the run's start
    finished: float = 0.0
    stopped_early: str | None = None

    @property
    def elapsed_s(self) -> float:
        return max(self.finished - self.started, 1e-9)


class Engine:
    """Runs work items through a backend and a verifier into a sink."""

    def __init__(
        self,
        backend: ModelBackend,
        verifier: Verifier,
        sink: RolloutSink,
        parallelism: int,
        observer: EngineObserver | None = None,
        extra_row_fields: dict[str, Any] | None = None,
    ) -> None:
        self._backend = backend
        self._verifier = verifier
        self._sink = sink
        self._parallelism = parallelism
        self._observer = observer
        self._extra = extra_row_fields or {}
        self._consecutive_connection_failures = 0
        self._stopping = False
        self.stats = RunStats()
        self._queue: asyncio.Queue[_VerifyJob | None] | None = None

    async def run(self, items: Iterator[WorkItem]) -> RunStats:
        """Make every rollout `items` yields; returns the run's totals."""
        stats = self.stats
        stats.started = time.perf_counter()
        capacity = self._verifier.capacity
        consumers: list[asyncio.Task[None]] = []
        if capacity is not None:
            self._queue = asyncio.Queue(maxsize=capacity)
            consumers = [asyncio.create_task(self._verify_worker()) for _ in range(capacity)]
        workers = [asyncio.create_task(self._model_worker(items)) for _ in range(self._parallelism)]
        try:
            await _until_done(workers, also_watch=consumers)
            if self._queue is not None:
                for _ in consumers:
                    await self._queue.put(None)
                await _until_done(consumers)
        finally:
            for task in (*workers, *consumers):
                task.cancel()
            stats.finished = time.perf_counter()
        return stats

    async def _model_worker(self, items: Iterator[WorkItem]) -> None:
        backend = self._backend
        inline = self._queue is None
        for item in items:  # one shared iterator: each worker takes the next rollout
            if self._stopping:
                return
            queued = time.time()
            try:
                generation = await backend.generate(item.task)
            except ModelCallError as error:
                self._model_failed(item, error, queued)
                continue
            self._consecutive_connection_failures = 0
            row = self._row(item, generation)
            if inline:
                await self._verify(item, generation, row, queued)
            else:
                assert self._queue is not None
                await self._queue.put((item, generation, row, queued))

    async def _verify_worker(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            if job is None:
                return
            await self._verify(*job)

    def _row(self, item: WorkItem, generation: Generation) -> dict[str, Any]:
        task = item.task
        row: dict[str, Any] = {
            "_ng_task_index": task.index,
            "_ng_rollout_index": item.rollout_index,
            "responses_create_params": task.create_params,
            "response": build_response(
                response_id=generation.response_id,
                model=self._backend.model,
                text=generation.text,
                tool_calls=generation.tool_calls,
                input_tokens=generation.input_tokens,
                output_tokens=generation.output_tokens,
                finish_reason=generation.finish_reason,
                request=task.create_params,
            ),
        }
        row.update(task.verifier_fields())
        return row

    async def _verify(
        self,
        item: WorkItem,
        generation: Generation,
        row: dict[str, Any],
        queued: float,
    ) -> None:
        verify_start = time.time()
        try:
            result = await self._verifier.verify(row)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a user's verifier may raise anything: record, go on
            verify_end = time.time()
            self._failed(
                item,
                "verifier_error",
                f"{type(error).__name__}: {error}",
                _timings(queued, generation, verify_start, verify_end),
                response=row["response"],
            )
            return
        verify_end = time.time()
        row.update(result)
        row["agent_ref"] = AGENT_REF
        timings = _timings(queued, generation, verify_start, verify_end)
        row["_autotune"] = {**self._extra, "timings": timings, "attempts": generation.attempts}
        self._sink.write(row)

        stats = self.stats
        stats.completed += 1
        stats.input_tokens += generation.input_tokens
        stats.output_tokens += generation.output_tokens
        reward = result.get("reward")
        if reward is not None:
            stats.reward_sum += float(reward)
            stats.reward_count += 1
        add = stats.samples.add
        for stage, seconds in stage_durations(timings):
            add(stage, seconds)
        if self._observer is not None:
            self._observer.rollout_done(timings, generation.output_tokens)

    def stop(self) -> None:
        """Finish the rollouts in flight, start no new one (a probe has measured enough)."""
        self._stopping = True

    def _model_failed(self, item: WorkItem, error: ModelCallError, queued: float) -> None:
        now = time.time()
        self._failed(
            item,
            error.failure_class,
            str(error),
            {"queued": queued, "failed": now},
            attempts=error.attempts,
        )
        if error.failure_class == "connection":
            self._consecutive_connection_failures += 1
            if self._consecutive_connection_failures >= DEAD_SERVER_CONSECUTIVE_FAILURES:
                self._stopping = True
                self.stats.stopped_early = f"the model server stopped answering ({error})"
        else:
            self._consecutive_connection_failures = 0

    def _failed(
        self,
        item: WorkItem,
        failure_class: str,
        message: str,
        timings: dict[str, float | None],
        response: dict[str, Any] | None = None,
        attempts: int = 1,
    ) -> None:
        stats = self.stats
        stats.failed += 1
        stats.errors_by_class[failure_class] = stats.errors_by_class.get(failure_class, 0) + 1
        failure: dict[str, Any] = {
            "_ng_task_index": item.task.index,
            "_ng_rollout_index": item.rollout_index,
            "failure_class": failure_class,
            "message": message,
            "responses_create_params": item.task.create_params,
            "_autotune": {**self._extra, "timings": timings, "attempts": attempts},
        }
        if response is not None:
            failure["response"] = response
        self._sink.write_failure(failure)
        if self._observer is not None:
            self._observer.rollout_failed(failure_class)


def _timings(
    queued: float, generation: Generation, verify_start: float, verify_end: float
) -> dict[str, float | None]:
    return {
        "queued": queued,
        "model_start": generation.model_start,
        "first_token": generation.first_token,
        "model_end": generation.model_end,
        "verify_start": verify_start,
        "verify_end": verify_end,
    }


async def _until_done(
    tasks: Sequence[asyncio.Task[None]], also_watch: Sequence[asyncio.Task[None]] = ()
) -> None:
    """Wait for `tasks`; the first exception in them or in `also_watch` is raised at once.

    A verifier consumer that dies (a full disk under the writer, say) would otherwise
    leave the model workers blocked on a full queue forever.
    """
    waiting = set(tasks)
    watched = waiting | set(also_watch)
    while waiting:
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            error = task.exception()
            if error is not None:
                raise error
            watched.discard(task)
            waiting.discard(task)
