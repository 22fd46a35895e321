"""A recommended SGLang rollout configuration as the line to paste into slime, verl and AReaL,
in each framework's own names; beside each name, the file of that framework's repository
it was read from (THUDM/slime, volcengine/verl, inclusionAI/AReaL)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from autotune.config.knobs import NUM_ENGINES
from autotune.engines.description import flag_value
from autotune.engines.known import SGLANG

TP = "tensor_parallel_size"
# How the GPUs split into engines × TP, which each framework sizes in its own names below.
# data_parallel_size (SGLang's --dp-size) is left out: in all three it is DP attention inside
# one engine (slime/utils/arguments.py validate_args asserts --sglang-enable-dp-attention;
# verl's async_sglang_server.py multiplies it into tp_size; AReaL's cli_args.py SGLangConfig:
# "dp_size: only used for dp attention"), not autotune's engines.
SPLIT = frozenset({NUM_ENGINES, TP, "data_parallel_size"})

# slime: slime/backends/sglang_utils/arguments.py add_sglang_arguments registers every
# SGLang ServerArgs flag as --sglang-<flag> except these fields (its skipped_args).
SLIME_PREFIX = "--sglang-"
SLIME_SKIPPED = frozenset({
    "model_path", "config", "trust_remote_code", "random_seed", "enable_memory_saver",
    "tp_size", "port", "nnodes", "node_rank", "dist_init_addr", "gpu_id_step", "base_gpu_id",
    "nccl_port", "skip_server_warmup", "enable_return_routed_experts",
})  # fmt: skip
SLIME_GPUS_PER_ENGINE = "--rollout-num-gpus-per-engine"  # slime/utils/arguments.py (its TP)
SLIME_GPUS = "--rollout-num-gpus"  # slime/utils/arguments.py: engines = it ÷ the above
# slime/backends/sglang_utils/arguments.py; slime/rollout/sglang_rollout.py holds a
# semaphore of it × engines around each sample's generation: requests per engine.
SLIME_CONCURRENCY = "--sglang-server-concurrency"

# verl: keys of verl/trainer/config/rollout/rollout.yaml. Its SGLang server
# (verl/workers/rollout/sglang_rollout/async_sglang_server.py, launch_server) passes
# gpu_memory_utilization as mem_fraction_static, tensor_model_parallel_size as tp_size,
# max_num_seqs as max_running_requests and engine_kwargs.sglang as ServerArgs fields; it
# never reads max_num_batched_tokens or enable_prefix_caching (vLLM's only), and uses
# max_model_len only to bound a request's max_tokens, so context_length also goes to SGLang.
VERL = "actor_rollout_ref.rollout"
VERL_KEYS = {
    "mem_fraction_static": "gpu_memory_utilization",
    "max_running_requests": "max_num_seqs",
}
VERL_ALSO = {"context_length": "max_model_len"}  # a verl key, and the SGLang field as well
# engine_kwargs.sglang is {} in rollout.yaml, so its keys are added: `+` in
# docs/perf/best_practices.rst; `++` (add or override, Hydra's) as its
# tests/special_e2e/run_ppo_trainer_megatron.sh writes ++actor_rollout_ref.rollout.*.
VERL_EXTRA = f"++{VERL}.engine_kwargs.sglang"

# AReaL: areal/api/cli_args.py. rollout.backend is "sglang:d<engines>t<tp>"
# (docs/en/reference/alloc_mode.md: d = independent server instances, t = GPUs each);
# rollout.max_concurrent_rollouts bounds the rollouts in flight over all servers
# (areal/infra/staleness_manager.py), a rollout being one input's group of samples
# (areal/api/engine_api.py: "Number of times to run the workflow per input").
# Its SGLangConfig is a dataclass: a field not in it is refused (to_structured_cfg), so
# only these pass through (its fields, less model_path, random_seed, lora_paths, filled by
# AReaL, and enable_return_routed_experts, "Internal field"). Its defaults are not SGLang's
# (disable_radix_cache True, chunked_prefill_size -1, context_length 32768).
AREAL_SGLANG = frozenset({
    "skip_tokenizer_init", "disable_cuda_graph", "disable_radix_cache",
    "disable_cuda_graph_padding", "enable_nccl_nvls", "disable_outlines_disk_cache",
    "disable_custom_all_reduce", "disable_overlap_schedule", "enable_mixed_chunk",
    "enable_dp_attention", "enable_ep_moe", "enable_torch_compile", "torch_compile_max_bs",
    "cuda_graph_max_bs", "cuda_graph_bs", "torchao_config", "enable_nan_detection",
    "enable_p2p_check", "triton_attention_reduce_in_fp32", "triton_attention_num_kv_splits",
    "num_continuous_decode_steps", "enable_memory_saver", "allow_auto_truncate",
    "attention_backend", "enable_multimodal", "sampling_backend", "context_length",
    "mem_fraction_static", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens",
    "schedule_policy", "schedule_conservativeness", "cpu_offload_gb", "dtype", "kv_cache_dtype",
    "dp_size", "ep_size", "enable_lora", "max_lora_rank", "max_loaded_loras", "lora_backend",
    "log_level", "log_level_http", "log_requests", "log_requests_level", "show_time_cost",
    "enable_metrics", "decode_log_interval", "enable_multithread_load",
})  # fmt: skip
# `++`: a key the user's YAML may or may not hold (docs/en/tutorial/quickstart.md: plain
# for one in it, `+` for one only in cli_args.py); parse_cli_args composes with Hydra.
AREAL_BACKEND = "++rollout.backend"
AREAL_CONCURRENCY = "++rollout.max_concurrent_rollouts"
AREAL_SGLANG_KEY = "++sglang"


def sglang_framework_lines(
    knobs: Mapping[str, object], parallelism: int, *, group_size: int = 1
) -> dict[str, str]:
    """{"slime", "verl", "areal"} → the line (flags or dotted overrides) that sets `knobs`
    (autotune's names, vLLM's; num_engines the engines) and `parallelism`, the samples in
    flight over all engines (`group_size` samples to one AReaL rollout). A knob the framework
    has no name for, or whose value is None, is left out."""
    engines = count(knobs.get(NUM_ENGINES) or 1)
    tp = knobs.get(TP)
    return {
        "slime": " ".join(slime_words(knobs, parallelism, engines)),
        "verl": " ".join(verl_words(knobs, tp)),
        "areal": " ".join(areal_words(knobs, math.ceil(parallelism / group_size), engines)),
    }


def server_fields(knobs: Mapping[str, object], *, explicit: bool = False) -> dict[str, object]:
    """SGLang's server field → value for every knob but the split, named by SGLANG's flags;
    a switch as its flag's field, true where the flag is given (explicit: false elsewhere)."""
    fields: dict[str, object] = {}
    for name, value in knobs.items():
        if value is None or name in SPLIT:
            continue
        if name not in SGLANG.switches:
            fields[field_of(SGLANG.flag(name))] = value
            continue
        if not isinstance(value, bool):
            raise ValueError(f"{name} is a switch: true or false, not {value!r}")
        for flag, given in zip(SGLANG.switches[name], (value, not value), strict=True):
            if flag is not None and (given or explicit):
                fields[field_of(flag)] = given
    return fields


def slime_words(knobs: Mapping[str, object], parallelism: int, engines: int) -> list[str]:
    """slime's flags: TP and GPUs, the concurrency per engine, then --sglang-<flag>; a false
    boolean left out (SGLang's boolean flags are off unless given)."""
    tp = knobs.get(TP)
    words = [] if tp is None else [SLIME_GPUS_PER_ENGINE, flag_value(tp)]
    if knobs.get(NUM_ENGINES) is not None:
        words += [SLIME_GPUS, str(engines * count(tp or 1))]
    words += [SLIME_CONCURRENCY, str(math.ceil(parallelism / engines))]
    for field, value in server_fields(knobs).items():
        if field in SLIME_SKIPPED or value is False:
            continue
        flag = SLIME_PREFIX + SGLANG.flag(field).removeprefix("--")
        words += [flag] if value is True else [flag, flag_value(value)]
    return words


def verl_words(knobs: Mapping[str, object], tp: object) -> list[str]:
    """verl's overrides: the rollout keys it passes to SGLang, the rest as engine_kwargs."""
    words = [f"{VERL}.name=sglang"]
    if tp is not None:
        words.append(f"{VERL}.tensor_model_parallel_size={flag_value(tp)}")
    for field, value in server_fields(knobs).items():
        if field in VERL_KEYS:
            words.append(f"{VERL}.{VERL_KEYS[field]}={flag_value(value)}")
            continue
        if field in VERL_ALSO:
            words.append(f"{VERL}.{VERL_ALSO[field]}={flag_value(value)}")
        words.append(f"{VERL_EXTRA}.{field}={flag_value(value)}")
    return words


def areal_words(knobs: Mapping[str, object], rollouts: int, engines: int) -> list[str]:
    """AReaL's overrides: the backend string, rollouts in flight, then its sglang fields
    (a switch both ways: AReaL's own defaults are not SGLang's)."""
    words = []
    tp = knobs.get(TP)
    if knobs.get(NUM_ENGINES) is not None or tp is not None:
        words.append(f"{AREAL_BACKEND}=sglang:d{engines}t{flag_value(tp or 1)}")
    words.append(f"{AREAL_CONCURRENCY}={rollouts}")
    for field, value in server_fields(knobs, explicit=True).items():
        if field in AREAL_SGLANG:
            words.append(f"{AREAL_SGLANG_KEY}.{field}={flag_value(value)}")
    return words


def field_of(flag: str) -> str:
    """SGLang's flag → its ServerArgs field (`--mem-fraction-static` → mem_fraction_static)."""
    return flag.removeprefix("--").replace("-", "_")


def count(value: object) -> int:
    """A knob's whole number, written `4` or `4.0`."""
    return int(float(str(value)))
