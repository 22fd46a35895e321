"""Several replicas of one model behind one run: which replica gets the next call (fewest
outstanding calls, with prompt affinity) and which is out of rotation. Pure; no I/O.
Why: docs/design/rollout.md.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from autotune.results.stages import ReplicaStats
from autotune.telemetry.prometheus import replica_key

DOWN_AFTER = 3
"""Connection failures in a row that take a replica out of rotation."""

RETRY_AFTER_S = 5.0
"""How long a replica out of rotation waits before one call tries it again."""

AFFINITY_KEYS = 4096
"""Affinity keys remembered (least recently used forgotten first)."""


@dataclass(slots=True)
class Replica:
    """One replica's place in the rotation and what it has done this run."""

    index: int
    url: str
    gpus: tuple[int, ...] = ()  # the GPUs it runs on, when known
    outstanding: int = 0
    completed: int = 0
    failed: int = 0
    latency_sum_s: float = 0.0
    output_tokens: int = 0
    failures_in_a_row: int = 0
    down_since: float | None = None
    down_reason: str | None = None
    times_down: int = 0
    failures_by_class: dict[str, int] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return self.down_since is None

    def snapshot(self) -> ReplicaCounts:
        return ReplicaCounts(
            self.index,
            self.url,
            self.completed,
            self.failed,
            self.latency_sum_s,
            self.output_tokens,
            self.up,
            self.times_down,
            self.down_reason,
        )


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    """A replica's counters at one instant; two of them make a window's figures."""

    index: int
    url: str
    completed: int
    failed: int
    latency_sum_s: float
    output_tokens: int
    up: bool
    times_down: int
    down_reason: str | None

    def plus(self, other: ReplicaCounts) -> ReplicaCounts:
        """Two windows' calls together (state as of this one)."""
        return ReplicaCounts(
            self.index,
            self.url,
            self.completed + other.completed,
            self.failed + other.failed,
            self.latency_sum_s + other.latency_sum_s,
            self.output_tokens + other.output_tokens,
            self.up,
            self.times_down + other.times_down,
            self.down_reason,
        )

    def with_calls(self, ends: Iterable[CallEnd]) -> ReplicaCounts:
        """These counts with this replica's calls among `ends` in place of its own: a
        window's calls told by when each ended, not by two snapshots taken near it."""
        mine = [end for end in ends if end.replica == self.index]
        done = [end for end in mine if end.ok]
        return replace(
            self,
            completed=len(done),
            failed=len(mine) - len(done),
            latency_sum_s=sum(end.latency_s for end in done),
            output_tokens=sum(end.output_tokens for end in done),
        )

    def since(self, earlier: ReplicaCounts) -> ReplicaCounts:
        """The calls made between `earlier` and this snapshot (state as of this one)."""
        return ReplicaCounts(
            self.index,
            self.url,
            self.completed - earlier.completed,
            self.failed - earlier.failed,
            self.latency_sum_s - earlier.latency_sum_s,
            self.output_tokens - earlier.output_tokens,
            self.up,
            self.times_down - earlier.times_down,
            self.down_reason,
        )


@dataclass(frozen=True, slots=True)
class CallEnd:
    """A call that ended on a replica, as `ReplicaSet.on_call` hears of it."""

    replica: int
    ok: bool
    latency_s: float = 0.0
    output_tokens: int = 0


class ReplicaSet:
    """The rotation. `acquire()` picks a replica and counts the call outstanding; every
    acquire is matched by exactly one `succeeded()` or `failed()`."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        gpus: Sequence[Sequence[int]] = (),
        affinity_slack: int = 2,
        affinity_share: float = 0.25,
        down_after: int = DOWN_AFTER,
        retry_after_s: float = RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("a replica set needs at least one URL")
        if gpus and len(gpus) != len(urls):
            raise ValueError("give each replica its GPUs, or none")
        self.replicas = [
            Replica(i, url, tuple(gpus[i]) if gpus else ()) for i, url in enumerate(urls)
        ]
        self.affinity_slack = affinity_slack
        self.affinity_share = affinity_share
        self.down_after = down_after
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._affinity: OrderedDict[Hashable, int] = OrderedDict()
        self.on_call: Callable[[CallEnd], None] | None = None  # see `calls_heard`

    def __len__(self) -> int:
        return len(self.replicas)

    def acquire(self, key: Hashable | None = None, avoid: Replica | None = None) -> Replica:
        """The replica for the next call; `avoid` (the one a retried call just failed on)
        only when no other is in rotation. With every replica down, the one down longest
        is tried (the caller's retries then decide whether the run goes on)."""
        if len(self.replicas) == 1:  # the common case, on every call: nothing to choose
            only = self.replicas[0]
            only.outstanding += 1
            return only
        candidates = self._in_rotation()
        if avoid is not None and len(candidates) > 1:
            candidates = [r for r in candidates if r is not avoid]
        least = min(candidates, key=lambda r: (r.outstanding, r.index))
        chosen = least
        if key is not None and len(candidates) > 1:
            index = self._affinity.get(key)
            if index is not None:
                preferred = self.replicas[index]
                slack = max(self.affinity_slack, self.affinity_share * least.outstanding)
                if preferred in candidates and preferred.outstanding <= least.outstanding + slack:
                    chosen = preferred
            self._affinity[key] = chosen.index
            self._affinity.move_to_end(key)
            if len(self._affinity) > AFFINITY_KEYS:
                self._affinity.popitem(last=False)
        chosen.outstanding += 1
        return chosen

    def _in_rotation(self) -> list[Replica]:
        up = [r for r in self.replicas if r.up]
        now = self._clock()
        due = [
            r
            for r in self.replicas
            if not r.up and now - (r.down_since or 0.0) >= self.retry_after_s
        ]
        if due:  # one trial call; until it succeeds the replica stays down, with a new clock
            trial = min(due, key=lambda r: r.down_since or 0.0)
            trial.down_since = now
            return [trial]
        if up:
            return up
        return [min(self.replicas, key=lambda r: r.down_since or 0.0)]

    def succeeded(self, replica: Replica, latency_s: float, output_tokens: int) -> None:
        replica.outstanding -= 1
        replica.completed += 1
        replica.latency_sum_s += latency_s
        replica.output_tokens += output_tokens
        replica.failures_in_a_row = 0
        if self.on_call is not None:
            self.on_call(CallEnd(replica.index, True, latency_s, output_tokens))
        if not replica.up:
            replica.down_since = None
            replica.down_reason = None

    def abandoned(self, replica: Replica) -> None:
        """A call given up before it ended (the run stopped): neither success nor failure."""
        replica.outstanding -= 1

    def failed(self, replica: Replica, failure_class: str, reason: str) -> None:
        """A failed call; a connection that cannot be made or was cut counts towards
        taking the replica out of rotation, an HTTP error from a live server does not."""
        replica.outstanding -= 1
        replica.failed += 1
        replica.failures_by_class[failure_class] = (
            replica.failures_by_class.get(failure_class, 0) + 1
        )
        if self.on_call is not None:
            self.on_call(CallEnd(replica.index, False))
        if failure_class != "connection":
            replica.failures_in_a_row = 0
            return
        replica.failures_in_a_row += 1
        if replica.up and replica.failures_in_a_row >= self.down_after:
            replica.down_since = self._clock()
            replica.down_reason = reason
            replica.times_down += 1

    def snapshot(self) -> list[ReplicaCounts]:
        return [replica.snapshot() for replica in self.replicas]

    def up_besides(self, replica: Replica) -> bool:
        """Whether another replica is in rotation to take a call this one failed."""
        return any(other.up for other in self.replicas if other is not replica)


@contextmanager
def calls_heard(
    replicas: ReplicaSet | None, clock: Callable[[], float] = time.time
) -> Iterator[list[tuple[float, CallEnd]]]:
    """Every call that ends on `replicas` meanwhile, with the time it ended on `clock`
    (wall-clock, as a probe's completions are timed): a window's calls, known only once
    the window has ended."""
    heard: list[tuple[float, CallEnd]] = []
    if replicas is None:
        yield heard
        return
    replicas.on_call = lambda end: heard.append((clock(), end))
    try:
        yield heard
    finally:
        replicas.on_call = None


def several(replicas: ReplicaSet | None) -> ReplicaSet | None:
    """`replicas` when there are several to tell apart, else None: a lone replica's
    figures are the run's own, so nothing is read or reported per replica."""
    return replicas if replicas is not None and len(replicas) > 1 else None


SERVER_GAUGES = {
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
}
SERVER_COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}
GPU_READINGS = {"util_pct": "util_pct", "mem_used_gib": "mem_used_gib", "power_w": "power_w"}


def replica_stats(
    counts: Sequence[ReplicaCounts],
    replicas: Sequence[Replica],
    measured_s: float,
    telemetry: Mapping[str, Mapping[str, float]],
) -> list[ReplicaStats]:
    """Each replica's figures over `measured_s` seconds: the client's `counts` of calls,
    and from `telemetry` (a summary keyed "source/metric") its /metrics, gauges as means
    and counters as increases, and NVML over its GPUs (means)."""
    out = []
    seconds = max(measured_s, 1e-9)
    for count, replica in zip(counts, replicas, strict=True):
        server: dict[str, float] = {}
        for name, metric in SERVER_GAUGES.items():
            if (found := telemetry.get(f"server/{replica_key(count.index, metric)}")) is not None:
                server[name] = found["mean"]
        for name, metric in SERVER_COUNTERS.items():
            if (found := telemetry.get(f"server/{replica_key(count.index, metric)}")) is not None:
                server[name] = found.get("delta", 0.0)
        gpu: dict[str, float] = {}
        for name, suffix in GPU_READINGS.items():
            readings = [
                found["mean"]
                for index in replica.gpus
                if (found := telemetry.get(f"gpu/gpu{index}_{suffix}")) is not None
            ]
            if readings:
                gpu[name] = sum(readings) / len(readings)
        out.append(
            ReplicaStats(
                index=count.index,
                url=count.url,
                completed=count.completed,
                failed=count.failed,
                calls_per_s=count.completed / seconds,
                output_tokens_per_s=count.output_tokens / seconds,
                mean_latency_s=count.latency_sum_s / count.completed if count.completed else None,
                up=count.up,
                times_down=count.times_down,
                down_reason=count.down_reason,
                server=server,
                gpus=list(replica.gpus),
                gpu=gpu,
            )
        )
    return out
