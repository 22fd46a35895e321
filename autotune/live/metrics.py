"""`collect --metrics-port`: the run's figures as Prometheus metrics, read at scrape time.
Imported only when the flag is given. Why: docs/design/live.md.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from autotune.errors import UsageError
from autotune.live.figures import RunState
from autotune.results.stages import STAGES


class RunCollector(Collector):
    """The prometheus_client Collector of one collect run."""

    def __init__(self, state: RunState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        yield GaugeMetricFamily(
            "autotune_collect_finished",
            "1 once the run has ended and these figures are final.",
            value=float(state.finished),
        )
        if state.expectation is not None:
            yield GaugeMetricFamily(
                "autotune_expected_rollouts_per_second_low",
                "The drift watch's floor: the low end of the expected throughput.",
                value=state.expectation.low,
            )
            yield GaugeMetricFamily(
                "autotune_drift_warning",
                "1 once steady-state throughput stayed below the expectation (see the log).",
                value=float(state.drifted),
            )
        if state.steady is not None:
            yield GaugeMetricFamily(
                "autotune_steady_state_rollouts_per_second",
                "Rollouts/s in the last whole drift window (the probes' steady-state estimate).",
                value=state.steady[0],
            )
        sources, histograms = state.sources, state.histograms
        if sources is None or histograms is None:
            return  # the server and the engine are still starting
        totals = sources.totals()
        yield GaugeMetricFamily(
            "autotune_rollouts_planned",
            "Rollouts this run is to make (those already on disk not counted).",
            value=sources.planned,
        )
        yield CounterMetricFamily(
            "autotune_rollouts_completed", "Rollouts verified and written.", value=totals.completed
        )
        failed = CounterMetricFamily(
            "autotune_rollouts_failed", "Rollouts that failed, by class.", labels=["failure_class"]
        )
        for name, count in sorted(totals.errors_by_class.items()):
            failed.add_metric([name], count)
        yield failed
        yield GaugeMetricFamily(
            "autotune_rollouts_in_flight", "Rollouts begun and not yet ended.", totals.in_flight
        )
        yield CounterMetricFamily(
            "autotune_rollouts_cancelled",
            "Samples cancelled when their batch step ended (--over-sample).",
            value=totals.cancelled,
        )
        if totals.groups_complete is not None:
            yield CounterMetricFamily(
                "autotune_groups_completed",
                "GRPO groups whose every sample completed with a reward.",
                value=totals.groups_complete,
            )
            yield CounterMetricFamily(
                "autotune_groups_informative",
                "Completed groups whose rewards differ (RL goodput counts these).",
                value=totals.groups_informative or 0,
            )
            yield CounterMetricFamily(
                "autotune_groups_informative_output_tokens",
                "Output tokens of the informative groups (RL goodput in tokens).",
                value=totals.groups_informative_tokens or 0,
            )
            share = totals.informative_share
            yield GaugeMetricFamily(
                "autotune_groups_informative_share",
                "Informative groups ÷ completed groups (NaN before the first completes).",
                value=math.nan if share is None else share,
            )
            yield straggler_histogram(sources.straggler_ratios())
        yield CounterMetricFamily(
            "autotune_input_tokens", "Prompt tokens of completed rollouts.", totals.input_tokens
        )
        yield CounterMetricFamily(
            "autotune_output_tokens", "Output tokens of completed rollouts.", totals.output_tokens
        )
        reward = totals.mean_reward
        yield GaugeMetricFamily(
            "autotune_reward_mean",
            "Mean reward of the rollouts that have one (NaN before the first).",
            value=math.nan if reward is None else reward,
        )
        retries = CounterMetricFamily(
            "autotune_model_retries", "Model calls re-sent, by class.", labels=["failure_class"]
        )
        for name, count in sorted(totals.retries_by_class.items()):
            retries.add_metric([name], count)
        yield retries
        yield CounterMetricFamily(
            "autotune_rate_limited_responses",
            "HTTP 429 answers, every attempt counted.",
            value=totals.rate_limited_responses,
        )
        yield CounterMetricFamily(
            "autotune_limiter_wait_seconds",
            "Seconds model calls waited for the --rpm/--tpm limiter.",
            value=totals.limiter_wait_s,
        )
        yield CounterMetricFamily(
            "autotune_connection_pool_wait_seconds",
            "Seconds model calls took to get a connection: waiting for a free one, or opening one.",
            value=totals.pool_wait_s,
        )
        if totals.concurrency_limit is not None:
            yield GaugeMetricFamily(
                "autotune_concurrency_limit",
                "The adaptive limit on model calls in flight (lowered on 429/503).",
                value=totals.concurrency_limit,
            )
        histograms.update()
        latency = HistogramMetricFamily(
            "autotune_stage_latency_seconds",
            "Per-rollout latency of each stage: queue, model, ttft (time to first token), "
            "tool (multi-turn rollouts' tool calls), verify_wait, verify, total.",
            labels=["stage"],
        )
        bounds = [repr(b) for b in histograms.bounds] + ["+Inf"]
        for stage in STAGES:
            counts, total = histograms.cumulative(stage)
            latency.add_metric([stage], list(zip(bounds, counts, strict=True)), sum_value=total)
        yield latency


# A group's slowest sample ÷ its median one: 1 is no straggler, 10 a tenfold tail.
STRAGGLER_BUCKETS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


def straggler_histogram(ratios: Sequence[float]) -> HistogramMetricFamily:
    """Every complete group's straggler ratio, as a cumulative histogram."""
    import numpy as np  # only a run serving /metrics pays for the import

    ordered = np.sort(np.asarray(ratios, dtype=np.float64))
    counts = np.searchsorted(ordered, STRAGGLER_BUCKETS, side="right").tolist()
    family = HistogramMetricFamily(
        "autotune_group_straggler_ratio",
        "Each completed group's slowest sample time ÷ its median one (1: no straggler).",
    )
    buckets = [(repr(b), int(c)) for b, c in zip(STRAGGLER_BUCKETS, counts, strict=True)]
    family.add_metric([], [*buckets, ("+Inf", len(ordered))], sum_value=float(ordered.sum()))
    return family


Figure = tuple[str, str, str, float]  # name, "counter" or "gauge", help, value


class FiguresCollector(Collector):
    """Metrics from a function of the moment's figures (the RL loop's runner gives one):
    it is called at scrape time, so nothing is counted twice."""

    def __init__(self, figures: Callable[[], Sequence[Figure]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        for name, kind, help_text, value in self._figures():
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield family(name, help_text, value=value)


@asynccontextmanager
async def serve_metrics(collector: Collector, host: str, port: int) -> AsyncIterator[Scrapes]:
    """`http://host:port/metrics` for the block, built by `collector` at each scrape (a
    collect's RunCollector, the loop's LoopCollector); a port that cannot be bound is one
    sentence."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    scrapes = Scrapes()

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(registry)
        scrapes.served()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as error:
            raise UsageError(
                f"--metrics-port {port} cannot be served on {host} "
                f"({error.strerror or error}); pick a free port with --metrics-port, "
                "or stop what listens there."
            ) from None
        yield scrapes
    finally:
        await runner.cleanup()


class Scrapes:
    """Counts scrapes, so the run can wait for one that reads its final figures."""

    def __init__(self) -> None:
        self.count = 0
        self._event = asyncio.Event()

    def served(self) -> None:
        self.count += 1
        self._event.set()

    async def next(self, timeout_s: float) -> bool:
        """Wait for the next scrape, at most `timeout_s`; True if one came."""
        self._event.clear()
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
