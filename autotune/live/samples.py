"""`--stats-every` and `--report`: a LiveSample of the run every interval, its totals and
the interval's throughput and latency percentiles. Why: docs/design/live.md.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from autotune.errors import CollectionError
from autotune.live.figures import Sources
from autotune.results.runs import CollectSummary, DriftWarning, LiveSample
from autotune.results.stages import STAGES, StageLatency


def stats_path(output: Path) -> Path:
    """`out.jsonl` → `out_stats.jsonl`, beside it."""
    return output.with_name(f"{output.stem}_stats.jsonl")


class Sampler:
    """Takes LiveSamples: totals from the sources, window figures since the previous one."""

    def __init__(self, sources: Sources, at: float) -> None:
        self._sources = sources
        self._at0 = at  # time.time() when the engine started
        self._cuts = dict.fromkeys(STAGES, 0)
        self._last_t = 0.0
        self._last_completed = 0
        self._last_output_tokens = 0
        self._last_informative = 0
        self._last_informative_tokens = 0
        self._stragglers_cut = 0

    def take(
        self,
        now: float,
        *,
        steady: tuple[float, float, float] | None = None,
        drift: DriftWarning | None = None,
        summary: CollectSummary | None = None,
    ) -> LiveSample:
        """The sample at `now` (a perf_counter reading)."""
        stats = self._sources.stats
        totals = self._sources.totals()
        t = now - stats.started
        window = max(t - self._last_t, 1e-9)
        latency = {}
        for stage, values in stats.samples.samples.items():
            latency[stage] = StageLatency.of(values[self._cuts[stage] :])
            self._cuts[stage] = len(values)
        ratios = self._sources.straggler_ratios()
        stragglers = StageLatency.of(ratios[self._stragglers_cut :])
        self._stragglers_cut = len(ratios)
        sample = LiveSample(
            at=self._at0 + t,
            t_s=t,
            completed=totals.completed,
            failed=totals.failed,
            in_flight=totals.in_flight,
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            mean_reward=totals.mean_reward,
            errors_by_class=totals.errors_by_class,
            retries_by_class=totals.retries_by_class,
            rate_limited_responses=totals.rate_limited_responses,
            limiter_wait_s=totals.limiter_wait_s,
            pool_wait_s=totals.pool_wait_s,
            concurrency_limit=totals.concurrency_limit,
            window_s=window,
            window_rollouts_per_s=(totals.completed - self._last_completed) / window,
            window_output_tokens_per_s=(totals.output_tokens - self._last_output_tokens) / window,
            window_latency_s=latency,
            steady_rollouts_per_s=steady,
            cancelled=totals.cancelled,
            groups_complete=totals.groups_complete,
            groups_informative=totals.groups_informative,
            groups_informative_tokens=totals.groups_informative_tokens,
            groups_informative_share=totals.informative_share,
            window_informative_groups_per_s=None
            if totals.groups_informative is None
            else (totals.groups_informative - self._last_informative) / window,
            window_informative_tokens_per_s=None
            if totals.groups_informative_tokens is None
            else (totals.groups_informative_tokens - self._last_informative_tokens) / window,
            window_straggler_ratio=None if totals.groups_complete is None else stragglers,
            drift=drift,
            summary=summary,
        )
        self._last_t, self._last_completed = t, totals.completed
        self._last_output_tokens = totals.output_tokens
        self._last_informative = totals.groups_informative or 0
        self._last_informative_tokens = totals.groups_informative_tokens or 0
        return sample


class StatsFile:
    """`<output>_stats.jsonl`, appended to (a resumed run adds its own lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._handle = path.open("ab", buffering=0)  # one write a line, on disk at once
        except OSError as error:
            raise self._error(error) from None

    def write(self, sample: LiveSample) -> None:
        try:
            self._handle.write(orjson.dumps(sample.to_dict(), option=orjson.OPT_APPEND_NEWLINE))
        except OSError as error:
            raise self._error(error) from None

    def close(self) -> None:
        self._handle.close()

    def _error(self, error: OSError) -> CollectionError:
        return CollectionError(
            f"cannot write run stats to {self.path} ({error.strerror or error}); every rollout "
            "is kept: free space (or drop --stats-every) and rerun with --resume."
        )
