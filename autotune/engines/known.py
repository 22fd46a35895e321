"""The three engines autotune knows, each fact checked against the engine's own source
(docs/engines.md says which parts of it)."""

from __future__ import annotations

from autotune.engines.description import (
    ABORTED,
    E2E,
    GENERATION_TOKENS,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    QUANTITIES,
    QUEUE_TIME,
    RUNNING,
    TTFT,
    WAITING,
    Control,
    Dialect,
    Engine,
    Metrics,
)

# Sampling fields beyond OpenAI's that all three accept (each engine's request models).
_COMMON_EXTRAS = frozenset({"ignore_eos", "min_tokens", "top_k"})

VLLM = Engine(
    name="vllm",
    title="vLLM",
    command=("vllm", "serve"),
    model_flag="--model",
    spelling="kebab",
    negates=True,
    knob_flags={},
    metrics=Metrics(
        prefix="vllm:",
        names={quantity: quantity for quantity in QUANTITIES if quantity != ABORTED},
        kv_capacity=None,  # read from vllm:cache_config_info's labels instead
    ),
    control=Control(
        serves="/is_paused",
        sleeping="/is_sleeping",
        pause="/pause",
        pause_modes={"keep": "keep", "wait": "wait", "abort": "abort"},
        resume="/resume",
        update_weights="/update_weights",
        update_body={"update_info": {}},
        sleep="/sleep",
        wake_up="/wake_up",
        reset_cache="/reset_prefix_cache",
        enable="start vLLM with VLLM_SERVER_DEV_MODE=1 (and --enable-sleep-mode to sleep)",
    ),
    dialect=Dialect(
        extra_fields=_COMMON_EXTRAS
        | {"min_p", "repetition_penalty", "stop_token_ids", "return_token_ids", "priority"},
    ),
)

SGLANG = Engine(
    name="sglang",
    title="SGLang",
    command=("python", "-m", "sglang.launch_server"),
    model_flag="--model-path",
    spelling="kebab",
    negates=False,  # store_true switches only
    knob_flags={
        "tensor_parallel_size": "--tp-size",
        "data_parallel_size": "--dp-size",
        "gpu_memory_utilization": "--mem-fraction-static",
        "max_num_seqs": "--max-running-requests",
        "max_num_batched_tokens": "--chunked-prefill-size",
        "max_model_len": "--context-length",
    },
    switches={"enable_prefix_caching": (None, "--disable-radix-cache")},
    always=("--enable-metrics",),
    metrics=Metrics(
        prefix="sglang:",
        names={
            RUNNING: "sglang:num_running_reqs",
            WAITING: "sglang:num_queue_reqs",
            KV_USAGE: "sglang:token_usage",
            PREEMPTIONS: "sglang:num_retracted_requests_total",
            GENERATION_TOKENS: "sglang:generation_tokens_total",
            PROMPT_TOKENS: "sglang:prompt_tokens_total",
            TTFT: "sglang:time_to_first_token_seconds",
            E2E: "sglang:e2e_request_latency_seconds",
            QUEUE_TIME: "sglang:queue_time_seconds",
            PREFIX_QUERIES: "sglang:prompt_tokens_total",
            PREFIX_HITS: "sglang:cached_tokens_total",
            ABORTED: "sglang:num_aborted_requests_total",
        },
        kv_capacity="sglang:max_total_num_tokens",
        needs="start SGLang with --enable-metrics (autotune adds it to the servers it launches)",
    ),
    control=Control(
        serves="/get_server_info",
        pause="/pause_generation",
        pause_modes={"abort": "abort", "retract": "retract", "keep": "in_place"},
        mode_in_body=True,
        resume="/continue_generation",
        resume_body={},
        update_weights="/update_weights_from_disk",
        update_from_disk=True,
        sleep="/release_memory_occupation",
        wake_up="/resume_memory_occupation",
        memory_tags=("kv_cache", "weights"),
        reset_cache="/flush_cache",
        flush_needs_idle=True,
        enable="start SGLang with --enable-memory-saver to release and resume its memory",
    ),
    dialect=Dialect(
        extra_fields=_COMMON_EXTRAS
        | {"min_p", "repetition_penalty", "stop_token_ids", "rid", "no_stop_trim"},
    ),
    info_path="/get_server_info",
)

TRTLLM = Engine(
    name="trtllm",
    title="TensorRT-LLM",
    command=("trtllm-serve",),
    model_flag=None,
    spelling="snake",
    negates=False,
    knob_flags={
        "tensor_parallel_size": "--tp_size",
        "max_num_seqs": "--max_batch_size",
        "max_num_batched_tokens": "--max_num_tokens",
        "max_model_len": "--max_seq_len",
    },
    option_knobs={"enable_prefix_caching": "kv_cache_config.enable_block_reuse"},
    always_options={"return_perf_metrics": True, "enable_iter_perf_stats": True},
    options_flag="--extra_llm_api_options",
    always=("--backend", "pytorch"),
    missing_knobs={
        "gpu_memory_utilization": (
            "it sizes its KV cache by the share of the memory the weights leave free; "
            "search flags: {kv_cache_free_gpu_memory_fraction: ...} instead"
        ),
        "data_parallel_size": "one trtllm-serve per engine: use resources.replicas: servers",
    },
    metrics=Metrics(
        prefix="trtllm_",
        names={
            RUNNING: "trtllm_num_requests_running",
            WAITING: "trtllm_num_requests_waiting",
            KV_USAGE: "trtllm_kv_cache_utilization",
            GENERATION_TOKENS: "trtllm_generation_tokens_total",
            PROMPT_TOKENS: "trtllm_prompt_tokens_total",
            TTFT: "trtllm_time_to_first_token_seconds",
            E2E: "trtllm_e2e_request_latency_seconds",
            QUEUE_TIME: "trtllm_request_queue_time_seconds",
        },
        path="/prometheus/metrics",  # served with return_perf_metrics on (autotune sets it)
    ),
    control=Control(
        # No HTTP pause (a sync stops new requests from the client's side); the Prometheus
        # path, on where autotune launches it, tells a TensorRT-LLM server.
        serves="/prometheus/metrics",
        update_weights="/update_weights",
        sleep="/release_memory",
        wake_up="/resume_memory",
        memory_tags=("model", "kv_cache"),
        enable=(
            "TensorRT-LLM serves /release_memory, /resume_memory and /update_weights only "
            "where it wraps a Ray-orchestrated AsyncLLM"
        ),
    ),
    dialect=Dialect(
        extra_fields=_COMMON_EXTRAS,
        forbids_unknown=True,
        cancelled_reasons=frozenset({"cancelled"}),
    ),
)

ENGINES = {engine.name: engine for engine in (VLLM, SGLANG, TRTLLM)}
ENGINE_NAMES = tuple(ENGINES)


def engine_named(name: str) -> Engine:
    """The engine of `name` (vllm, sglang or trtllm); raises KeyError for another."""
    return ENGINES[name]
