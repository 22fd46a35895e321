"""The simulator's performance model and its continuous-batching engine, without HTTP."""

from __future__ import annotations

import asyncio

import pytest

from autotune.servers.sim.perf_model import (
    InsufficientMemory,
    allreduce_time_s,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    step_time_s,
    weights_bytes_per_gpu,
)
from autotune.servers.sim.profiles import GPUS, MODELS, find_model
from autotune.servers.sim.scheduler import EngineConfig, SimEngine

H100 = GPUS["h100-80gb"]
L8B = MODELS["llama-3.1-8b"]
L70B = MODELS["llama-3.1-70b"]


def test_kv_capacity_matches_hand_computation() -> None:
    # h100-80gb, llama-3.1-8b, tp=1, gpu_memory_utilization=0.9, block 16:
    #   budget   = 0.9 × 80 GiB                      = 77,309,411,328 B
    #   weights  = 8,030,261,248 params × 2 B       = 16,060,522,496 B
    #   reserve  = 2 GiB                             =  2,147,483,648 B
    #   free     = 77,309,411,328 − 16,060,522,496 − 2,147,483,648 = 59,101,405,184 B
    #   KV/token = 2 × 32 layers × 8 kv heads × 128 head dim × 2 B = 131,072 B
    #   tokens   = 59,101,405,184 / 131,072 = 450,907.8 → 28,181 blocks of 16 = 450,896
    assert kv_bytes_per_token_per_gpu(L8B, 1) == 131_072
    assert weights_bytes_per_gpu(L8B, 1) == 16_060_522_496
    assert kv_capacity_tokens(H100, L8B, 1, 0.9, 16) == 450_896


def test_70b_on_one_h100_does_not_fit() -> None:
    with pytest.raises(InsufficientMemory) as info:
        kv_capacity_tokens(H100, L70B, 1, 0.9, 16)
    message = str(info.value)
    assert message.startswith("No available memory for the cache blocks")
    assert "131.4 GiB per GPU" in message and "leaves 72.0 GiB" in message
    assert "tensor_parallel_size" in message


def test_weights_fit_but_nothing_left_for_kv_blocks() -> None:
    # 70B at TP=2: 65.7 GiB of weights per GPU; 0.84 × 80 GiB = 67.2 GiB < 65.7 + 2 GiB reserve.
    with pytest.raises(InsufficientMemory, match="activations and runtime"):
        kv_capacity_tokens(H100, L70B, 2, 0.84, 16)


def test_70b_fits_at_tp4() -> None:
    # weights/GPU = 141,107,412,992 / 4 = 35,276,853,248 B; free = 77,309,411,328 − that −
    # 2 GiB = 39,885,074,432 B; KV/token/GPU = 2 × 80 × (8/4) × 128 × 2 = 81,920 B
    # → 486,878.3 tokens → 30,429 blocks of 16 = 486,864 tokens.
    assert kv_capacity_tokens(H100, L70B, 4, 0.9, 16) == 486_864


def test_kv_heads_are_replicated_beyond_their_count() -> None:
    assert kv_bytes_per_token_per_gpu(L8B, 16) == kv_bytes_per_token_per_gpu(L8B, 8)


def test_batch_one_decode_is_weight_bandwidth_bound() -> None:
    t = step_time_s(H100, L8B, 1, decode_seqs=1, prefill_tokens=0, context_tokens=500)
    assert 0.005 <= t <= 0.008  # ≈ 150 tokens/s for one sequence


def test_step_time_grows_with_batch_and_context() -> None:
    by_batch = [step_time_s(H100, L8B, 1, b, 0, b * 1000) for b in (1, 8, 64, 256)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    throughput = [b / t for b, t in zip((1, 8, 64, 256), by_batch, strict=True)]
    assert throughput == sorted(throughput)  # batching pays until the roofline bends
    assert step_time_s(H100, L8B, 1, 64, 0, 64 * 4000) > step_time_s(H100, L8B, 1, 64, 0, 64 * 500)
    # A long prefill is compute-bound: 8,192 tokens cost far more than one decode step.
    assert step_time_s(H100, L8B, 1, 0, 8192, 0) > 20 * by_batch[0]


def test_tensor_parallel_cuts_weight_time_but_adds_communication() -> None:
    assert allreduce_time_s(H100, L8B, 1, 1) == 0.0
    assert allreduce_time_s(H100, L8B, 2, 1) > 0.0
    assert allreduce_time_s(H100, L8B, 8, 1) > allreduce_time_s(H100, L8B, 2, 1)
    tp1 = step_time_s(H100, L8B, 1, 1, 0, 500)
    tp2 = step_time_s(H100, L8B, 2, 1, 0, 500)
    assert tp2 < tp1  # half the weights per GPU
    assert tp2 > tp1 / 2 + allreduce_time_s(H100, L8B, 2, 1) / 2  # but not twice as fast


def test_hugging_face_ids_resolve_to_profiles() -> None:
    assert find_model("meta-llama/Llama-3.1-8B-Instruct") is L8B
    assert find_model("gpt-17") is None


# -- the engine ------------------------------------------------------------------------------


def _engine(**overrides: object) -> SimEngine:
    config = EngineConfig(gpu=H100, model=L8B, time_scale=0.0, **overrides)  # type: ignore[arg-type]
    return SimEngine(config)


async def _closed_loop_throughput(
    engine: SimEngine, concurrency: int, prompt: int = 256, output: int = 128
) -> float:
    """Output tokens per simulated second with `concurrency` clients submitting back to back."""

    async def client() -> None:
        while True:
            await engine.submit(prompt, output).finished

    tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
    try:
        while engine.steps < 600:  # warm-up: fill the batch, reach steady state
            await asyncio.sleep(0)
        start = engine.stats()
        while engine.steps < 4000:
            await asyncio.sleep(0)
        end = engine.stats()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    tokens = end.generation_tokens_total - start.generation_tokens_total
    return tokens / (end.sim_time_s - start.sim_time_s)


async def _throughput_curve(levels: tuple[int, ...], **config: object) -> dict[int, float]:
    curve = {}
    for n in levels:
        async with _engine(**config) as engine:
            curve[n] = await _closed_loop_throughput(engine, n)
    return curve


async def test_throughput_rises_then_saturates_at_max_num_seqs() -> None:
    levels = (1, 4, 16, 64, 128, 256)
    capped = await _throughput_curve(levels, max_num_seqs=64)
    # Rises while concurrency ≤ max_num_seqs...
    assert capped[1] < capped[4] < capped[16] < capped[64]
    assert capped[1] == pytest.approx(150, rel=0.1)
    assert capped[64] > 25 * capped[1]
    # ...then extra clients only queue: the plateau is set by max_num_seqs.
    assert capped[128] == pytest.approx(capped[64], rel=0.03)
    assert capped[256] == pytest.approx(capped[64], rel=0.03)
    wider = await _throughput_curve((256,), max_num_seqs=256)
    assert wider[256] > 1.5 * capped[256]


async def test_small_kv_cache_caps_throughput_with_preemptions() -> None:
    # 4,096 KV tokens hold ~10 sequences of 256 + 128 tokens: more clients cannot help.
    levels = (4, 64, 256)
    curve = await _throughput_curve(levels, kv_capacity_tokens=4096)
    roomy = await _throughput_curve((64,))
    assert curve[64] == pytest.approx(curve[256], rel=0.05)
    assert curve[64] < 0.5 * roomy[64]
    async with _engine(kv_capacity_tokens=4096) as engine:
        await _closed_loop_throughput(engine, 64)
        stats = engine.stats()
    assert stats.preemptions_total > 0
    assert stats.running <= 4096 // (256 + 1)


async def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    async with _engine(max_num_batched_tokens=8192) as engine:
        req = engine.submit(20_000, 4)
        await req.first_token
        assert engine.steps == 3  # 8,192 + 8,192 + 3,616 prompt tokens
        assert req.tokens_done() == 1
        await req.finished
        assert req.tokens_done() == 4
        assert engine.steps == 6


async def test_admission_is_fcfs_and_bounded_by_max_num_seqs() -> None:
    async with _engine(max_num_seqs=4) as engine:
        reqs = [engine.submit(16, 1000 - i) for i in range(10)]
        await reqs[0].first_token
        stats = engine.stats()
        assert (stats.running, stats.waiting) == (4, 6)
        assert all(r.tokens_done() == 1 for r in reqs[:4])
        assert all(r.tokens_done() == 0 for r in reqs[4:])
        await reqs[3].finished  # the shortest of the first four finishes first...
        await reqs[4].first_token  # ...and frees the slot for the fifth, not a later one
        assert reqs[5].tokens_done() == 0


async def test_preempted_sequence_recomputes_and_still_delivers_every_token() -> None:
    # Two sequences of 16 + 200 tokens cannot both grow to full length in 300 KV tokens.
    async with _engine(kv_capacity_tokens=300, block_size=16) as engine:
        first, second = engine.submit(16, 200), engine.submit(16, 200)
        await asyncio.gather(first.finished, second.finished)
        stats = engine.stats()
    assert stats.preemptions_total >= 1
    assert first.tokens_done() == second.tokens_done() == 200
    assert stats.generation_tokens_total == 400
    assert stats.prompt_tokens_total == 32  # recomputation is not new prompt traffic
    assert stats.kv_usage == 0 and stats.running == 0


async def test_abort_frees_the_slot_and_the_cache() -> None:
    async with _engine(max_num_seqs=1) as engine:
        hog = engine.submit(100, 100_000 - 200)
        nxt = engine.submit(100, 5)
        await hog.first_token
        assert engine.stats().kv_usage > 0
        hog.abort()
        assert hog.finished.cancelled()
        await nxt.finished
        assert engine.stats().kv_usage == 0


async def test_requests_that_cannot_fit_the_cache_are_refused() -> None:
    async with _engine(kv_capacity_tokens=1024) as engine:
        with pytest.raises(ValueError, match="exceeds the KV cache"):
            engine.submit(1000, 100)


async def test_time_scale_paces_steps_in_real_time() -> None:
    async with _engine() as fast:
        await fast.submit(100, 40).finished
        simulated = fast.sim_time_s
    async with SimEngine(EngineConfig(gpu=H100, model=L8B, time_scale=0.5)) as engine:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await engine.submit(100, 40).finished
        elapsed = loop.time() - t0
    assert engine.sim_time_s == pytest.approx(simulated)
    # Never ahead of the scaled clock; the upper bound leaves room for a busy CI machine.
    assert 0.5 * simulated * 0.9 <= elapsed <= 0.5 * simulated * 3 + 0.05
    assert engine.e2e_latency.count == 1 and engine.e2e_latency.sum == pytest.approx(
        elapsed, abs=0.01
    )


async def test_planted_slowdown_makes_every_later_step_slower() -> None:
    async with _engine() as steady:
        await steady.submit(100, 40).finished
    async with _engine(slow_down_after_s=0.0, slow_down_factor=2.0) as slowed:
        await slowed.submit(100, 40).finished
    async with _engine(slow_down_after_s=3600.0, slow_down_factor=2.0) as not_yet:
        await not_yet.submit(100, 40).finished
    assert slowed.steps == steady.steps == not_yet.steps
    assert slowed.sim_time_s == pytest.approx(2 * steady.sim_time_s)
    assert not_yet.sim_time_s == pytest.approx(steady.sim_time_s)
