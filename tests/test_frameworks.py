"""The slime, verl and AReaL lines for a recommended SGLang configuration
(autotune/sweep/frameworks.py): each framework's own names, a knob it has none for left out."""

from __future__ import annotations

import pytest

from autotune.sweep.frameworks import sglang_framework_lines

KNOBS = {
    "tensor_parallel_size": 2,
    "gpu_memory_utilization": 0.85,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 8192,
    "enable_prefix_caching": False,
    "max_model_len": 8192,
    "num_engines": 4,
}


def test_the_lines_of_a_full_configuration() -> None:
    lines = sglang_framework_lines(KNOBS, 200)
    assert lines["slime"] == (
        "--rollout-num-gpus-per-engine 2 --rollout-num-gpus 8 --sglang-server-concurrency 50 "
        "--sglang-mem-fraction-static 0.85 --sglang-max-running-requests 64 "
        "--sglang-chunked-prefill-size 8192 --sglang-disable-radix-cache "
        "--sglang-context-length 8192"
    )
    verl = "actor_rollout_ref.rollout"
    extra = f"++{verl}.engine_kwargs.sglang"
    assert lines["verl"] == (
        f"{verl}.name=sglang {verl}.tensor_model_parallel_size=2 "
        f"{verl}.gpu_memory_utilization=0.85 {verl}.max_num_seqs=64 "
        f"{extra}.chunked_prefill_size=8192 {extra}.disable_radix_cache=True "
        f"{verl}.max_model_len=8192 {extra}.context_length=8192"
    )
    assert lines["areal"] == (
        "++rollout.backend=sglang:d4t2 ++rollout.max_concurrent_rollouts=200 "
        "++sglang.mem_fraction_static=0.85 ++sglang.max_running_requests=64 "
        "++sglang.chunked_prefill_size=8192 ++sglang.disable_radix_cache=True "
        "++sglang.context_length=8192"
    )


def test_radix_cache_is_switched_off_only_where_prefix_caching_is() -> None:
    on = sglang_framework_lines({"enable_prefix_caching": True}, 8)
    assert "radix" not in on["slime"]
    assert "radix" not in on["verl"]
    # AReaL's SGLangConfig defaults disable_radix_cache to True: caching on must say so
    assert "++sglang.disable_radix_cache=False" in on["areal"]
    off = sglang_framework_lines({"enable_prefix_caching": False}, 8)
    assert "--sglang-disable-radix-cache" in off["slime"].split()
    assert "++actor_rollout_ref.rollout.engine_kwargs.sglang.disable_radix_cache=True" in (
        off["verl"].split()
    )
    assert "++sglang.disable_radix_cache=True" in off["areal"].split()


def test_tensor_parallel_size_in_each_frameworks_name() -> None:
    lines = sglang_framework_lines({"tensor_parallel_size": 4}, 16)
    assert lines["slime"].startswith("--rollout-num-gpus-per-engine 4 ")
    assert "--sglang-tp-size" not in lines["slime"]  # slime skips tp_size
    assert "--rollout-num-gpus " not in lines["slime"]  # engines unknown: left to slime
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=4" in lines["verl"].split()
    assert "++rollout.backend=sglang:d1t4" in lines["areal"].split()


def test_concurrency_per_engine_in_slime_and_per_group_in_areal() -> None:
    lines = sglang_framework_lines({"num_engines": 3}, 100, group_size=8)
    assert "--sglang-server-concurrency 34" in lines["slime"]  # 34 × 3 engines ≥ 100
    assert "--rollout-num-gpus 3" in lines["slime"]
    assert "++rollout.max_concurrent_rollouts=13" in lines["areal"].split()
    assert "++rollout.backend=sglang:d3t1" in lines["areal"].split()
    assert "concurren" not in lines["verl"]  # verl has no client concurrency to set


def test_an_extra_flag_passes_where_the_framework_passes_server_flags() -> None:
    lines = sglang_framework_lines({"schedule_policy": "lpm", "enable_torch_compile": True}, 8)
    assert "--sglang-schedule-policy lpm --sglang-enable-torch-compile" in lines["slime"]
    extra = "++actor_rollout_ref.rollout.engine_kwargs.sglang"
    assert f"{extra}.schedule_policy=lpm" in lines["verl"].split()
    assert "++sglang.schedule_policy=lpm" in lines["areal"].split()
    assert "++sglang.enable_torch_compile=True" in lines["areal"].split()


def test_a_knob_without_a_name_is_left_out() -> None:
    # hicache_ratio is no field of AReaL's SGLangConfig; tp_size none of slime's flags
    lines = sglang_framework_lines({"hicache_ratio": 2.0, "tp_size": 2}, 8)
    assert "hicache" not in lines["areal"]
    assert "--sglang-hicache-ratio 2" in lines["slime"]
    assert "tp-size" not in lines["slime"]
    assert "++actor_rollout_ref.rollout.engine_kwargs.sglang.hicache_ratio=2" in (
        lines["verl"].split()
    )
    # SGLang's --dp-size is DP attention in all three: engines come from num_engines
    split = sglang_framework_lines({"data_parallel_size": 2, "max_num_seqs": None}, 8)
    assert "dp" not in split["slime"] + split["verl"] + split["areal"]
    assert "max_running_requests" not in split["areal"]
    assert split["verl"] == "actor_rollout_ref.rollout.name=sglang"


def test_a_switch_takes_a_boolean() -> None:
    with pytest.raises(ValueError, match="switch"):
        sglang_framework_lines({"enable_prefix_caching": "no"}, 8)
