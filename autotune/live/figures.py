"""The figures of a running collect, read when asked from the totals the engine keeps:
`Sources.totals`, which the summary, the stats lines and /metrics all report.
Why: docs/design/live.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.results.runs import Expectation
from autotune.results.stages import STAGES, StageSamples
from autotune.rollout.backends import CallCounters
from autotune.rollout.concurrency import AdaptiveConcurrency
from autotune.rollout.engine import Engine, GroupObserver, RunStats
from autotune.rollout.target import MeteredConnector

if TYPE_CHECKING:
    import numpy as np

    from autotune.rollout.pipeline import Pipeline

# Seconds; Prometheus' default buckets stretched to the minutes a long rollout can take.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Totals:
    """A running collect's totals at one instant, from the run's start (names as in
    LiveSample and CollectSummary)."""

    completed: int
    failed: int
    in_flight: int
    input_tokens: int
    output_tokens: int
    mean_reward: float | None
    errors_by_class: dict[str, int]
    retries_by_class: dict[str, int]
    rate_limited_responses: int
    limiter_wait_s: float  # waiting for --rpm/--tpm
    pool_wait_s: float  # getting a connection from the pool
    concurrency_limit: int | None  # the adaptive limit now; None at a fixed parallelism
    cancelled: int = 0  # samples a batch step's end cancelled (--over-sample)
    groups_complete: int | None = None  # GRPO groups (--num-repeats above 1)
    groups_informative: int | None = None
    groups_informative_tokens: int | None = None  # the informative groups' output tokens

    @property
    def informative_share(self) -> float | None:
        """Informative groups ÷ complete ones (None before the first closes)."""
        if not self.groups_complete:
            return None
        return (self.groups_informative or 0) / self.groups_complete


@dataclass(frozen=True, slots=True)
class Sources:
    """Where a running collect keeps its totals."""

    stats: RunStats
    counters: CallCounters
    limiter: AdaptiveConcurrency | None
    connector: MeteredConnector | None
    planned: int  # rollouts this run is to make (those already on disk not counted)
    groups: GroupObserver | None = None

    @classmethod
    def of(cls, engine: Engine, pipeline: Pipeline, planned: int) -> Sources:
        """Where `engine`, running on `pipeline`, keeps its totals (the pool's waits only
        where the pool is metered: a live flag was given)."""
        connector = pipeline.session.connector
        return cls(
            stats=engine.stats,
            counters=pipeline.backend.counters,
            limiter=engine.limiter,
            connector=connector if isinstance(connector, MeteredConnector) else None,
            planned=planned,
            groups=engine.groups,
        )

    def totals(self) -> Totals:
        """The run's totals now: what the summary, a stats line and a scrape report."""
        stats, counters, limiter = self.stats, self.counters, self.limiter
        return Totals(
            completed=stats.completed,
            failed=stats.failed,
            in_flight=stats.taken - stats.completed - stats.failed - stats.cancelled,
            input_tokens=stats.input_tokens,
            output_tokens=stats.output_tokens,
            mean_reward=stats.reward_sum / stats.reward_count if stats.reward_count else None,
            errors_by_class=dict(stats.errors_by_class),
            retries_by_class=dict(counters.retries),
            rate_limited_responses=counters.rate_limited_responses,
            limiter_wait_s=counters.limiter_wait_s,
            pool_wait_s=self.connector.acquire_s if self.connector is not None else 0.0,
            concurrency_limit=limiter.limit if limiter is not None else None,
            cancelled=stats.cancelled,
            groups_complete=self.groups.complete if self.groups is not None else None,
            groups_informative=self.groups.informative if self.groups is not None else None,
            groups_informative_tokens=(
                self.groups.informative_tokens if self.groups is not None else None
            ),
        )

    def straggler_ratios(self) -> Sequence[float]:
        """Each complete group's slowest sample ÷ its median one, in the order they
        closed (none when rollouts are not grouped)."""
        return self.groups.straggler_ratios if self.groups is not None else ()

    @property
    def draining(self) -> bool:
        """Every rollout has been taken: fewer than `parallelism` can be in flight from now."""
        return self.stats.taken >= self.planned


class StageHistograms:
    """Cumulative per-stage latency histograms, brought up to date at each scrape from the
    samples added since the last one (numpy: a scrape after 100k rollouts costs ~ms)."""

    def __init__(self, samples: StageSamples, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        import numpy as np  # only a run serving /metrics pays for the import

        self._np = np
        self._samples = samples
        self.bounds = bounds
        self._edges = np.array(bounds)
        self._seen = dict.fromkeys(STAGES, 0)
        self._counts: dict[str, np.ndarray] = {
            stage: np.zeros(len(bounds) + 1, dtype=np.int64) for stage in STAGES
        }
        self._sums = dict.fromkeys(STAGES, 0.0)

    def update(self) -> None:
        for stage, values in self._samples.samples.items():
            seen = self._seen[stage]
            if len(values) == seen:
                continue
            np = self._np
            new = np.frombuffer(values[seen:], dtype=np.float64)
            where = np.searchsorted(self._edges, new, side="left")  # first bound >= value
            self._counts[stage] += np.bincount(where, minlength=len(self.bounds) + 1)
            self._sums[stage] += float(new.sum())
            self._seen[stage] = seen + len(new)

    def cumulative(self, stage: str) -> tuple[list[int], float]:
        """Counts at or below each bound, then the total (the +Inf bucket); and the sum."""
        return [int(n) for n in self._np.cumsum(self._counts[stage])], self._sums[stage]


class RunState:
    """What the collector reads: the sources once the engine exists, and the drift watch."""

    def __init__(self, expectation: Expectation | None) -> None:
        self.sources: Sources | None = None
        self.histograms: StageHistograms | None = None
        self.expectation = expectation
        self.steady: tuple[float, float, float] | None = None  # rate, 95% low, high
        self.drifted = False
        self.finished = False
