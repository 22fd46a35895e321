"""Continuous batching planned like vLLM V1's scheduler: `SimEngine` runs engine steps in
scaled real time behind the simulated server, or in virtual time when a probe steps it.
How a step is planned and what it costs: docs/design/engine-model.md.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import OrderedDict, deque
from collections.abc import Hashable
from types import TracebackType

from autotune.engine_model.perf_model import step_time_s
from autotune.engine_model.state import (
    ABORTED,
    DECODE,
    DONE,
    LATENCY_BUCKETS,
    PREFILL,
    TTFT_BUCKETS,
    WAITING,
    CachedPrefix,
    EngineConfig,
    EngineStats,
    Histogram,
    Request,
)
from autotune.hardware.memory import kv_capacity_tokens

MIN_SLEEP_S = 0.001
"""Real time owed before the engine sleeps; shorter sleeps cost more than they are worth."""


MAX_CATCH_UP_S = 0.05
"""How far the engine may run ahead without sleeping after the event loop made it late."""


class SimEngine:
    """The simulated engine; use `async with SimEngine(cfg) as engine:` then `submit()`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.kv_capacity = config.kv_capacity_tokens or kv_capacity_tokens(
            config.gpu, config.model, config.tp, config.gpu_memory_utilization, config.block_size
        )
        self._half_block = config.block_size // 2
        self._waiting: deque[tuple[int, Request]] = deque()
        self._n_waiting = 0
        self._running: dict[int, Request] = {}  # insertion order = admission order
        self._prefilling: deque[tuple[int, Request]] = deque()
        self._finish_heap: list[tuple[int, int, int, Request]] = []
        self._kv_prefill = 0  # own KV reserved by sequences not yet decoding
        self._decode_base = 0  # Σ base over decoding sequences
        self._decode_shared = 0  # Σ shared prefix tokens over decoding sequences
        self._n_decode = 0
        self._caching = config.enable_prefix_caching
        self._prefixes: dict[Hashable, CachedPrefix] = {}
        self._released: OrderedDict[Hashable, CachedPrefix] = OrderedDict()  # held by nobody, LRU
        self._shared_used = 0  # Σ tokens of held prefixes (counted once)
        self._cached_free = 0  # Σ tokens of prefixes held by nobody (free, evictable)
        self._next_rid = 0
        self._wakeup = asyncio.Event()
        self._paused: str | None = None  # "new": admit nothing; "all": step nothing
        self._frozen = 0  # weight loads under way: no step runs
        self._stepping = False  # a planned step has not ended yet
        self.sleeping: int | None = None  # the level it sleeps at; None awake
        self._task: asyncio.Task[None] | None = None
        self._debt = 0.0
        self._last_real = 0.0
        self.steps = 0
        self.sim_time_s = 0.0
        self.preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished_total = 0
        self.prefix_cache_queries_total = 0
        self.prefix_cache_hits_total = 0
        self.prefill_tokens_computed_total = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e_latency = Histogram(LATENCY_BUCKETS)
        self.queue_time = Histogram(LATENCY_BUCKETS)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def aclose(self) -> None:
        """Stop stepping and cancel every pending request's futures."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # not `await task`: a cancel of our caller must propagate
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        self._cancel_pending()

    def _cancel_pending(self) -> None:
        for req in [r for _, r in self._waiting] + list(self._running.values()):
            req.first_token.cancel()
            req.finished.cancel()

    async def __aenter__(self) -> SimEngine:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- requests --------------------------------------------------------------------------

    def max_request_tokens(self) -> int:
        """The largest prompt + output one request may have and still fit the KV cache."""
        return self.kv_capacity - self._half_block

    def submit(
        self, prompt_tokens: int, output_tokens: int, prefix_key: Hashable | None = None
    ) -> Request:
        """Queue a request; raises ValueError if it could never fit the KV cache.

        Requests with the same `prefix_key` must have the same prompt; they share its
        cached prefix (see the module docstring)."""
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must both be at least 1")
        if prompt_tokens + output_tokens > self.max_request_tokens():
            raise ValueError(
                f"request of {prompt_tokens + output_tokens} tokens exceeds the KV cache "
                f"({self.kv_capacity} tokens)"
            )
        req = Request(self, self._next_rid, prompt_tokens, output_tokens, prefix_key)
        self._next_rid += 1
        self._waiting.append((0, req))
        self._n_waiting += 1
        self._wakeup.set()
        return req

    def abort(self, req: Request, by_server: bool = False) -> None:
        """Drop `req`: its client went away (its futures are cancelled), or `by_server` a
        pause in abort mode ended it (they resolve: the answer ends `finish_reason:
        abort`, with the tokens made so far)."""
        if req.state == WAITING:
            self._n_waiting -= 1
        elif req.state == PREFILL:
            del self._running[req.rid]
            self._kv_prefill -= req.prefill_len + 1 - req.shared
        elif req.state == DECODE:
            req.tokens_before = req.tokens_done()
            del self._running[req.rid]
            self._n_decode -= 1
            self._decode_base -= req.base
            self._decode_shared -= req.shared
        else:
            return
        self._release(req)
        req.state = ABORTED
        req.epoch += 1
        if by_server:
            req.server_aborted = True
            for future in (req.first_token, req.finished):
                if not future.done():
                    future.set_result(None)
        else:
            req.first_token.cancel()
            req.finished.cancel()

    # -- RL weight syncs: pause, resume, caches, weight loads ----------------------------

    @property
    def paused(self) -> bool:
        return self._paused is not None

    async def pause(self, mode: str) -> None:
        """vLLM's pause_generation (and SGLang's): every mode queues new requests until
        `resume`; `abort` ends the requests inside (their answers end `finish_reason:
        abort`), `wait` lets the running ones finish and returns when they have, `keep`
        freezes them where they are (no step runs, so no token comes) until `resume`,
        `retract` (SGLang's) sends them back to the waiting queue with their KV freed,
        each a preemption, to be prefilled again after `resume`."""
        if mode == "abort":
            inside = [r for e, r in self._waiting if r.epoch == e and r.state == WAITING]
            for req in (*inside, *self._running.values()):
                self.abort(req, by_server=True)
        self._paused = "all" if mode in ("keep", "retract") else "new"
        self._wakeup.set()
        while self._stepping or (mode == "wait" and self._running):  # the step under way ends
            await asyncio.sleep(MIN_SLEEP_S)
        if mode == "retract" and self._paused == "all":  # not resumed meanwhile
            while self._running:
                self._preempt_last()
            self._paused = "new"

    def resume(self) -> None:
        self._paused = None
        self._wakeup.set()

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix no running request holds (new weights make them wrong)."""
        self._evict_released(0)

    async def sleep(self, level: int, mode: str, offload_s: float) -> None:
        """vLLM's sleep: pause in `mode`; from level 1 the KV cache is discarded (every
        cached prefix goes, a request kept by `keep` must recompute its prompt and output
        on wake-up) and the weights leave the GPU, which takes `offload_s` simulated
        seconds at level 1 (a copy to the host) and none at level 2 (dropped)."""
        await self.pause(mode)
        if level >= 1:
            while self._running:
                self._preempt_last()
            self.reset_prefix_cache()
            if level == 1:
                await self.busy(offload_s)
        self.sleeping = level

    async def wake_up(self, load_s: float) -> None:
        """Weights back on the GPU (`load_s` simulated seconds from level 1 or 2), then
        requests run again."""
        if self.sleeping:
            await self.busy(load_s)
        self.sleeping = None
        self.resume()

    async def busy(self, seconds: float) -> None:
        """The engine does something other than stepping for `seconds` simulated seconds
        (a weight load or copy): no step runs meanwhile, as in vLLM, whose workers are
        busy with it."""
        self._frozen += 1
        try:
            await asyncio.sleep(seconds * self.config.time_scale)
            self.sim_time_s += seconds
        finally:
            self._frozen -= 1
            self._wakeup.set()

    # -- gauges ----------------------------------------------------------------------------

    def _kv_used(self) -> int:
        """KV tokens held by running sequences (free cached prefixes not included)."""
        decode_tokens = self._decode_base + self._n_decode * self.steps
        own = self._kv_prefill + decode_tokens + len(self._running) * self._half_block
        return own + self._shared_used

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._n_waiting

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            decoding=self._n_decode,
            waiting=self._n_waiting,
            kv_usage=min(1.0, self._kv_used() / self.kv_capacity),
            preemptions_total=self.preemptions_total,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            requests_finished_total=self.requests_finished_total,
            steps=self.steps,
            sim_time_s=self.sim_time_s,
            prefix_cache_queries_total=self.prefix_cache_queries_total,
            prefix_cache_hits_total=self.prefix_cache_hits_total,
            prefill_tokens_computed_total=self.prefill_tokens_computed_total,
        )

    # -- prefix cache ----------------------------------------------------------------------

    def _hold(self, req: Request, prefix: CachedPrefix) -> None:
        """`req` now reads `prefix`; a prefix nobody held moves from free to used KV."""
        if not prefix.refs:
            del self._released[prefix.key]
            self._cached_free -= prefix.tokens
            self._shared_used += prefix.tokens
        prefix.refs += 1
        req.prefix, req.shared = prefix, prefix.tokens

    def _release(self, req: Request) -> None:
        """Drop `req`'s hold; a prefix nobody holds stays cached in free space (LRU)."""
        prefix, req.prefix, req.shared = req.prefix, None, 0
        if prefix is None:
            return
        prefix.refs -= 1
        if not prefix.refs:
            self._shared_used -= prefix.tokens
            self._cached_free += prefix.tokens
            self._released[prefix.key] = prefix

    def _publish(self, req: Request) -> None:
        """`req`'s prompt is now scheduled in full: cache its shareable blocks, which it
        holds from here on (its own KV shrinks by as much)."""
        key = req.prefix_key
        if req.prefix is not None or key in self._prefixes:
            return
        bs = self.config.block_size
        tokens = (req.prompt_tokens - 1) // bs * bs
        if tokens:
            prefix = self._prefixes[key] = CachedPrefix(key, tokens)
            prefix.refs = 1
            req.prefix, req.shared = prefix, tokens
            self._kv_prefill -= tokens
            self._shared_used += tokens

    def _evict(self, headroom: int) -> None:
        """Evict free cached prefixes, least recently released first, until used KV,
        `headroom` and what stays cached fit the cache."""
        self._evict_released(self.kv_capacity - self._kv_used() - headroom)

    def _evict_released(self, keep: int) -> None:
        """Evict free cached prefixes, least recently released first, until at most
        `keep` tokens of them stay."""
        while self._cached_free > keep and self._released:
            _, prefix = self._released.popitem(last=False)
            del self._prefixes[prefix.key]
            self._cached_free -= prefix.tokens

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        finally:  # also on a bug: never leave a client awaiting a future that cannot finish
            self._cancel_pending()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.config.time_scale
        self._last_real = loop.time()
        slow_after, slow_factor = self.config.slow_down_after_s, self.config.slow_down_factor
        slow_from: float | None = None  # loop time the planted slowdown begins
        while True:
            if self._frozen or self._paused == "all":
                await self._idle()
                continue
            if not self._running and not self._n_waiting:
                await self._idle()
                continue
            planned = self.plan_step()
            if planned is None:  # nothing can run: paused, admitting no new request
                await self._idle()
                continue
            duration, decodes, completing = planned
            self._stepping = True
            if slow_after is not None:
                if slow_from is None:
                    slow_from = loop.time() + slow_after
                if loop.time() >= slow_from:
                    duration *= slow_factor
            if scale > 0:
                now = loop.time()
                self._debt += duration * scale - (now - self._last_real)
                self._last_real = now
                self._debt = max(self._debt, -MAX_CATCH_UP_S)
                if self._debt >= MIN_SLEEP_S:
                    await asyncio.sleep(self._debt)
                    now = loop.time()
                    self._debt -= now - self._last_real
                    self._last_real = now
                else:
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(0)
            self.end_step(duration, decodes, completing, loop.time())
            self._stepping = False

    async def _idle(self) -> None:
        """Wait for something to run; the time waited is owed to nobody (an engine that
        sat paused must not catch up on it by running steps without their time)."""
        self._wakeup.clear()
        await self._wakeup.wait()
        self._debt = 0.0
        self._last_real = asyncio.get_running_loop().time()

    def _preempt_last(self) -> None:
        """Recompute-mode preemption of the most recently admitted running sequence."""
        _, req = self._running.popitem()
        if req.state == DECODE:
            req.tokens_before = req.tokens_done()
            self._n_decode -= 1
            self._decode_base -= req.base
            self._decode_shared -= req.shared
        else:
            self._kv_prefill -= req.prefill_len + 1 - req.shared
        self._release(req)
        req.state = WAITING
        req.epoch += 1
        self._waiting.appendleft((req.epoch, req))
        self._n_waiting += 1
        self.preemptions_total += 1

    def plan_step(self) -> tuple[float, int, list[tuple[int, Request]]] | None:
        """The next step (its duration, decodes, prefills it completes), or None when
        nothing can run; the engine's own task runs it, and a virtual clock stepping
        several engines in turn (probe/virtual.py) calls it and `end_step` directly."""
        cfg = self.config
        cap = self.kv_capacity
        while self._n_decode and self._kv_used() + self._n_decode > cap:
            self._preempt_last()
        decodes = self._n_decode
        context = self._decode_base + decodes * self.steps + self._decode_shared
        budget = cfg.max_num_batched_tokens - decodes
        prefill_tokens = 0
        completing: list[tuple[int, Request]] = []

        pf = self._prefilling
        while pf and budget > 0:
            epoch, req = pf[0]
            if req.epoch != epoch or req.state != PREFILL:
                pf.popleft()
                continue
            chunk = min(req.prefill_len - req.prefill_done, budget)
            req.prefill_done += chunk
            context += req.prefill_done
            budget -= chunk
            prefill_tokens += chunk
            if req.prefill_done < req.prefill_len:
                break
            pf.popleft()
            completing.append((epoch, req))
            if self._caching and req.prefix_key is not None:
                self._publish(req)

        waiting = self._waiting
        now: float | None = None
        admitting = self._paused is None
        while (
            admitting and self._n_waiting and budget > 0 and len(self._running) < cfg.max_num_seqs
        ):
            epoch, req = waiting[0]
            if req.epoch != epoch or req.state != WAITING:
                waiting.popleft()
                continue
            length = req.prompt_tokens + req.tokens_before
            if (
                req.prefix_key is not None
                and self._caching
                and (prefix := self._prefixes.get(req.prefix_key)) is not None
            ):
                hit = prefix.tokens
                revived = 0 if prefix.refs else hit  # leaves free space: counts as used
            else:
                prefix, hit, revived = None, 0, 0
            own = length - hit + 1
            if self._kv_used() + decodes + own + revived + self._half_block > cap:
                break
            waiting.popleft()
            self._n_waiting -= 1
            req.state = PREFILL
            req.prefill_len = length
            self._kv_prefill += own
            if prefix is not None:
                self._hold(req, prefix)
            self._running[req.rid] = req
            if req.admitted_at is None:
                if now is None:
                    now = asyncio.get_running_loop().time()
                req.admitted_at = now
                self.queue_time.observe(now - req.arrival)
                self.prompt_tokens_total += req.prompt_tokens
                if self._caching:
                    self.prefix_cache_queries_total += req.prompt_tokens
                    self.prefix_cache_hits_total += hit
            chunk = min(length - hit, budget)
            req.prefill_done = hit + chunk
            context += req.prefill_done
            budget -= chunk
            prefill_tokens += chunk
            if req.prefill_done < length:
                pf.append((req.epoch, req))
            else:
                completing.append((req.epoch, req))
                if self._caching and req.prefix_key is not None:
                    self._publish(req)

        if not decodes and not prefill_tokens:
            return None
        if self._cached_free:
            self._evict(decodes)
        self.prefill_tokens_computed_total += prefill_tokens
        if cfg.measured is not None:
            duration = cfg.measured.step_s(decodes, prefill_tokens)
        else:
            duration = step_time_s(
                cfg.gpu, cfg.model, cfg.tp, decodes, prefill_tokens, context, cfg.coefficients
            )
        return duration, decodes, completing

    def end_step(
        self, duration: float, decodes: int, completing: list[tuple[int, Request]], now: float
    ) -> None:
        """The planned step has taken `duration` simulated seconds (`now` on the event
        loop's clock): its tokens are out, finished requests resolve."""
        step = self.steps + 1
        self.steps = step
        self.sim_time_s += duration
        emitted = decodes
        heap = self._finish_heap
        for epoch, req in completing:
            if req.epoch != epoch or req.state != PREFILL:
                continue  # aborted while the step ran
            req.state = DECODE
            req.decode_start = step
            req.base = req.prefill_len + 1 - step - req.shared
            self._kv_prefill -= req.prefill_len + 1 - req.shared
            self._decode_base += req.base
            self._decode_shared += req.shared
            self._n_decode += 1
            heapq.heappush(
                heap, (step + req.output_tokens - req.tokens_before - 1, req.rid, epoch, req)
            )
            emitted += 1
            if req.tokens_before == 0:
                if not req.first_token.done():  # an awaiting task may have been cancelled
                    req.first_token.set_result(None)
                self.ttft.observe(now - req.arrival)
        self.generation_tokens_total += emitted
        while heap and heap[0][0] <= step:
            _, _, epoch, req = heapq.heappop(heap)
            if req.epoch != epoch or req.state != DECODE:
                continue
            req.state = DONE
            del self._running[req.rid]
            self._n_decode -= 1
            self._decode_base -= req.base
            if req.prefix is not None:
                self._decode_shared -= req.shared
                self._release(req)
            self.requests_finished_total += 1
            self.e2e_latency.observe(now - req.arrival)
            if not req.finished.done():
                req.finished.set_result(None)
