"""Replicas of one model: the datasheet ceiling of a layout of GPUs, and the simulated
server running several engines (`--data-parallel-size`) with prefix caching."""

from __future__ import annotations

import re

import aiohttp
import pytest

from autotune.engine_model.state import engine_config
from autotune.errors import UsageError
from autotune.hardware.deployment import SimConfigError
from autotune.hardware.memory import InsufficientMemory
from autotune.hardware.profiles import GPUS, MODELS
from autotune.hardware.roofline import roofline
from autotune.servers.sim.server import load_config, main, serve_in_process
from autotune.telemetry.prometheus import parse_prometheus

H100 = GPUS["h100-80gb"]
H200 = GPUS["h200"]
L8B = MODELS["llama-3.1-8b"]
MODEL = "sim/llama-3.1-8b"

# -- the roofline ----------------------------------------------------------------------------
#
# llama-3.1-8b (8,030,261,248 params, 32 layers, 32 heads, 8 KV heads, head dim 128, bf16)
# on h100-80gb (3.35e12 B/s HBM, 989.4e12 dense bf16 FLOP/s):
#
#   TP 2: weights/GPU = 8,030,261,248 × 2 ÷ 2 = 8,030,261,248 B
#         KV/token/GPU = 2 × 32 × (8 ÷ 2) × 128 × 2 = 65,536 B
#   TP 8: weights/GPU = 16,060,522,496 ÷ 8 = 2,007,565,312 B
#         KV/token/GPU = 2 × 32 × (8 ÷ 8) × 128 × 2 = 16,384 B


def test_four_tp2_engines_tie_one_tp8_engine_at_the_same_batch() -> None:
    # Prompt 1,000, output 500, batch 64 per engine; a decode step reads each sequence's KV
    # at its mean length 1,000 + 500 ÷ 2 = 1,250: 64 × 1,250 = 80,000 context tokens.
    # TP 2 decode step:
    #   bytes = 8,030,261,248 + 65,536 × 80,000 = 13,273,141,248 → ÷ 3.35e12 = 3.96213 ms
    #   flops = 8,030,261,248 × 64 + (4 × 32 × 32 × 128 ÷ 2 = 262,144) × 80,000
    #         = 534,908,239,872 → ÷ 989.4e12 = 0.54064 ms: memory-bound
    #   prefill = 8,030,261,248 × 1,000 × 64 ÷ 989.4e12 = 0.519443 s
    #   one engine = 64 × 500 ÷ (0.519443 + 500 × 3.96213e-3) = 32,000 ÷ 2.500510 = 12,797.4
    #   four engines = 51,189.6 output tokens/s
    # TP 8 decode step:
    #   bytes = 2,007,565,312 + 16,384 × 80,000 = 3,318,285,312 → 0.990533 ms (memory-bound)
    #   prefill = 2,007,565,312 × 64,000 ÷ 989.4e12 = 0.129861 s
    #   one engine = 32,000 ÷ (0.129861 + 0.495266) = 51,189.6 output tokens/s
    # Every term scales as 1 ÷ tp (8 KV heads split evenly up to TP 8), and there is no
    # all-reduce at the roofline: at the same batch per engine the layouts tie.
    four = roofline(H100, L8B, tp=2, engines=4, prompt_tokens=1000, output_tokens=500, batch=64)
    one = roofline(H100, L8B, tp=8, engines=1, prompt_tokens=1000, output_tokens=500, batch=64)
    assert four.decode_step_s == pytest.approx(3.96213e-3, rel=1e-5)
    assert four.prefill_s == pytest.approx(0.519443, rel=1e-5)
    assert one.decode_step_s == pytest.approx(0.990533e-3, rel=1e-5)
    assert one.prefill_s == pytest.approx(0.129861, rel=1e-5)
    assert four.bound == one.bound == "memory"
    assert four.output_tokens_per_s == pytest.approx(51_189.6, rel=1e-5)
    assert one.output_tokens_per_s == pytest.approx(51_189.6, rel=1e-5)
    assert round(one.output_tokens_per_s / four.output_tokens_per_s, 2) == 1.00  # 3 s.f.


def test_one_tp8_engine_beats_four_tp2_engines_when_kv_caps_their_batch() -> None:
    # Prompt 4,000, output 4,000 (8,000 tokens a sequence), batch from the KV cache:
    #   TP 2: free = 0.9 × 80 GiB − 8,030,261,248 − 2 GiB = 67,131,666,432 B
    #         ÷ (65,536 × 16) = 64,021 blocks = 1,024,336 tokens → 128 sequences
    #   TP 8: free = 77,309,411,328 − 2,007,565,312 − 2,147,483,648 = 73,154,362,368 B
    #         ÷ (16,384 × 16) = 279,061 blocks = 4,464,976 tokens → 558, capped at 256
    # Mean context 4,000 + 2,000 = 6,000 tokens a sequence.
    # TP 2, batch 128: bytes = 8,030,261,248 + 65,536 × 768,000 = 58,361,909,248 B
    #   → 17.42147 ms a step; prefill = 8,030,261,248 × 4,000 × 128 ÷ 989.4e12 = 4.155543 s
    #   one engine = 512,000 ÷ (4.155543 + 4,000 × 0.01742147) = 6,933.78; × 4 = 27,735.1
    # TP 8, batch 256: bytes = 2,007,565,312 + 16,384 × 1,536,000 = 27,173,389,312 B
    #   → 8.111459 ms; prefill = 2,007,565,312 × 4,000 × 256 ÷ 989.4e12 = 2.077771 s
    #   one engine = 1,024,000 ÷ (2.077771 + 32.445836) = 29,660.9
    # Ratio 29,660.9 ÷ 27,735.1 = 1.0694: a TP 8 engine holds 4.36× the KV of a TP 2 one
    # (its weights take less of each GPU), so the bigger batch wins at the roofline.
    four = roofline(H100, L8B, tp=2, engines=4, prompt_tokens=4000, output_tokens=4000)
    one = roofline(H100, L8B, tp=8, engines=1, prompt_tokens=4000, output_tokens=4000)
    assert (four.batch, one.batch) == (128, 256)
    assert four.output_tokens_per_s == pytest.approx(27_735.1, rel=1e-5)
    assert one.output_tokens_per_s == pytest.approx(29_660.9, rel=1e-5)
    assert one.output_tokens_per_s > four.output_tokens_per_s
    assert round(one.output_tokens_per_s / four.output_tokens_per_s, 2) == 1.07  # 3 s.f.


def test_cached_prompt_share_saves_prefill_only() -> None:
    # llama-3.1-70b (70,553,706,496 params, 80 layers, 64 heads, 8 KV heads, head dim 128)
    # on h200 (4.8e12 B/s, 989.4e12 FLOP/s), TP 4, one engine, batch 32, prompt 2,000,
    # output 1,000; 7 of a group of 8 read the prompt from the cache: share 0.875.
    #   weights/GPU = 141,107,412,992 ÷ 4 = 35,276,853,248 B
    #   KV/token/GPU = 2 × 80 × (8 ÷ 4) × 128 × 2 = 81,920 B
    #   context = 32 × (2,000 + 500) = 80,000 tokens
    #   bytes = 35,276,853,248 + 81,920 × 80,000 = 41,830,453,248 → ÷ 4.8e12 = 8.714678 ms
    #   flops = 35,276,853,248 × 32 + (4 × 80 × 64 × 128 ÷ 4 = 655,360) × 80,000
    #         = 1,181,288,103,936 → 1.193944 ms: memory-bound
    #   prefill = 35,276,853,248 × 0.125 × 2,000 × 32 ÷ 989.4e12 = 0.2852384 s
    #   ceiling = 32,000 ÷ (0.2852384 + 1,000 × 0.008714678) = 3,555.59 output tokens/s
    #   (without the cache: prefill 2.281907 s, 32,000 ÷ 10.996585 = 2,909.99)
    cached = roofline(
        H200, MODELS["llama-3.1-70b"], tp=4, engines=1, prompt_tokens=2000, output_tokens=1000,
        batch=32, cached_prompt_share=0.875,
    )  # fmt: skip
    assert cached.output_tokens_per_s == pytest.approx(3555.59, rel=1e-3)
    assert cached.prefill_s == pytest.approx(0.2852384, rel=1e-5)
    assert cached.decode_step_s == pytest.approx(8.714678e-3, rel=1e-5)
    assert cached.bound == "memory"
    uncached = roofline(
        H200, MODELS["llama-3.1-70b"], tp=4, engines=1, prompt_tokens=2000, output_tokens=1000,
        batch=32,
    )  # fmt: skip
    assert uncached.output_tokens_per_s == pytest.approx(2909.99, rel=1e-3)
    assert uncached.decode_step_s == cached.decode_step_s  # decode reads the prompt anyway


def test_a_large_batch_of_short_sequences_is_compute_bound() -> None:
    # llama-3.2-1b (1,235,814,400 params) on h100-80gb, batch 1,024 of 16 + 16 tokens:
    #   bytes = 2,471,628,800 + 32,768 × 1,024 × 24 = 3,276,935,168 → 0.978 ms
    #   flops = 2 × 1,235,814,400 × 1,024 + 4 × 16 × 32 × 64 × 24,576 = 2.534e12 → 2.561 ms
    r = roofline(H100, MODELS["llama-3.2-1b"], 1, 1, 16, 16, batch=1024)
    assert r.bound == "compute"
    assert r.decode_step_s == pytest.approx(2.561319e-3, rel=1e-5)


def test_roofline_refuses_what_does_not_fit() -> None:
    with pytest.raises(InsufficientMemory, match="No available memory"):
        roofline(H100, MODELS["llama-3.1-70b"], tp=1, engines=1, prompt_tokens=1, output_tokens=1)
    # TP 2 holds 1,024,336 KV tokens: one 1,100,000-token request does not fit.
    with pytest.raises(InsufficientMemory, match="exceeds the KV cache"):
        roofline(H100, L8B, tp=2, engines=1, prompt_tokens=1_000_000, output_tokens=100_000)
    with pytest.raises(ValueError, match="cached_prompt_share"):
        roofline(H100, L8B, 1, 1, 100, 100, cached_prompt_share=1.5)


# -- the server with several engines ---------------------------------------------------------


def _label(engine: int) -> str:
    return f'{{engine="{engine}",model_name="{MODEL}"}}'


async def _metrics(session: aiohttp.ClientSession, url: str) -> tuple[str, dict[str, float]]:
    async with session.get(url.removesuffix("/v1") + "/metrics") as resp:
        text = await resp.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return text, samples


async def test_two_engines_share_the_load(session: aiohttp.ClientSession) -> None:
    """vLLM's balancer: the first request goes to engine 0 (both score 0, the lower index
    wins); with it running there (score 1), the next goes to engine 1 (score 0)."""
    async with serve_in_process(["--port", "0", "--time-scale", "1", "-dp", "2"]) as url:
        async with session.get(url + "/models") as resp:
            assert (await resp.json())["data"][0]["data_parallel_size"] == 2
        long = {"prompt": "a" * 40, "max_tokens": 5000, "ignore_eos": True, "stream": True}
        async with session.post(url + "/completions", json=long) as streaming:
            await streaming.content.readline()  # its first token: it runs on engine 0
            short = {"prompt": "b" * 40, "max_tokens": 3, "ignore_eos": True}
            async with session.post(url + "/completions", json=short) as resp:
                assert (await resp.json())["usage"]["completion_tokens"] == 3
            text, m = await _metrics(session, url)
    assert m["vllm:num_requests_running" + _label(0)] == 1
    assert m["vllm:e2e_request_latency_seconds_count" + _label(1)] == 1
    assert m["vllm:generation_tokens_total" + _label(1)] == 3
    ttft = "vllm:time_to_first_token_seconds_bucket"
    assert m[f'{ttft}{{engine="1",le="+Inf",model_name="{MODEL}"}}'] == 1
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1
    # autotune's sampler sums every label set and averages the KV usage per engine.
    summed = parse_prometheus(text, average=("vllm:kv_cache_usage_perc",))
    assert summed["vllm:num_requests_running"] == 1
    kv = [m["vllm:kv_cache_usage_perc" + _label(i)] for i in (0, 1)]
    assert summed["vllm:kv_cache_usage_perc"] == pytest.approx(sum(kv) / 2)


@pytest.mark.parametrize("caching", [True, False])
async def test_identical_prompts_hit_the_prefix_cache(
    session: aiohttp.ClientSession, caching: bool
) -> None:
    # 8,000 characters = 2,000 prompt tokens; a repeat reuses ⌊1,999 ÷ 16⌋ × 16 = 1,984.
    # The first and third name the model and the second does not: the key leaves it out.
    flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
    async with serve_in_process(["--port", "0", "--time-scale", "0.01", flag]) as url:
        for model in (MODEL, None, MODEL):
            payload = {"prompt": "p" * 8000, "max_tokens": 1, "model": model}
            async with session.post(url + "/completions", json=payload) as resp:
                assert resp.status == 200
        chat = {"messages": [{"role": "user", "content": "q" * 8000}], "max_tokens": 1}
        for _ in range(2):
            async with session.post(url + "/chat/completions", json=chat) as resp:
                assert resp.status == 200
        text, m = await _metrics(session, url)
    assert "# TYPE vllm:prefix_cache_queries counter" in text
    queries = m["vllm:prefix_cache_queries_total" + _label(0)]
    hits = m["vllm:prefix_cache_hits_total" + _label(0)]
    if caching:
        assert (queries, hits) == (5 * 2000, 3 * 1984)  # 2 repeats + 1 chat repeat
    else:
        assert (queries, hits) == (0, 0)


def test_data_parallel_flags_reach_the_config() -> None:
    config = load_config(["--data-parallel-size", "4", "-tp", "2"])
    assert (config.data_parallel_size, config.tensor_parallel_size) == (4, 2)
    assert config.enable_prefix_caching
    assert engine_config(config).tp == 2  # one engine's configuration
    assert engine_config(config).enable_prefix_caching
    off = load_config(["--no-enable-prefix-caching"])
    assert not off.enable_prefix_caching and not engine_config(off).enable_prefix_caching
    assert off.data_parallel_size == 1


async def test_a_data_parallel_size_below_one_is_one_clear_sentence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SimConfigError) as info:
        load_config(["--data-parallel-size", "0"])
    assert str(info.value) == "data_parallel_size (0) must be at least 1."
    assert main(["--data-parallel-size", "0"]) == 1
    err = capsys.readouterr().err
    assert err == "ValueError: data_parallel_size (0) must be at least 1.\n"
    with pytest.raises(UsageError, match=re.escape("data_parallel_size (0) must be at least 1")):
        async with serve_in_process(["--port", "0", "-dp", "0"]):
            pytest.fail("served with no engine")
