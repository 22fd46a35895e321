"""Rate limits: the sliding-window test server, the AIMD concurrency limit, the engine's
gate (retries included), collect backing off, and diagnose's `rate-limited` verdict."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from autotune.collector.collect_job import collect
from autotune.config.collection import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.rollout.backends import CallCounters, Generation
from autotune.rollout.concurrency import MIN_ROUND_TRIP_S, AdaptiveConcurrency
from autotune.rollout.engine import Engine
from autotune.rollout.store import RolloutSink
from autotune.rollout.workload import Task, WorkItem, synthetic_tasks
from autotune.servers.launcher import ServerSpec, free_port
from tests.helpers import REPO, ServeApp, autotune, server_process
from tests.rate_limit import MODEL, SlidingWindowLimit, rate_limited_app

# -- the test server's limit -----------------------------------------------------------------


def test_the_window_admits_its_limit_then_refuses() -> None:
    limit = SlidingWindowLimit(3)
    assert [limit.admit(0.1 * i) for i in range(5)] == [True, True, True, False, False]
    assert limit.admit(1.35)  # of the window (0.35, 1.35], only the refusal at 0.4 is left
    assert (limit.admitted, limit.refused) == (4, 2)


def test_refused_attempts_keep_the_window_full() -> None:
    limit = SlidingWindowLimit(2)
    assert limit.admit(0.0) and limit.admit(0.1)
    for i in range(10):  # a retry storm: every attempt refused, and every one counted
        assert not limit.admit(0.5 + 0.1 * i)
    assert not limit.admit(1.45)  # the refused attempts since 0.45 still fill it
    assert limit.admit(2.5)


def test_the_window_can_be_shorter_than_a_second() -> None:
    limit = SlidingWindowLimit(10, window_s=0.2)  # 2 attempts per 0.2 s
    assert [limit.admit(t) for t in (0.0, 0.05, 0.1, 0.26)] == [True, True, False, True]


# -- the AIMD limit ----------------------------------------------------------------------------


def test_a_refusal_halves_the_limit_once_per_round_trip() -> None:
    limiter = AdaptiveConcurrency(64)
    limiter.overloaded(now=10.0)
    assert limiter.limit == 32
    for i in range(20):  # the rest of the burst: refusals of calls sent before the cut
        limiter.overloaded(now=10.0 + i * 0.04)
    assert (limiter.limit, limiter.decreases) == (32, 1)
    limiter.overloaded(now=10.0 + MIN_ROUND_TRIP_S)
    assert (limiter.limit, limiter.decreases, limiter.lowest) == (16, 2, 16)


def test_the_limit_never_falls_below_one() -> None:
    limiter = AdaptiveConcurrency(5)
    for second in range(10):
        limiter.overloaded(now=float(second))
    assert limiter.limit == limiter.lowest == 1


def test_the_round_trip_is_the_smoothed_call_time_but_at_least_a_second() -> None:
    limiter = AdaptiveConcurrency(8)
    limiter.succeeded(0.003, now=0.0)
    assert limiter.round_trip_s == MIN_ROUND_TRIP_S
    for _ in range(50):
        limiter.succeeded(4.0, now=0.0)
    assert 3.9 < limiter.round_trip_s <= 4.0
    limiter.overloaded(now=100.0)
    limiter.overloaded(now=102.0)  # within one (4 s) round trip of the cut
    assert limiter.limit == 4


def test_successes_add_one_per_limit_many_at_most_once_per_round_trip() -> None:
    limiter = AdaptiveConcurrency(8)
    limiter.overloaded(now=0.0)
    assert limiter.limit == 4
    for _ in range(10):  # plenty of successes, but within a round trip of the cut
        limiter.succeeded(0.01, now=0.5)
    assert limiter.limit == 4
    limiter.succeeded(0.01, now=1.0)
    assert limiter.limit == 5
    for _ in range(4):  # 4 of the 5 the new limit needs
        limiter.succeeded(0.01, now=2.5)
    assert limiter.limit == 5
    limiter.succeeded(0.01, now=2.5)
    assert limiter.limit == 6


def test_the_limit_never_grows_above_the_parallelism() -> None:
    limiter = AdaptiveConcurrency(3)
    for second in range(1, 20):
        for _ in range(5):
            limiter.succeeded(0.01, now=float(second))
    assert limiter.limit == 3
    limiter.overloaded(now=100.0)
    for second in range(101, 120):
        for _ in range(5):
            limiter.succeeded(0.01, now=float(second))
    assert limiter.limit == 3 and limiter.lowest == 1


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        AdaptiveConcurrency(0)


async def test_the_gate_holds_calls_above_the_limit_first_come_first_served() -> None:
    limiter = AdaptiveConcurrency(2)
    await limiter.acquire()
    await limiter.acquire()
    order: list[int] = []

    async def call(n: int) -> None:
        await limiter.acquire()
        order.append(n)

    waiting = [asyncio.create_task(call(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert order == [] and limiter.in_flight == 2
    limiter.release()
    await asyncio.sleep(0)
    assert order == [0]
    limiter.overloaded()  # 2 → 1 with 2 in flight: releases free no slot until below 1
    limiter.release()
    await asyncio.sleep(0)
    assert order == [0] and limiter.in_flight == 1
    limiter.release()
    await asyncio.sleep(0)
    assert order == [0, 1]
    for task in waiting:
        task.cancel()


async def test_a_cancelled_waiter_gives_no_slot_away() -> None:
    limiter = AdaptiveConcurrency(1)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    limiter.release()
    assert limiter.in_flight == 0
    await limiter.acquire()
    assert limiter.in_flight == 1


async def test_a_retry_above_the_limit_gives_its_slot_up_and_queues() -> None:
    limiter = AdaptiveConcurrency(4)
    for _ in range(4):
        await limiter.acquire()
    limiter.overloaded()  # 4 → 2 with 4 in flight
    retry = asyncio.create_task(limiter.requeue())
    await asyncio.sleep(0)
    assert not retry.done() and limiter.in_flight == 3
    limiter.release()
    limiter.release()  # 1 in flight besides the queued retry: it goes
    await asyncio.sleep(0)
    assert retry.done() and limiter.in_flight == 2
    await limiter.requeue()  # at the limit, not above it: keeps its slot
    assert limiter.in_flight == 2


# -- the engine's gate --------------------------------------------------------------------------


class NoVerifier:
    name = "none"
    capacity: int | None = None

    async def verify(self, row: dict[str, object]) -> dict[str, object]:
        return {"reward": 1.0}

    async def aclose(self) -> None:
        pass


class RefusingBackend:
    """Refuses every attempt for `open_after_s` from the first one (counting each as a
    429), then answers; a refused call sleeps `backoff_s` and passes `before_retry`, as
    OpenAIBackend does. Timed from the first attempt, not from construction: on a busy
    machine the engine may start later than the window would last."""

    model = "fake"

    def __init__(self, open_after_s: float, backoff_s: float = 0.02) -> None:
        self.counters = CallCounters()
        self.open_after_s = open_after_s
        self.open_at: float | None = None
        self.backoff_s = backoff_s
        self.sending = 0
        self.most_sending_after_refusals = 0
        self.refused = 0

    async def generate(self, task: Task) -> Generation:
        attempt = 0
        if self.open_at is None:
            self.open_at = time.monotonic() + self.open_after_s
        while True:
            attempt += 1
            self.sending += 1
            if self.refused:
                self.most_sending_after_refusals = max(
                    self.most_sending_after_refusals, self.sending
                )
            start = time.time()
            await asyncio.sleep(0.002)
            self.sending -= 1
            if time.monotonic() >= self.open_at:
                return Generation("42", [], 3, 1, "stop", "", start, None, time.time(), attempt)
            self.refused += 1
            self.counters.rate_limited_responses += 1
            await asyncio.sleep(self.backoff_s)
            await self.counters.before_retry()


def work(count: int) -> list[WorkItem]:
    return [WorkItem(t, 0) for t in synthetic_tasks(SyntheticWorkload(num_tasks=count))]


async def test_retries_pass_the_adaptive_limit_instead_of_storming() -> None:
    backend = RefusingBackend(open_after_s=0.2)
    engine = Engine(backend, NoVerifier(), RolloutSink(None, False), 16, adaptive_concurrency=True)
    stats = await engine.run(iter(work(64)))
    assert stats.completed == 64 and stats.failed == 0
    limiter = engine.limiter
    assert limiter is not None
    assert limiter.decreases == 1  # a whole burst of refusals, within one round trip
    assert backend.most_sending_after_refusals <= 8  # retries held to the halved limit
    assert backend.counters.retry_gate is None  # the backend is left as it was found


class RetriesHeldBackend:
    """Refuses every call's first attempt (a 429), then holds each retry until `width`
    retries are out at once. An engine that lets every slot retry gets all its answers
    together; one that holds retries to fewer waits out `hang_s`, and `most_retrying` says
    how many it let through. Counted, not timed: a busy machine's pace cannot change it."""

    model = "fake"

    def __init__(self, width: int, hang_s: float = 30.0) -> None:
        self.counters = CallCounters()
        self.width = width
        self.hang_s = hang_s
        self.retrying = 0
        self.most_retrying = 0
        self.all_retrying = asyncio.Event()

    async def generate(self, task: Task) -> Generation:
        start = time.time()
        await asyncio.sleep(0)  # the refused attempt's round trip
        self.counters.rate_limited_responses += 1
        await self.counters.before_retry()
        self.retrying += 1
        self.most_retrying = max(self.most_retrying, self.retrying)
        if self.retrying >= self.width:
            self.all_retrying.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_retrying.wait(), self.hang_s)
        self.retrying -= 1
        return Generation("42", [], 3, 1, "stop", "", start, None, time.time(), 2)


async def test_a_probe_engine_keeps_its_fixed_parallelism() -> None:
    backend = RetriesHeldBackend(width=16)
    engine = Engine(backend, NoVerifier(), RolloutSink(None, False), 16)
    stats = await engine.run(iter(work(32)))
    assert engine.limiter is None and stats.completed == 32
    assert backend.most_retrying == 16  # every slot's retry out at once


@pytest.mark.slow
async def test_collect_backs_off_a_rate_limit_and_reports_it(
    serve_app: ServeApp, tmp_path: Path
) -> None:
    url = await serve_app(rate_limited_app(SlidingWindowLimit(20)))
    config = CollectConfig(
        target=TargetConfig(base_url=f"{url}/v1", model=MODEL),
        synthetic=SyntheticWorkload(num_tasks=80),
        parallelism=32,
        output=tmp_path / "rollouts.jsonl",
        progress=False,
    )
    summary = await collect(config)
    assert summary.completed + summary.failed == 80
    assert summary.rate_limited_responses > 0
    assert summary.concurrency_decreases >= 1
    assert summary.concurrency_limit_min is not None and summary.concurrency_limit_min < 32
    assert summary.concurrency_limit_final is not None
    few = SyntheticWorkload(num_tasks=5)
    fixed = await collect(replace(config, adaptive_concurrency=False, synthetic=few, output=None))
    assert fixed.concurrency_limit_min is None and fixed.concurrency_decreases == 0


# -- diagnose --------------------------------------------------------------------------------


@pytest.mark.measures
@pytest.mark.slow
def test_diagnose_says_rate_limited_with_the_rate_it_measured() -> None:
    """The rate it accepts within ±20% of the limit. A sliding window of 1 s admits its 15
    in a burst, so a window of T seconds may hold up to 15 × (T + 1) admissions: blocks
    of 2-4 s read 17.6-18 a second; blocks of up to 8 s read 16.2-16.3."""
    port = free_port()
    command = [sys.executable, "-m", "tests.rate_limit", "--limit", "15", "--port", str(port)]
    spec = replace(ServerSpec.local(command, port, startup_timeout_s=30), cwd=REPO)
    with server_process(spec) as base_url:
        result = autotune(
            "diagnose", "--base-url", base_url, "--model", MODEL, "--low", "2", "--high", "16",
            "--min-s", "8", "--max-s", "16", "--json", timeout=180,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    verdict = orjson.loads(result.stdout)["verdict"]
    assert verdict["verdict"] == "rate-limited"
    assert "out of memory" not in verdict["next_step"]
    accepted = re.search(r"accepts about ([\d.]+) requests/s", verdict["next_step"])
    assert accepted is not None, verdict["next_step"]
    assert 12 <= float(accepted.group(1)) <= 18  # the limit is 15 a second
