"""The simulated server's metrics in its engine's names: Prometheus text with each of vLLM's
families renamed by the engine's `Metrics.names` (those it lacks left out), the simulator's
own `autotune_*` families in every dialect, and TensorRT-LLM's JSON iteration stats.
Why: docs/design/simulator.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from autotune.engine_model.scheduler import SimEngine
from autotune.engine_model.state import EngineStats, Histogram
from autotune.engines import Engine
from autotune.engines.description import (
    ABORTED,
    E2E,
    GENERATION_TOKENS,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    QUEUE_TIME,
    RUNNING,
    TTFT,
    WAITING,
)

Labels = list[tuple[str, str]]

# The `engine_type` label each engine's own collector writes (SGLang's scheduler; TensorRT-LLM's
# OpenAIServer, tensorrt_llm/serve/openai_server.py, leaves it "undefined").
ENGINE_TYPE = {"sglang": "unified", "trtllm": "undefined"}


@dataclass(frozen=True, slots=True)
class Served:
    """What the server as a whole has served, for its `autotune_*` counters."""

    pauses: int
    weight_updates: int


def engine_labels(engine: Engine, model_name: str, engines: int) -> list[Labels]:
    """Each engine's labels as its server writes them: vLLM's `engine="i"`; the others one
    set per server, `dp_rank` told apart where there are several (SGLang's data parallel)."""
    if engine.name == "vllm":
        return [[("engine", str(i)), ("model_name", model_name)] for i in range(engines)]
    common = [("engine_type", ENGINE_TYPE[engine.name]), ("model_name", model_name)]
    if engines == 1:
        return [common]
    return [[*common, ("dp_rank", str(i))] for i in range(engines)]


class _Text:
    """Prometheus text, one sample per engine, labels sorted as prometheus_client sorts them."""

    def __init__(self, labels: Sequence[Labels]) -> None:
        self.lines: list[str] = []
        self._labels = labels

    def metric(self, name: str, kind: str, help_: str, values: Sequence[float]) -> None:
        base = name.removesuffix("_total") if kind == "counter" else name
        self.lines.extend((f"# HELP {base} {help_} (SIMULATED)", f"# TYPE {base} {kind}"))
        self.lines.extend(
            f"{name}{{{_joined(labels)}}} {v}"
            for labels, v in zip(self._labels, values, strict=True)
        )

    def histogram(self, name: str, help_: str, hists: Sequence[Histogram]) -> None:
        self.lines.extend((f"# HELP {name} {help_} (SIMULATED)", f"# TYPE {name} histogram"))
        for labels, h in zip(self._labels, hists, strict=True):
            for bound, n in h.cumulative():
                le = "+Inf" if math.isinf(bound) else repr(bound)
                self.lines.append(f"{name}_bucket{{{_joined([*labels, ('le', le)])}}} {n}")
            self.lines.append(f"{name}_sum{{{_joined(labels)}}} {h.sum!r}")
            self.lines.append(f"{name}_count{{{_joined(labels)}}} {h.count}")

    def total(self, name: str, help_: str, value: int) -> None:
        """A counter of the whole server, unlabelled."""
        base = name.removesuffix("_total")
        self.lines.extend((f"# HELP {base} {help_} (SIMULATED)", f"# TYPE {base} counter"))
        self.lines.append(f"{name} {value}")


def _joined(labels: Labels) -> str:
    return ",".join(f'{key}="{value}"' for key, value in sorted(labels))


def prometheus_text(
    engine: Engine,
    model_name: str,
    engines: Sequence[SimEngine],
    finished: Sequence[Mapping[str, int]],
    served: Served,
) -> str:
    """/metrics in `engine`'s names: per simulated engine, its gauges, counters and
    histograms (`finished`: its requests by vLLM's finished_reason), then the simulator's
    own families, ending `autotune_simulated 1`."""
    stats = [e.stats() for e in engines]
    labels = engine_labels(engine, model_name, len(engines))
    text = _Text(labels)
    names = engine.metrics.names
    written: set[str] = set()

    def family(quantity: str, kind: str, help_: str, values: Sequence[float]) -> None:
        name = names.get(quantity)
        if name is not None and name not in written:  # one family may give two quantities
            written.add(name)
            text.metric(name, kind, help_, values)

    def histogram(quantity: str, help_: str, hists: Sequence[Histogram]) -> None:
        if quantity in names:
            text.histogram(names[quantity], help_, hists)

    family(RUNNING, "gauge", "Requests in the running batch.", [s.running for s in stats])
    family(WAITING, "gauge", "Requests waiting to be scheduled.", [s.waiting for s in stats])
    family(KV_USAGE, "gauge", "KV-cache usage, 1 means 100 percent.", [s.kv_usage for s in stats])
    family(PREEMPTIONS, "counter", "Cumulative preemptions.", [s.preemptions_total for s in stats])
    family(
        PROMPT_TOKENS,
        "counter",
        "Prefill tokens processed.",
        [s.prompt_tokens_total for s in stats],
    )
    family(
        GENERATION_TOKENS,
        "counter",
        "Generation tokens processed.",
        [s.generation_tokens_total for s in stats],
    )
    if engine.name == "vllm":
        _request_success(text, labels, finished)
    family(
        PREFIX_QUERIES,
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        [s.prefix_cache_queries_total for s in stats],
    )
    family(
        PREFIX_HITS,
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        [s.prefix_cache_hits_total for s in stats],
    )
    family(ABORTED, "counter", "Requests aborted.", [f["abort"] for f in finished])
    histogram(TTFT, "Time to first token in real seconds.", [e.ttft for e in engines])
    histogram(E2E, "End-to-end latency in real seconds.", [e.e2e_latency for e in engines])
    histogram(
        QUEUE_TIME, "Time waiting before admission, real seconds.", [e.queue_time for e in engines]
    )
    if engine.name == "vllm":
        _cache_config_info(text, engines)
    if engine.metrics.kv_capacity is not None:
        text.metric(
            engine.metrics.kv_capacity,
            "gauge",
            "Tokens the KV cache holds.",
            [e.kv_capacity for e in engines],
        )
    text.metric(  # no engine serves its batch limit; the simulator says its own
        "autotune_max_num_seqs",
        "gauge",
        "Sequences an engine batches at most (its --max-num-seqs).",
        [e.config.max_num_seqs for e in engines],
    )
    text.total("autotune_pauses_total", "Pauses served (any engine's pause).", served.pauses)
    text.total("autotune_weight_updates_total", "Weight updates served.", served.weight_updates)
    text.lines.append(
        "# HELP autotune_simulated 1: this is autotune's simulated server, not a GPU."
    )
    text.lines.append("# TYPE autotune_simulated gauge")
    text.lines.append("autotune_simulated 1")
    return "\n".join(text.lines) + "\n"


def _request_success(
    text: _Text, labels: Sequence[Labels], finished: Sequence[Mapping[str, int]]
) -> None:
    """vLLM's requests that ended, by finished_reason (its label after the others)."""
    text.lines.extend(
        (
            "# HELP vllm:request_success Requests that ended, by finished_reason (SIMULATED)",
            "# TYPE vllm:request_success counter",
        )
    )
    text.lines.extend(
        f'vllm:request_success_total{{{_joined(engine)},finished_reason="{reason}"}} {n}'
        for engine, reasons in zip(labels, finished, strict=True)
        for reason, n in reasons.items()
    )


def _cache_config_info(text: _Text, engines: Sequence[SimEngine]) -> None:
    """vLLM states each engine's KV cache size as labels of one gauge."""
    text.lines.extend(
        (
            "# HELP vllm:cache_config_info The KV cache's configuration (SIMULATED)",
            "# TYPE vllm:cache_config_info gauge",
        )
    )
    text.lines.extend(
        f'vllm:cache_config_info{{block_size="{e.config.block_size}",engine="{i}",'
        f'num_gpu_blocks="{e.kv_capacity // e.config.block_size}"}} 1.0'
        for i, e in enumerate(engines)
    )


class IterationStats:
    """TensorRT-LLM's JSON `/metrics` (cpp/tensorrt_llm/executor/jsonSerialization.cpp's
    field names): one entry per engine, its figures over the steps since the last GET."""

    def __init__(self, engines: Sequence[SimEngine], time_scale: float) -> None:
        self._engines = tuple(engines)
        self._time_scale = time_scale
        self._last = [e.stats() for e in self._engines]

    def take(self) -> list[dict[str, Any]]:
        """The entries now; the next GET's figures start from here."""
        now = [e.stats() for e in self._engines]
        entries = [
            self._entry(e, before, after)
            for e, before, after in zip(self._engines, self._last, now, strict=True)
        ]
        self._last = now
        return entries

    def _entry(self, engine: SimEngine, before: EngineStats, after: EngineStats) -> dict[str, Any]:
        steps = after.steps - before.steps
        step_s = (after.sim_time_s - before.sim_time_s) / steps if steps else 0.0
        block = engine.config.block_size
        blocks = engine.kv_capacity // block
        used = math.ceil(after.kv_usage * blocks)
        queried, hit = after.prefix_cache_queries_total, after.prefix_cache_hits_total
        prefilled = after.prefill_tokens_computed_total - before.prefill_tokens_computed_total
        return {
            "timestamp": datetime.now().strftime("%m-%d-%Y %H:%M:%S.%f"),
            "iter": after.steps,
            "iterLatencyMS": step_s * self._time_scale * 1000,
            "numActiveRequests": after.running,
            "numQueuedRequests": after.waiting,
            "numCompletedRequests": after.requests_finished_total - before.requests_finished_total,
            "maxNumActiveRequests": engine.config.max_num_seqs,
            "kvCacheStats": {
                "maxNumBlocks": blocks,
                "freeNumBlocks": blocks - used,
                "usedNumBlocks": used,
                "tokensPerBlock": block,
                "reusedBlocks": hit // block,
                "missedBlocks": (queried - hit) // block,
                "cacheHitRate": hit / queried if queried else 0.0,
            },
            "inflightBatchingStats": {
                "numScheduledRequests": after.running,
                "numContextRequests": after.running - after.decoding,
                "numGenRequests": after.decoding,
                "numPausedRequests": 0,
                "numCtxTokens": prefilled // steps if steps else 0,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 1.0,
            },
        }
