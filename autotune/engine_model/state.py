"""What an engine of the model holds: its configuration, its requests (each in one of the
states WAITING → PREFILL → DECODE → DONE or ABORTED), a prefix its cache keeps, and the
counters and latency histograms its /metrics reports.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from autotune.engine_model.perf_model import DEFAULT_COEFFICIENTS
from autotune.hardware.deployment import SimConfig
from autotune.hardware.measured import MeasuredSurface
from autotune.hardware.profiles import GpuProfile, ModelProfile, StepCoefficients


class Stepper(Protocol):
    """What a request reads of the engine that runs it: its step count, and its abort."""

    steps: int

    def abort(self, request: Request) -> None: ...


WAITING, PREFILL, DECODE, DONE, ABORTED = range(5)


TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's buckets for `vllm:time_to_first_token_seconds`."""


LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's buckets for end-to-end latency and queue time."""


class Histogram:
    """A Prometheus-style histogram: per-bucket counts, sum and count."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations ≤ bound) pairs, ending with (inf, count)."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the engine simulates. `kv_capacity_tokens` overrides the memory model's figure."""

    gpu: GpuProfile
    model: ModelProfile
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    time_scale: float = 1.0  # real seconds per simulated second; 0: as fast as possible
    kv_capacity_tokens: int | None = None
    enable_prefix_caching: bool = True  # vLLM V1's default (CacheConfig.enable_prefix_caching)
    # A replica that slows mid-run (throttling, a noisy neighbour), planted for drift tests:
    # this many real seconds after the first step, every step takes `slow_down_factor` x.
    slow_down_after_s: float | None = None
    slow_down_factor: float = 1.0
    # --replay-table: step times from a measured surface instead of the performance model
    measured: MeasuredSurface | None = None
    coefficients: StepCoefficients = DEFAULT_COEFFICIENTS  # --profile: a calibrated model's


def engine_config(config: SimConfig) -> EngineConfig:
    """One engine's configuration from the simulator's (each of its `data_parallel_size`
    engines has it)."""
    return EngineConfig(
        gpu=config.gpu,
        model=config.model,
        tp=config.tensor_parallel_size,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        time_scale=config.time_scale,
        kv_capacity_tokens=config.kv_capacity_tokens,
        enable_prefix_caching=config.enable_prefix_caching,
        slow_down_after_s=config.slow_down_after_s,
        slow_down_factor=config.slow_down_factor if config.slow_down_after_s is not None else 1.0,
        measured=config.measured,
        coefficients=config.coefficients,
    )


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's gauges and counters."""

    running: int
    decoding: int  # of the running, those generating tokens (the rest are prefilling)
    waiting: int
    kv_usage: float  # 0..1
    preemptions_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished_total: int
    steps: int
    sim_time_s: float
    prefix_cache_queries_total: int  # prompt tokens looked up, at first admission
    prefix_cache_hits_total: int  # of those, tokens reused from the cache
    prefill_tokens_computed_total: int  # prompt tokens actually run, recomputation included


class CachedPrefix:
    """A cached shared prompt prefix: `tokens` of KV, held by `refs` running requests."""

    __slots__ = ("key", "refs", "tokens")

    def __init__(self, key: Hashable, tokens: int) -> None:
        self.key = key
        self.tokens = tokens
        self.refs = 0


class Request:
    """One request inside the engine; the HTTP layer awaits its futures and polls tokens."""

    __slots__ = (
        "_engine",
        "admitted_at",
        "arrival",
        "base",
        "decode_start",
        "epoch",
        "finished",
        "first_token",
        "output_tokens",
        "prefill_done",
        "prefill_len",
        "prefix",
        "prefix_key",
        "prompt_tokens",
        "rid",
        "server_aborted",
        "shared",
        "state",
        "tokens_before",
    )

    def __init__(
        self,
        engine: Stepper,
        rid: int,
        prompt_tokens: int,
        output_tokens: int,
        prefix_key: Hashable | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._engine = engine
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefix_key = prefix_key
        self.prefix: CachedPrefix | None = None  # the cached prefix this admission holds
        self.shared = 0  # its tokens: this much of the request's KV is shared
        self.first_token: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self.arrival = loop.time()
        self.admitted_at: float | None = None
        self.state = WAITING
        self.epoch = 0
        self.tokens_before = 0  # tokens emitted before the current admission
        self.prefill_len = 0
        self.prefill_done = 0
        self.decode_start = 0  # step whose end emitted the first token of this admission
        self.base = 0  # own KV tokens after step s while decoding = base + s
        self.server_aborted = False  # ended by a pause or sleep, not by its client

    def tokens_done(self) -> int:
        """Output tokens generated so far (what a stream may have sent)."""
        if self.state == DECODE:
            done = self.tokens_before + self._engine.steps - self.decode_start + 1
            return min(done, self.output_tokens)
        if self.state == DONE:
            return self.output_tokens
        return self.tokens_before

    @property
    def done(self) -> bool:
        return self.state >= DONE

    def abort(self) -> None:
        """Drop the request (client went away); frees its KV at once."""
        self._engine.abort(self)
