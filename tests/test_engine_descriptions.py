"""The engine descriptions: each knob spelled as its engine spells it and read back, the
options file TensorRT-LLM takes, and what an engine lacks refused (docs/engines.md)."""

from __future__ import annotations

import pytest

from autotune.config.knobs import SERVER_KNOBS
from autotune.engines import ENGINES, Call

KNOBS = {
    "tensor_parallel_size": 2,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 4096,
    "max_model_len": 8192,
    "gpu_memory_utilization": 0.85,
    "enable_prefix_caching": False,
}


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_knob_spelled_by_an_engine_reads_back_as_its_own(name: str) -> None:
    engine = ENGINES[name]
    for knob in SERVER_KNOBS:
        if engine.knob_problem(knob) is None and engine.option_key(knob) is None:
            flag = engine.switches.get(knob, (engine.flag(knob), None))
            spelled = flag[0] or flag[1]
            assert spelled is not None and engine.field_of(spelled) == knob, (knob, spelled)


def test_sglang_and_tensorrt_llm_launch_lines() -> None:
    sglang = ENGINES["sglang"].launch_line(
        ENGINES["sglang"].command, "M", KNOBS, port=30000, host="127.0.0.1"
    )
    assert sglang == [
        "python", "-m", "sglang.launch_server", "--model-path", "M", "--port", "30000",
        "--host", "127.0.0.1", "--enable-metrics", "--tp-size", "2",
        "--max-running-requests", "64", "--chunked-prefill-size", "4096",
        "--context-length", "8192", "--mem-fraction-static", "0.85", "--disable-radix-cache",
    ]  # fmt: skip
    trtllm = ENGINES["trtllm"]
    knobs = {k: v for k, v in KNOBS.items() if k != "gpu_memory_utilization"}
    knobs["kv_cache_config.free_gpu_memory_fraction"] = 0.7
    line = trtllm.launch_line(trtllm.command, "M", knobs, port=8000, options_file="o.yaml")
    assert line == [
        "trtllm-serve", "M", "--port", "8000", "--backend", "pytorch", "--tp_size", "2",
        "--max_batch_size", "64", "--max_num_tokens", "4096", "--max_seq_len", "8192",
        "--extra_llm_api_options", "o.yaml",
    ]  # fmt: skip
    assert trtllm.options(knobs) == {
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
        "kv_cache_config": {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.7},
    }


def test_what_an_engine_lacks_or_autotune_sets_is_refused() -> None:
    with pytest.raises(ValueError, match="TensorRT-LLM has no gpu_memory_utilization"):
        ENGINES["trtllm"].flags({"gpu_memory_utilization": 0.9})
    for engine in ENGINES.values():
        with pytest.raises(ValueError, match="set by autotune"):
            engine.flags({"port": 1})
    assert ENGINES["sglang"].flags({"enable_mixed_chunk": False}) == []
    assert ENGINES["vllm"].flags({"enforce_eager": False}) == ["--no-enforce-eager"]


def test_each_engine_pauses_and_sleeps_in_its_own_words() -> None:
    vllm, sglang, trtllm = (ENGINES[name].control for name in ("vllm", "sglang", "trtllm"))
    assert vllm.pause_call("keep", True) == Call("/pause", {"mode": "keep", "clear_cache": "true"})
    assert sglang.pause_call("keep", True) == Call("/pause_generation", body={"mode": "in_place"})
    assert "wait" not in sglang.pause_modes and "retract" not in vllm.pause_modes
    assert trtllm.pause is None  # the client's side pauses it
    assert vllm.sleep_call(1, "abort") == Call("/sleep", {"level": "1", "mode": "abort"})
    assert sglang.sleep_call(1, "abort").body == {"tags": ["kv_cache", "weights"]}
    assert trtllm.wake_call() == Call("/resume_memory", body={"tags": ["model", "kv_cache"]})
