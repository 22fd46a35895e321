"""The RL loop's trainer stand-in beside the rollouts (`autotune loop`, loop studies): it
trains, syncs weights and resumes generation in sync, colocated or async mode, and keeps
a ledger of every group it launched. Why: docs/design/rl.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson

from autotune.config.rl_specs import LoopSpec
from autotune.engines import ENGINES, Call, Control
from autotune.engines import Engine as ServingEngine
from autotune.errors import CollectionError, UsageError
from autotune.results.runs import LoopStep, LoopSummary
from autotune.results.stages import StageLatency, percentile
from autotune.rl.in_flight import GroupInFlight, GroupsInFlight
from autotune.rollout.backends import ModelBackend
from autotune.rollout.engine import Engine, Outcome
from autotune.rollout.store import RolloutSink
from autotune.rollout.workload import Task, WorkItem
from autotune.telemetry.prometheus import server_root
from autotune.verifiers import Verifier

LEDGER_FILE = "groups.jsonl"
Figure = tuple[str, str, str, float]  # as autotune.live.metrics reads them


def draw(duration: tuple[str, float, float], rng: random.Random) -> float:
    """One value of a `Duration` (config.py): fixed, normal (held at 0 and above), uniform."""
    kind, a, b = duration
    if kind == "normal":
        return max(0.0, rng.gauss(a, b))
    if kind == "uniform":
        return rng.uniform(a, b)
    return a


async def run_command(command: str, env: dict[str, str], what: str) -> None:
    """A user's shell command, to its end; a failing one is one sentence."""
    process = await asyncio.create_subprocess_shell(
        command,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await process.communicate()
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    if process.returncode:
        last = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise CollectionError(
            f"the {what} command {command!r} exited with status {process.returncode} "
            f"({last[0][:200]}); the rollouts so far are kept: fix the command and rerun."
        )


class GroupLedger:
    """groups.jsonl: one line per launched group, its fate and the step that took it."""

    def __init__(self, path: Path | None) -> None:
        self._handle: IO[bytes] | None = path.open("ab") if path is not None else None

    def write(self, group: GroupInFlight, fate: str, **fields: Any) -> None:
        if self._handle is not None:
            line = {"group": group.index, "samples": group.size, "version": group.version}
            self._handle.write(orjson.dumps({**line, "fate": fate, **fields}) + b"\n")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


class ServerControl:
    """The server's pause, resume, sleep and weight endpoints as its engine spells them
    (engines/known.py: vLLM's, SGLang's), each timed; the engine is told by which
    endpoints it serves. A server with none is paused from the client's side (no new
    request is sent)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._root = server_root(base_url)
        self.engine: ServingEngine | None = None  # the engine whose endpoints it serves
        self._model_path: str | None = None  # SGLang reloads weights from it
        self.pauses = False  # the server serves a pause and a resume (else the client pauses)

    async def probe(self, spec: LoopSpec) -> None:
        """What the server serves, looked at before the first step, so a mode it cannot
        run is refused at once. A vLLM that sleeps but has no pause API (its dev mode
        without it) still sleeps; the client's side pauses it."""
        heard_sleeping = False  # found by its sleep state: it sleeps, no need to ask again
        for engine in ENGINES.values():
            endpoints = engine.control
            if endpoints.serves is not None and await self._serves(endpoints.serves):
                self.engine, self.pauses = engine, endpoints.pause is not None
                break
            if endpoints.sleeping is not None and await self._serves(endpoints.sleeping):
                self.engine, heard_sleeping = engine, True
                break
        control = self.engine.control if self.engine is not None else None
        if self.pauses and control is not None and spec.pause_mode not in control.pause_modes:
            modes = ", ".join(control.pause_modes)
            raise UsageError(
                f"--pause-mode {spec.pause_mode} is not one {self._title} has "
                f"(it pauses with {modes}); pick one of those."
            )
        if spec.mode == "colocated" and not (heard_sleeping or await self._sleeps()):
            enable = (control or ENGINES["vllm"].control).enable
            raise UsageError(
                f"the colocated mode puts the server at {self._root} to sleep while the "
                f"trainer trains, which it does not serve: {enable}, or pick --mode sync "
                "or async."
            )
        if spec.sync_via_server and (control is None or control.update_weights is None):
            raise UsageError(
                f"--sync-via-server needs the server's weight update, which the server at "
                f"{self._root} does not serve (vLLM: VLLM_SERVER_DEV_MODE=1; SGLang serves "
                "it): use --sync-s or --sync-command."
            )
        if control is not None and control.update_from_disk and spec.sync_via_server:
            self._model_path = await self._served_model_path()
            if self._model_path is None:
                raise UsageError(
                    f"--sync-via-server reloads the weights from the served model's path, "
                    f"which {self._root}/get_model_info did not give: use --sync-s or "
                    "--sync-command."
                )

    async def _sleeps(self) -> bool:
        control = self.engine.control if self.engine is not None else None
        if control is None or control.sleep is None:
            return False
        return control.sleeping is None or await self._serves(control.sleeping)

    async def _served_model_path(self) -> str | None:
        try:
            async with self._session.get(self._root + "/get_model_info") as response:
                info = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        path = info.get("model_path") if isinstance(info, dict) else None
        return path if isinstance(path, str) else None

    async def _serves(self, path: str) -> bool:
        try:
            async with self._session.get(self._root + path) as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    async def pause(self, mode: str, clear_cache: bool) -> float:
        """The engine's pause in autotune's `mode`; 0 where the client's side pauses. An
        engine that flushes its cache only when idle (SGLang) flushes after an abort."""
        if not self.pauses:
            return 0.0
        control = self._control
        took = await self.call(control.pause_call(mode, clear_cache))
        if clear_cache and control.flush_needs_idle and mode == "abort":
            took += await self.call(Call(control.reset_cache or ""))
        return took

    async def resume(self) -> float:
        if not self.pauses or self._control.resume is None:
            return 0.0
        return await self.call(Call(self._control.resume, body=self._control.resume_body))

    async def reset_cache(self) -> None:
        """The prefix cache cleared where the engine allows it now: not on one that flushes
        only when idle (SGLang: after an abort pause, and its weight update flushes)."""
        control = self._control
        if self.pauses and control.reset_cache is not None and not control.flush_needs_idle:
            await self.call(Call(control.reset_cache))

    async def sleep(self, level: int, mode: str) -> float:
        return await self.call(self._control.sleep_call(level, mode))

    async def wake_up(self) -> float:
        return await self.call(self._control.wake_call())

    async def update_weights(self) -> float:
        control = self._control
        assert control.update_weights is not None  # probe() refused a server without it
        body = {"model_path": self._model_path} if control.update_from_disk else control.update_body
        return await self.call(Call(control.update_weights, body=body))

    @property
    def _control(self) -> Control:
        return self.engine.control if self.engine is not None else CLIENT_SIDE

    @property
    def _title(self) -> str:
        return self.engine.title if self.engine is not None else "this server"

    async def call(self, call: Call) -> float:
        """POST `call`; the seconds its answer took."""
        started = time.perf_counter()
        path = call.path
        try:
            async with self._session.post(
                self._root + path, json=call.body, params=dict(call.query)
            ) as answer:
                text = await answer.text()
                if answer.status >= 400:
                    raise CollectionError(
                        f"the server refused POST {path} (HTTP {answer.status}: "
                        f"{text.strip()[:200]}); the rollouts so far are kept."
                    )
        except aiohttp.ClientError as error:
            raise CollectionError(
                f"POST {path} to {self._root} failed ({error}); the rollouts so far are kept: "
                "restart the server and rerun."
            ) from None
        return time.perf_counter() - started


CLIENT_SIDE = Control(serves=None)  # a server with no RL endpoints


class LoopRunner:
    """Runs the trainer stand-in and the generator beside it; see the module docstring."""

    def __init__(
        self,
        engine: Engine,
        control: ServerControl,
        spec: LoopSpec,
        group_size: int,
        parallelism: int | None,
        ledger: GroupLedger,
        seed: int = 0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._engine = engine
        engine.annotate = self.annotate  # each row: the version its sample was sent under
        self._control = control
        self._spec = spec
        self._size = group_size
        self._ledger = ledger
        self._rng = random.Random(seed)
        self._say = say  # a line a step, for the person watching
        self.steps: list[LoopStep] = []
        self.finished = False
        self.version = 0
        self._open = asyncio.Event()  # the generator may send requests
        self._open.set()
        self._changed = asyncio.Event()  # a group ended or the gate moved
        self._outstanding = 0  # groups started and not yet trained on, dropped or failed
        self._groups = GroupsInFlight(parallelism)
        self._sent_under: dict[tuple[int, int], int] = {}  # a sample in flight → its version
        self._ready: deque[GroupInFlight] = deque()
        self._in_flight = 0
        self._idle_since: float | None = None
        self._idle_s = 0.0
        self._busy_since = 0.0
        self._generating: list[tuple[float, float]] = []  # spans with a sample in flight
        self._aborted = 0
        self._failed_samples = 0
        self._output_tokens = 0
        self._started = 0.0

    async def run(self, tasks: Sequence[Task], identity: dict[str, Any]) -> LoopSummary:
        """`spec.steps` trainer steps on groups of `tasks`' prompts (one every
        `group_size` tasks, cycled), summarised; `identity`: model, base_url, simulated,
        output."""
        await self._control.probe(self._spec)
        self._started = time.perf_counter()
        started_at = time.time()
        self._idle_since = self._started
        generator = asyncio.create_task(self._generate(_groups(tasks, self._size)))
        try:
            steps = await self._train(generator)
        finally:
            self.finished = True
            generator.cancel()
            cancelled = await self._cancel_running()
            await asyncio.gather(generator, return_exceptions=True)
            if not self._open.is_set() and self._control.pauses:
                await asyncio.shield(self._resume_quietly())
        elapsed = time.perf_counter() - self._started
        untrained = 0
        for group in self._ready:
            self._ledger.write(group, "untrained")
            untrained += group.size
        if self._idle_since is not None:  # idle since the last sample ended
            self._idle_s += self._started + elapsed - self._idle_since
        totals = {
            "generating": self._generating,
            "started_at": started_at,
            "elapsed_s": elapsed,
            "generator_idle_s": self._idle_s,
            "aborted": self._aborted,
            "failed": self._failed_samples,
            "cancelled": cancelled,
            "untrained": untrained,
            "output_tokens": self._output_tokens,
        }
        source = "server" if self._control.pauses else "client"
        return summarise(self._spec, self._size, source, steps, totals, identity)

    # -- the generator ---------------------------------------------------------------------

    async def _generate(self, groups: Iterator[tuple[int, list[WorkItem]]]) -> None:
        for index, items in groups:
            while not (self._open.is_set() and self._outstanding < self._spec.ahead):
                self._changed.clear()
                await self._changed.wait()
            if self._engine.stats.stopped_early:
                return
            self._outstanding += 1
            self._groups.launch(GroupInFlight(index, len(items), len(items)), items, self._sample)

    async def _sample(self, group: GroupInFlight, item: WorkItem) -> None:
        while True:
            await self._open.wait()  # paused: a sample waits (an aborted one is sent again)
            async with self._groups.slot():
                version = self.version
                group.version = version if group.version is None else min(group.version, version)
                key = (item.task.index, item.rollout_index)
                self._sent_under[key] = version
                self._in_flight_by(+1)
                try:
                    outcome: Outcome = await self._engine.one(item)
                finally:
                    self._in_flight_by(-1)
                    del self._sent_under[key]
            if outcome.failure_class != "aborted":
                break
            self._aborted += 1
        group.pending -= 1
        if outcome.failure_class is not None:
            group.failed = True
            self._failed_samples += 1
        else:
            self._output_tokens += outcome.output_tokens
        if group.pending:
            return
        self._groups.end(group.index)
        if group.failed:
            self._outstanding -= 1
            self._ledger.write(group, "failed")
        else:
            self._ready.append(group)
        self._changed.set()

    def figures(self) -> list[Figure]:
        """The loop's figures now, for `--metrics-port` (read at scrape time)."""
        steps = self.steps
        return [
            ("autotune_loop_finished", "gauge", "1 once the loop has ended.", self.finished),
            ("autotune_loop_steps", "counter", "Trainer steps done.", len(steps)),
            ("autotune_loop_policy_version", "gauge", "Weight syncs made.", self.version),
            ("autotune_loop_trained_samples", "counter", "Samples trained on.",
             sum(s.samples for s in steps)),
            ("autotune_loop_dropped_stale_samples", "counter",
             "Samples dropped as older than --max-staleness.",
             sum(s.dropped_stale for s in steps)),
            ("autotune_loop_aborted_samples", "counter",
             "Samples a pause aborted (each sent again).", self._aborted),
            ("autotune_loop_failed_samples", "counter", "Samples that failed.",
             self._failed_samples),
            ("autotune_loop_samples_in_flight", "gauge", "Samples sent, not yet ended.",
             self._in_flight),
            ("autotune_loop_groups_ready", "gauge", "Complete groups waiting for the trainer.",
             len(self._ready)),
            ("autotune_loop_trainer_wait_seconds", "counter",
             "Seconds the trainer waited for a batch.", sum(s.wait_s for s in steps)),
            ("autotune_loop_sync_seconds", "counter", "Seconds from a sync's pause to its resume.",
             sum(s.sync_end - s.sync_start for s in steps)),
        ]  # fmt: skip

    def annotate(self, item: WorkItem) -> dict[str, int]:
        """The `_autotune` fields of a row: the policy version its sample was sent under."""
        return {"policy_version": self._sent_under.get((item.task.index, item.rollout_index), -1)}

    def _in_flight_by(self, change: int) -> None:
        """Count a sample in or out of flight; the generator idles while none is."""
        now = time.perf_counter()
        if self._in_flight == 0 and self._idle_since is not None:
            self._idle_s += now - self._idle_since
            self._idle_since = None
            self._busy_since = now
        self._in_flight += change
        if self._in_flight == 0:
            self._idle_since = now
            self._generating.append((self._busy_since - self._started, now - self._started))

    async def _cancel_running(self) -> int:
        cancelled, groups = await self._groups.cancel()
        for group in groups:
            self._ledger.write(group, "cancelled")
        return cancelled

    # -- the trainer -----------------------------------------------------------------------

    async def _train(self, generator: asyncio.Task[None]) -> list[LoopStep]:
        spec, steps = self._spec, self.steps
        for index in range(spec.steps):
            waited_from = self._now()
            batch, dropped = await self._take(generator)
            ready = self._now()
            synchronous = spec.mode != "async"
            if synchronous:
                self._open.clear()  # nothing is generated while the trainer works
            staleness = [self.version - (g.version or 0) for g in batch]
            for group, behind in zip(batch, staleness, strict=True):
                self._ledger.write(group, "trained", step=index, staleness=behind)
            self._outstanding -= len(batch)
            self._changed.set()
            pause_s = 0.0
            if spec.mode == "colocated":
                pause_s = await self._control.sleep(spec.sleep_level, spec.pause_mode)
            train_start = self._now()
            samples = sum(g.size for g in batch)
            await self._train_step(index, samples)
            train_end = self._now()
            if spec.mode == "colocated":
                resume_s = await self._control.wake_up()
                sync_start = self._now()
                transfer_s = await self._transfer(index)
                await self._clear_cache()
            else:
                sync_start = train_end
                self._open.clear()
                pause_s = await self._pause()
                transfer_s = await self._transfer(index)
                resume_s = await self._resume()
            self.version += 1
            self._open.set()
            self._changed.set()
            sync_end = self._now()
            steps.append(
                LoopStep(
                    index=index,
                    version=self.version - 1,
                    batch_ready_at=ready,
                    wait_s=ready - waited_from,
                    train_start=train_start,
                    train_end=train_end,
                    sync_start=sync_start,
                    sync_end=sync_end,
                    pause_s=pause_s,
                    resume_s=resume_s,
                    transfer_s=transfer_s,
                    samples=samples,
                    dropped_stale=dropped,
                    staleness=staleness,
                )
            )
            if self._say is not None:
                self._say(step_line(steps[-1], spec.steps))
        return steps

    async def _take(self, generator: asyncio.Task[None]) -> tuple[list[GroupInFlight], int]:
        """The next B complete groups, oldest first, dropping those past --max-staleness."""
        spec, dropped = self._spec, 0
        while True:
            if spec.max_staleness is not None:
                for group in [g for g in self._ready if self._behind(g) > spec.max_staleness]:
                    self._ready.remove(group)
                    self._outstanding -= 1
                    dropped += group.size
                    self._ledger.write(group, "stale", staleness=self._behind(group))
                    self._changed.set()
            if len(self._ready) >= spec.batch_groups:
                return [self._ready.popleft() for _ in range(spec.batch_groups)], dropped
            stopped = self._engine.stats.stopped_early
            if stopped or generator.done():
                if generator.done() and not generator.cancelled():
                    generator.result()  # its error, if it failed
                raise CollectionError(
                    f"the loop stopped: {stopped or 'no more groups'}; the rollouts so far "
                    "are kept: restart the server and rerun."
                )
            self._changed.clear()
            await self._changed.wait()

    def _behind(self, group: GroupInFlight) -> int:
        return self.version - (group.version or 0)

    async def _train_step(self, index: int, samples: int) -> None:
        spec = self._spec
        if spec.train_command is None:
            await asyncio.sleep(draw(spec.train_s, self._rng))
            return
        env = {
            "AUTOTUNE_STEP": str(index),
            "AUTOTUNE_POLICY_VERSION": str(self.version),
            "AUTOTUNE_BATCH_SAMPLES": str(samples),
        }
        await run_command(spec.train_command, env, "training step's")

    async def _transfer(self, index: int) -> float:
        spec, started = self._spec, time.perf_counter()
        if spec.sync_via_server:
            await self._control.update_weights()
        elif spec.sync_command is not None:
            env = {"AUTOTUNE_STEP": str(index), "AUTOTUNE_POLICY_VERSION": str(self.version + 1)}
            await run_command(spec.sync_command, env, "weight sync's")
        else:
            await asyncio.sleep(draw(spec.sync_s, self._rng))
        return time.perf_counter() - started

    async def _pause(self) -> float:
        return await self._control.pause(self._spec.pause_mode, self._spec.clear_cache)

    async def _clear_cache(self) -> None:
        if self._spec.clear_cache:
            await self._control.reset_cache()

    async def _resume(self) -> float:
        if self._spec.pause_mode == "keep":  # the pause kept the cache for the frozen requests
            await self._clear_cache()
        return await self._control.resume()

    async def _resume_quietly(self) -> None:
        with contextlib.suppress(CollectionError):  # the server is gone: nothing to resume
            await self._control.resume()

    def _now(self) -> float:
        return time.perf_counter() - self._started


def step_line(step: LoopStep, steps: int) -> str:
    """One step for the person watching: what the trainer waited, trained and synced."""
    behind = sorted(set(step.staleness))
    stale = "/".join(map(str, behind))
    dropped = f", {step.dropped_stale} dropped as stale" if step.dropped_stale else ""
    trained, synced = step.train_end - step.train_start, step.sync_end - step.sync_start
    return (
        f"step {step.index + 1}/{steps}: waited {step.wait_s:.2f} s, trained {trained:.2f} s, "
        f"synced {synced:.2f} s; {step.samples} samples {stale} versions old{dropped}"
    )


def _groups(tasks: Sequence[Task], group_size: int) -> Iterator[tuple[int, list[WorkItem]]]:
    """Groups without end: every `group_size`-th task is a prompt, cycled; each group gets
    its own index (its rows' `_ng_task_index`), so a prompt sent again is another group."""
    prompts = tasks[::group_size]
    for index in itertools.count():
        task = replace(prompts[index % len(prompts)], index=index)
        yield index, [WorkItem(task, sample) for sample in range(group_size)]


def summarise(
    spec: LoopSpec,
    group_size: int,
    pause_source: str,
    steps: list[LoopStep],
    totals: dict[str, Any],
    identity: dict[str, Any],
) -> LoopSummary:
    """The loop's figures from its steps and totals; `identity`: model, base_url,
    simulated, output."""
    elapsed = totals["elapsed_s"]
    trained = sum(s.samples for s in steps)
    sync_s = sum(s.sync_end - s.sync_start for s in steps)
    if spec.mode == "colocated":
        sync_s += sum(s.pause_s for s in steps)  # the sleep before training
    histogram: dict[str, int] = {}
    per_sample: list[float] = []
    for step in steps:
        share = step.samples // max(1, len(step.staleness))
        for behind in step.staleness:
            histogram[str(behind)] = histogram.get(str(behind), 0) + share
            per_sample.extend([float(behind)] * share)
    return LoopSummary(
        mode=spec.mode,
        batch_groups=spec.batch_groups,
        group_size=group_size,
        pause_mode=spec.pause_mode,
        pause_source=pause_source,
        max_ahead=spec.ahead,
        max_staleness=spec.max_staleness,
        started_at=totals["started_at"],
        elapsed_s=elapsed,
        steps=steps,
        trained_samples=trained,
        trained_samples_per_s=trained / elapsed if elapsed > 0 else 0.0,
        trainer_idle_share=sum(s.wait_s for s in steps) / elapsed if elapsed > 0 else 0.0,
        generator_idle_share=totals["generator_idle_s"] / elapsed if elapsed > 0 else 0.0,
        sync_share=sync_s / elapsed if elapsed > 0 else 0.0,
        staleness_histogram=dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
        staleness_p50=percentile(per_sample, 50),
        staleness_p95=percentile(per_sample, 95),
        staleness_max=int(max(per_sample)) if per_sample else None,
        dropped_stale_samples=sum(s.dropped_stale for s in steps),
        aborted_samples=totals["aborted"],
        failed_samples=totals["failed"],
        cancelled_samples=totals["cancelled"],
        untrained_samples=totals["untrained"],
        pause_s=StageLatency.of([s.pause_s for s in steps]),
        resume_s=StageLatency.of([s.resume_s for s in steps]),
        output_tokens=totals["output_tokens"],
        generating=totals["generating"],
        **identity,
    )


async def run_on_server(
    backend: ModelBackend,
    verifier: Verifier,
    session: aiohttp.ClientSession,
    base_url: str,
    tasks: Sequence[Task],
    spec: LoopSpec,
    group_size: int,
    identity: dict[str, Any],
) -> LoopSummary:
    """The loop on a running server, nothing saved: a loop study's trial."""
    engine = Engine(backend, verifier, RolloutSink(None, resume=False), parallelism=1)
    control = ServerControl(session, base_url)
    runner = LoopRunner(engine, control, spec, group_size, None, GroupLedger(None))
    return await runner.run(tasks, identity)
