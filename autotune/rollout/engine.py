"""The async rollout loop: model calls and verification, overlapped, doing as little as it
can per rollout (the hot path of every measurement).
Why: docs/design/rollout.md.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from autotune.results.responses import build_response
from autotune.results.stages import StageSamples, stage_durations
from autotune.rollout.backends import Generation, ModelBackend, ModelCallError
from autotune.rollout.concurrency import AdaptiveConcurrency
from autotune.rollout.store import RolloutSink
from autotune.rollout.workload import WorkItem
from autotune.verifiers import Verifier

# After this many model calls in a row fail to connect, the server is taken for dead.
DEAD_SERVER_CONSECUTIVE_FAILURES = 20
AGENT_REF = {"name": "autotune"}
# Keys the engine writes into every row. A verifier's answer never replaces them: answers
# often echo the row (NeMo Gym's /verify does), so such keys are dropped without a word.
RESERVED_KEYS = frozenset(
    ("_ng_task_index", "_ng_rollout_index", "responses_create_params", "response", "agent_ref",
     "_autotune")
)  # fmt: skip

# A rollout waiting for the verifier: (item, generation, row so far, queued time).
_VerifyJob = tuple[WorkItem, Generation, dict[str, Any], float]


class EngineObserver(Protocol):
    """Told of every finished rollout: the progress bar, a probe's steady-state meter."""

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None: ...

    def rollout_failed(self, failure_class: str) -> None: ...


class GroupObserver(Protocol):
    """Told of every sample's end when rollouts come in GRPO groups (rl.groups.GroupTracker);
    counts the groups closed so far."""

    complete: int
    informative: int
    informative_tokens: int  # the informative groups' output tokens

    @property
    def straggler_ratios(self) -> Sequence[float]:
        """Each complete group's, in the order they closed."""
        ...

    def ended(
        self,
        task_index: int,
        start: float,
        end: float,
        reward: float | None = None,
        output_tokens: int = 0,
        completed: bool = True,
    ) -> object: ...


@dataclass(slots=True)
class RunStats:
    """Running totals of one engine run."""

    taken: int = 0  # rollouts a worker has begun: taken − completed − failed are in flight
    completed: int = 0
    failed: int = 0
    cancelled: int = 0  # by a batch step's end (Engine.one), neither completed nor failed
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


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one rollout: written as completed (`failure_class` None, its reward
    and output tokens), or failed with its class (the failures file holds it)."""

    failure_class: str | None
    reward: float | None = None
    output_tokens: int = 0


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
        adaptive_concurrency: bool = False,
        groups: GroupObserver | None = None,
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
        # None: exactly `parallelism` calls in flight, as a probe needs.
        self.limiter = AdaptiveConcurrency(parallelism) if adaptive_concurrency else None
        self._refusals_seen = 0
        # Told of every sample's end when rollouts come in GRPO groups (--num-repeats > 1).
        self.groups = groups
        # More `_autotune` fields for a row as it is written (a batch step's number).
        self.annotate: Callable[[WorkItem], dict[str, Any]] | None = None

    async def run(self, items: Iterator[WorkItem]) -> RunStats:
        """Make every rollout `items` yields; returns the run's totals."""
        stats = self.stats
        stats.started = time.perf_counter()
        capacity = self._verifier.capacity
        consumers: list[asyncio.Task[None]] = []
        if capacity is not None:
            self._queue = asyncio.Queue(maxsize=capacity)
            consumers = [asyncio.create_task(self._verify_worker()) for _ in range(capacity)]
        counters = self._backend.counters
        if self.limiter is not None:
            self._refusals_seen = counters.overloads
            counters.retry_gate = self._before_retry
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
            if self.limiter is not None:
                counters.retry_gate = None
        return stats

    async def _model_worker(self, items: Iterator[WorkItem]) -> None:
        backend = self._backend
        limiter = self.limiter
        inline = self._queue is None
        for item in items:  # one shared iterator: each worker takes the next rollout
            if self._stopping:
                return
            self.stats.taken += 1
            queued = time.time()
            if limiter is not None:
                await limiter.acquire()  # the wait counts as the rollout's queue time
            try:
                generation = await backend.generate(item.task)
            except ModelCallError as error:
                if limiter is not None:
                    self._call_ended(limiter, None)
                self._model_failed(item, error, queued)
                continue
            if limiter is not None:
                self._call_ended(limiter, generation.model_end - generation.model_start)
            self._consecutive_connection_failures = 0
            row = self._row(item, generation)
            if inline:
                await self._verify(item, generation, row, queued)
            else:
                assert self._queue is not None
                await self._queue.put((item, generation, row, queued))

    async def one(self, item: WorkItem) -> Outcome:
        """Make one rollout, model call and verification inline: a batch step or the RL
        loop launches each of its samples as a task of this. A sample cancelled when its
        step ends is written to the failures file as `cancelled` and counted apart from
        failures."""
        self.stats.taken += 1
        queued = time.time()
        try:
            try:
                generation = await self._backend.generate(item.task)
            except ModelCallError as error:
                self._model_failed(item, error, queued)
                return Outcome(error.failure_class)
            self._consecutive_connection_failures = 0
            return await self._verify(item, generation, self._row(item, generation), queued)
        except asyncio.CancelledError:
            self._cancelled(item, queued)
            raise

    def _cancelled(self, item: WorkItem, queued: float) -> None:
        now = time.time()
        self.stats.cancelled += 1
        message = "cancelled: its batch step ended, or the run stopped"
        timings: dict[str, float | None] = {"queued": queued, "cancelled": now}
        self._sink.write_failure(self._failure_row(item, "cancelled", message, timings, 1))
        if self.groups is not None:
            self.groups.ended(item.task.index, queued, now, completed=False)

    def _failure_row(
        self,
        item: WorkItem,
        failure_class: str,
        message: str,
        timings: dict[str, float | None],
        attempts: int,
    ) -> dict[str, Any]:
        """A row of the failures file: a failed or a cancelled rollout."""
        return {
            "_ng_task_index": item.task.index,
            "_ng_rollout_index": item.rollout_index,
            "failure_class": failure_class,
            "message": message,
            "responses_create_params": item.task.create_params,
            "_autotune": self._autotune_fields(item, timings, attempts),
        }

    def _autotune_fields(
        self, item: WorkItem, timings: dict[str, float | None], attempts: int
    ) -> dict[str, Any]:
        fields = {**self._extra, "timings": timings, "attempts": attempts}
        if self.annotate is not None:
            fields.update(self.annotate(item))
        return fields

    def _call_ended(self, limiter: AdaptiveConcurrency, rtt_s: float | None) -> None:
        """Frees a call's slot after stepping the limit: down if the server refused any
        call since the last look, up by a success (`rtt_s`: its last attempt's time)."""
        self._look_for_refusals(limiter)
        if rtt_s is not None:
            limiter.succeeded(rtt_s)
        limiter.release()

    async def _before_retry(self) -> None:
        """The backend's retry, about to re-send (CallCounters.before_retry): it backs the
        limit off for the refusal it follows, then waits its turn if over the limit."""
        assert self.limiter is not None
        self._look_for_refusals(self.limiter)
        await self.limiter.requeue()

    def _look_for_refusals(self, limiter: AdaptiveConcurrency) -> None:
        refusals = self._backend.counters.overloads
        if refusals != self._refusals_seen:
            self._refusals_seen = refusals
            limiter.overloaded()

    async def _verify_worker(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            if job is None:
                return
            await self._verify(*job)

    def _row(self, item: WorkItem, generation: Generation) -> dict[str, Any]:
        task = item.task
        if generation.row is not None:  # an agent made the rollout: its row, our indices
            return {
                **generation.row,
                "_ng_task_index": task.index,
                "_ng_rollout_index": item.rollout_index,
            }
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
                output=generation.output,
                reasoning=generation.reasoning,
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
    ) -> Outcome:
        verify_start = time.time()
        try:
            result = storable(await self._verifier.verify(row))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a user's verifier may raise or return anything: record, go on
            verify_end = time.time()
            self._failed(
                item,
                "verifier_error",
                f"{type(error).__name__}: {error}",
                _timings(queued, generation, verify_start, verify_end),
                response=row["response"],
            )
            return Outcome("verifier_error")
        verify_end = time.time()
        row.update(result)
        row["agent_ref"] = AGENT_REF
        timings = _timings(queued, generation, verify_start, verify_end)
        row["_autotune"] = self._autotune_fields(item, timings, generation.attempts)
        if generation.turns is not None:
            row["_autotune"]["turns"] = generation.turns
            row["_autotune"]["tool_errors"] = generation.tool_errors
        self._sink.write(row)

        stats = self.stats
        stats.completed += 1
        stats.input_tokens += generation.input_tokens
        stats.output_tokens += generation.output_tokens
        reward = result["reward"]
        if reward is not None:
            stats.reward_sum += reward
            stats.reward_count += 1
        add = stats.samples.add
        for stage, seconds in stage_durations(timings):
            add(stage, seconds)
        if self.groups is not None:
            self.groups.ended(item.task.index, queued, verify_end, reward, generation.output_tokens)
        if self._observer is not None:
            self._observer.rollout_done(timings, generation.output_tokens)
        return Outcome(None, reward, generation.output_tokens)

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
        failure = self._failure_row(item, failure_class, message, timings, attempts)
        if response is not None:
            failure["response"] = response
        self._sink.write_failure(failure)
        if self.groups is not None:
            start = timings["queued"] or 0.0
            self.groups.ended(item.task.index, start, time.time(), completed=False)
        if self._observer is not None:
            self._observer.rollout_failed(failure_class)


class VerifierResultError(ValueError):
    """A verifier answered something no row can hold: that rollout fails, the run goes on."""


_MISSING: Any = object()  # a verifier answer without 'reward'


def storable(result: Any) -> dict[str, Any]:
    """The verifier's answer, fit to merge into a row: a dict, `reward` None or a finite
    float, every value one orjson can write (the sink would fail on it later, killing the
    run), and none of RESERVED_KEYS. Else VerifierResultError names the bad key.

    Per rollout, so the common answer (a dict with a finite float reward) costs a type
    check, a subtraction and one small orjson.dumps.
    """
    if not isinstance(result, dict):
        raise VerifierResultError(
            f"the verifier returned a {type(result).__name__}, not a dict; "
            "return a dict with a float 'reward'"
        )
    reward = result.get("reward", _MISSING)
    if reward is not None and (type(reward) is not float or reward - reward != 0.0):
        result = {**result, "reward": _finite_reward(reward)}
    if not RESERVED_KEYS.isdisjoint(result):
        result = {key: value for key, value in result.items() if key not in RESERVED_KEYS}
    try:
        orjson.dumps(result)
    except orjson.JSONEncodeError:
        raise VerifierResultError(_unstorable(result)) from None
    return result


def _finite_reward(reward: Any) -> float:
    """A reward as NeMo Gym's float field takes it (ints and bools become floats), if finite."""
    if reward is _MISSING:
        raise VerifierResultError("the verifier's answer has no 'reward'; add a float 'reward'")
    if not isinstance(reward, numbers.Real):
        raise VerifierResultError(
            f"the verifier's 'reward' is a {type(reward).__name__} ({reward!r:.60}), "
            "not a number; return a float"
        )
    try:
        value = float(reward)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise VerifierResultError(
            f"the verifier's 'reward' is {value}; return a finite float (0.0 for a failed check)"
        )
    return value


def _unstorable(result: dict[Any, Any]) -> str:
    """Which key of `result` orjson cannot write, and why (the slow path of `storable`)."""
    for key, value in result.items():
        if not isinstance(key, str):
            return (
                f"the verifier's answer has a {type(key).__name__} key ({key!r:.60}); "
                "JSON keys are strings"
            )
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError as error:
            return (
                f"the verifier's {key!r} is a {type(value).__name__} JSON cannot hold ({error}); "
                "return lists, dicts, strings, numbers, booleans or None"
            )
    return "the verifier's answer cannot be written as JSON"


def _timings(
    queued: float, generation: Generation, verify_start: float, verify_end: float
) -> dict[str, float | None]:
    """A rollout's timestamps; a multi-turn one's also its seconds in tools (`tool`)."""
    timings: dict[str, float | None] = {
        "queued": queued,
        "model_start": generation.model_start,
        "first_token": generation.first_token,
        "model_end": generation.model_end,
        "verify_start": verify_start,
        "verify_end": verify_end,
    }
    if generation.turns is not None:
        timings["tool"] = generation.tool_s
    return timings


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
