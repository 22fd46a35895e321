"""Batch-synchronous collection: rollouts in training steps of B GRPO groups, each step's
tail and busy shares measured (running requests ÷ the server's batch limit), and the two
remedies RL stacks use (over-sampling, carry-over). Why: docs/design/rl.md.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import aiohttp

from autotune.config.rl_specs import BatchSpec
from autotune.results.runs import BatchStep, BatchSummary
from autotune.results.stages import StageLatency
from autotune.rl.groups import ClosedGroup, GroupTracker, tail_share
from autotune.rl.in_flight import GroupInFlight, GroupsInFlight
from autotune.rollout.backends import ModelBackend
from autotune.rollout.engine import Engine
from autotune.rollout.store import RolloutSink
from autotune.rollout.workload import Task, WorkItem
from autotune.telemetry.prometheus import KV_CAPACITY_TOKENS, PrometheusSampler
from autotune.verifiers import Verifier

POLL_S = 0.1  # how often the server's running gauge is read during a step
RUNNING = "vllm:num_requests_running"
GENERATED = "vllm:generation_tokens_total"
PROMPTED = "vllm:prompt_tokens_total"
SIM_MAX_NUM_SEQS = "autotune_max_num_seqs"


def grouped(items: Iterator[WorkItem]) -> Iterator[list[WorkItem]]:
    """Consecutive work items of one task as one group (work_items yields task-major)."""
    group: list[WorkItem] = []
    for item in items:
        if group and item.task.index != group[0].task.index:
            yield group
            group = []
        group.append(item)
    if group:
        yield group


def launched_groups(batch_groups: int, over_sample: float) -> int:
    """Groups a step starts: ceil(B*(1+R))."""
    return math.ceil(batch_groups * (1 + over_sample) - 1e-9)


async def run_steps(
    backend: ModelBackend,
    verifier: Verifier,
    session: aiohttp.ClientSession,
    metrics: str,
    tasks: Sequence[Task],
    spec: BatchSpec,
    group_size: int,
    steps: int,
    parallelism: int | None = None,
    max_num_seqs: int | None = None,
) -> BatchSummary:
    """`steps` training steps of `tasks`' groups (every `group_size`-th task is a prompt,
    as work_items repeats them), nothing saved: what `diagnose --batch-groups` and a
    goodput study's trial measure. Each group gets its own index, so a prompt sent
    again is another group. `max_num_seqs`: the server's, where the user said it."""
    prompts = tasks[::group_size]
    items = (
        WorkItem(replace(prompts[group % len(prompts)], index=group), sample)
        for group in range(steps * launched_groups(spec.batch_groups or 1, spec.over_sample))
        for sample in range(group_size)
    )
    engine = Engine(
        backend,
        verifier,
        RolloutSink(None, resume=False),
        parallelism=1,  # unused: the runner launches the samples
        groups=GroupTracker(group_size),
    )
    sampler = PrometheusSampler(session, metrics)
    runner = BatchRunner(engine, spec, group_size, parallelism, sampler, max_num_seqs)
    return await runner.run(items)


class Occupancy:
    """A level over time (requests running) and its time integral, so the mean over any
    window since the last `forget_before` is two readings of `area` apart."""

    def __init__(self, now: float) -> None:
        self.level = 0.0
        self._times = [now]  # each change: when, the integral then, the level from then
        self._areas = [0.0]
        self._levels = [0.0]

    def set(self, level: float, now: float) -> None:
        self._areas.append(self.area(now))
        self._times.append(now)
        self._levels.append(level)
        self.level = level

    def area(self, when: float) -> float:
        """The integral up to `when` (at or after the oldest change kept)."""
        i = bisect.bisect_right(self._times, when) - 1
        return self._areas[i] + self._levels[i] * (when - self._times[i])

    def mean(self, start: float, end: float) -> float | None:
        return (self.area(end) - self.area(start)) / (end - start) if end > start else None

    def forget_before(self, when: float) -> None:
        """Drop the changes no window from `when` on needs (a step's start)."""
        keep = max(0, bisect.bisect_right(self._times, when) - 1)
        del self._times[:keep], self._areas[:keep], self._levels[:keep]


class BatchRunner:
    """Runs an engine's rollouts in steps; see the module's docstring."""

    def __init__(
        self,
        engine: Engine,
        spec: BatchSpec,
        group_size: int,
        parallelism: int | None,
        sampler: PrometheusSampler | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        assert spec.batch_groups is not None
        assert isinstance(engine.groups, GroupTracker), "the engine must track groups"
        self._engine = engine
        self._tracker = engine.groups
        self._batch = spec.batch_groups
        self._launch = launched_groups(spec.batch_groups, spec.over_sample)
        self._filter = spec.over_sample > 0  # the step wants informative groups
        self._carry = spec.carry_over
        self._spec = spec
        launched = self._launch * group_size
        self._launched = min(parallelism, launched) if parallelism is not None else launched
        self._max_num_seqs = max_num_seqs  # the server's, over its engines, when known
        self._kv_tokens: float | None = None  # what the server's KV cache holds
        self._levels: list[tuple[float | None, float | None]] = []  # each step's running
        self._groups: Iterator[list[WorkItem]] = iter(())
        self._sampler = sampler
        self._step = 0
        self._in_flight = GroupsInFlight(parallelism)
        self._usable = 0  # groups the current step can hand to the trainer
        self._ends: list[float] = []  # the current step's sample end times
        self._ages: list[int] = []
        self._wake = asyncio.Event()
        self._client = Occupancy(time.perf_counter())
        self._server: Occupancy | None = None
        self.steps: list[BatchStep] = []
        self._informative_used = 0
        self._step_groups = 0  # complete groups of the current step
        self._step_informative = 0

    def annotate(self, item: WorkItem) -> dict[str, int]:
        """The `_autotune` fields of a row: the step it is counted to, and its age in steps."""
        group = self._in_flight.running.get(item.task.index)
        launched = group.launched_step if group is not None else self._step
        return {"step": self._step, "age_steps": self._step - launched}

    async def run(self, items: Iterator[WorkItem]) -> BatchSummary:
        """Every group `items` holds, in steps, to the end (or until the server is gone)."""
        self._tracker.on_close = self._closed
        self._engine.annotate = self.annotate
        self._groups = grouped(items)
        stats = self._engine.stats
        started = stats.started = time.perf_counter()
        tokens_before = await self._read()
        poller = asyncio.create_task(self._poll()) if self._sampler is not None else None
        try:
            while not self._engine.stats.stopped_early:  # else the server is gone
                launched = self._top_up()
                if not launched and not self._in_flight:
                    break
                await self._one_step()
        finally:
            if poller is not None:
                poller.cancel()
            await self._in_flight.cancel()  # an error or interrupt: none left running
            self._tracker.on_close = None
            self._engine.annotate = None
        stats.finished = time.perf_counter()
        elapsed = stats.finished - started
        tokens = await self._read()
        return self._summary(elapsed, tokens_before, tokens)

    def _top_up(self) -> int:
        """Launch groups until `launch` are in flight; how many were launched."""
        launched = 0
        while len(self._in_flight) < self._launch:
            group = next(self._groups, None)
            if group is None:
                break
            size = len(group)
            running = GroupInFlight(group[0].task.index, size, size, launched_step=self._step)
            self._in_flight.launch(running, group, self._sample)
            launched += 1
        return launched

    async def _sample(self, group: GroupInFlight, item: WorkItem) -> None:
        async with self._in_flight.slot():
            self._client.set(self._client.level + 1, time.perf_counter())
            try:
                await self._engine.one(item)
            finally:
                self._client.set(self._client.level - 1, time.perf_counter())
                self._ends.append(time.perf_counter())

    def _closed(self, group: ClosedGroup) -> None:
        running = self._in_flight.end(group.task_index)
        if running is not None and group.complete:  # not cancelled, no sample failed
            if group.informative or not self._filter:
                self._usable += 1
                self._ages.append(self._step - running.launched_step)
            if group.informative:
                self._informative_used += 1
                self._step_informative += 1
            self._step_groups += 1
        if self._carry and running is not None:  # keep the server full: the next starts now
            self._top_up()
        self._wake.set()

    async def _one_step(self) -> None:
        start = time.perf_counter()
        for level in (self._client, self._server):
            if level is not None:
                level.forget_before(start)
        self._usable = self._step_groups = self._step_informative = 0
        self._ends = []
        while self._usable < self._batch and self._in_flight:
            self._wake.clear()
            await self._wake.wait()
        end = time.perf_counter()
        ends = [t for t in self._ends if t <= end]
        cancelled = 0
        if not self._carry and self._in_flight:
            cancelled, _ = await self._in_flight.cancel()
        running = self._server if self._server is not None else self._client
        tail = tail_share(ends, start, end)
        tail_running = running.mean(end - tail * (end - start), end) if tail else None
        self._levels.append((running.mean(start, end), tail_running))
        self.steps.append(  # the busy shares once the batch limit is known (_summary)
            BatchStep(
                index=self._step,
                generation_s=end - start,
                tail_share=tail,
                busy_share=None,
                tail_busy_share=None,
                groups=self._step_groups,
                informative=self._step_informative,
                cancelled=cancelled,
            )
        )
        self._step += 1

    async def _poll(self) -> None:
        """The server's running gauge, held between reads (gives up with the sampler)."""
        assert self._sampler is not None
        while True:
            values = await self._sampler.sample()
            now = time.perf_counter()
            if values is None or RUNNING not in values:
                if not self._sampler.available:
                    self._server = None
                    return
            else:
                if self._server is None:
                    self._server = Occupancy(now)
                self._server.set(values[RUNNING], now)
            await asyncio.sleep(POLL_S)

    async def _read(self) -> tuple[float | None, float | None]:
        """The server's generated- and prompt-token counts (None without /metrics); the
        first read also starts the server's running gauge, so every step is measured
        alike, and takes the batch limit the server states."""
        if self._sampler is None:
            return None, None
        values = await self._sampler.sample()
        if not values:
            return None, None
        if self._server is None and RUNNING in values:
            self._server = Occupancy(time.perf_counter())
            self._server.set(values[RUNNING], time.perf_counter())
        if SIM_MAX_NUM_SEQS in values:
            self._max_num_seqs = round(values[SIM_MAX_NUM_SEQS])
        self._kv_tokens = values.get(KV_CAPACITY_TOKENS, self._kv_tokens)
        return values.get(GENERATED), values.get(PROMPTED)

    def _batch_limit(
        self, before: tuple[float | None, float | None], after: tuple[float | None, float | None]
    ) -> tuple[int, str]:
        """The busy share's denominator and what it is: the server's max_num_seqs or the
        sequences its KV cache holds (its capacity ÷ the tokens a sample took), whichever
        is fewer; else, neither known, the samples a step launches."""
        limits: list[tuple[int, str]] = []
        if self._max_num_seqs is not None:
            limits.append((self._max_num_seqs, "max_num_seqs"))
        sent = self._engine.stats.completed + self._engine.stats.failed
        sent += self._engine.stats.cancelled
        counted = [
            (a, b) for a, b in zip(after, before, strict=True) if a is not None and b is not None
        ]
        tokens = sum(a - b for a, b in counted)
        if self._kv_tokens and sent and len(counted) == 2 and tokens > 0:
            limits.append((max(1, int(self._kv_tokens * sent / tokens)), "KV cache"))
        return min(limits) if limits else (self._launched, "samples launched")

    def _summary(
        self,
        elapsed_s: float,
        before: tuple[float | None, float | None],
        after: tuple[float | None, float | None],
    ) -> BatchSummary:
        limit, limit_source = self._batch_limit(before, after)
        steps = self.steps = [
            replace(
                step,
                busy_share=None if busy is None else busy / limit,
                tail_busy_share=None if tail is None else tail / limit,
            )
            for step, (busy, tail) in zip(self.steps, self._levels, strict=True)
        ]
        stats = self._engine.stats
        wasted = None
        (generated_before, _), (generated, _) = before, after
        if generated is not None and generated_before is not None:
            wasted = max(0, round(generated - generated_before - stats.output_tokens))
        tails = [s.tail_share for s in steps if s.tail_share is not None]
        busy = [s.busy_share for s in steps if s.busy_share is not None]
        return BatchSummary(
            batch_groups=self._batch,
            over_sample=self._spec.over_sample,
            carry_over=self._carry,
            capacity=limit,
            capacity_source=limit_source,
            busy_source="server" if self._server is not None else "client",
            steps=steps,
            step_s=StageLatency.of([s.generation_s for s in steps]),
            tail_share=sum(tails) / len(tails) if tails else None,
            busy_share=sum(busy) / len(busy) if busy else None,
            informative_groups_per_s=self._informative_used / max(elapsed_s, 1e-9),
            cancelled_samples=stats.cancelled,
            cancelled_tokens=wasted,
            staleness_mean=sum(self._ages) / len(self._ages) if self._ages else None,
            staleness_max=max(self._ages) if self._ages else None,
            completed_samples=stats.completed,
            failed_samples=stats.failed,
        )
