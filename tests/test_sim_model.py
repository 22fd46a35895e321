"""The simulator's performance model and its continuous-batching engine, without HTTP."""

from __future__ import annotations

import asyncio

import pytest

from autotune.engine_model.perf_model import allreduce_time_s, step_time_s
from autotune.engine_model.scheduler import SimEngine
from autotune.engine_model.state import EngineConfig
from autotune.hardware.memory import (
    InsufficientMemory,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    weights_bytes_per_gpu,
)
from autotune.hardware.profiles import GPUS, MODELS, find_model

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


# -- prefix caching --------------------------------------------------------------------------
#
# A GRPO group: 8 rollouts of one task share a 2,000-token prompt; block 16. What a hit can
# reuse is the prompt's whole blocks short of its last token (vLLM recomputes at least the
# last one for its logits): ⌊(2,000 − 1) ÷ 16⌋ × 16 = 124 × 16 = 1,984 tokens, so a hit
# computes 2,000 − 1,984 = 16. The first of the group computes all 2,000, the other 7
# compute 16 each: 2,000 + 7 × 16 = 2,112 prefill tokens instead of 8 × 2,000 = 16,000, and
# 7 × 1,984 = 13,888 tokens are hits.

GROUP = 8
PROMPT = 2000
SHARED = 1984


async def test_a_group_prefilled_in_turn_computes_its_prompt_once() -> None:
    async with _engine() as engine:
        first = engine.submit(PROMPT, 10, prefix_key="task")
        await first.first_token  # its prefill has completed before the others arrive
        rest = [engine.submit(PROMPT, 10, prefix_key="task") for _ in range(GROUP - 1)]
        await asyncio.gather(first.finished, *(r.finished for r in rest))
        stats = engine.stats()
    assert stats.prefill_tokens_computed_total == 2000 + 7 * 16 == 2112
    assert stats.prefix_cache_hits_total == 7 * 1984 == 13_888
    assert stats.prefix_cache_queries_total == 8 * 2000  # every prompt token is looked up


async def test_a_group_arriving_at_once_shares_from_its_first_step() -> None:
    # vLLM caches a prompt's blocks when it schedules them, so the 7 requests scheduled
    # after the first in the same step already hit (the forward pass writes each layer's
    # KV before attention reads it). All 8 fit one step: 2,112 ≤ 8,192 batched tokens.
    async with _engine() as engine:
        group = [engine.submit(PROMPT, 10, prefix_key="task") for _ in range(GROUP)]
        await group[-1].first_token
        assert engine.steps == 1
        await asyncio.gather(*(r.finished for r in group))
        stats = engine.stats()
    assert stats.prefill_tokens_computed_total == 2112
    assert stats.prefix_cache_hits_total == 13_888


async def test_without_prefix_caching_every_prompt_is_computed() -> None:
    async with _engine(enable_prefix_caching=False) as engine:
        group = [engine.submit(PROMPT, 10, prefix_key="task") for _ in range(GROUP)]
        await asyncio.gather(*(r.finished for r in group))
        stats = engine.stats()
    assert stats.prefill_tokens_computed_total == 8 * 2000 == 16_000
    assert stats.prefix_cache_hits_total == 0
    assert stats.prefix_cache_queries_total == 0  # vLLM looks nothing up when it is off


@pytest.mark.parametrize(
    ("caching", "used"),
    [
        # 1,984 shared tokens once + each request's own 16 uncached prompt tokens and its
        # first output token's slot, 17 × 8 + half a block (8) per sequence × 8:
        (True, 1984 + 17 * 8 + 8 * 8),  # = 2,184
        # Uncached, 16,000 tokens take two steps of 8,192 (4 prompts and 192 tokens of the
        # 5th, then the rest), so the first 4 have also decoded once: (2,000 + 1) × 8 + 4
        # + 8 × 8:
        (False, 2001 * 8 + 4 + 8 * 8),  # = 16,076
    ],
)
async def test_kv_usage_counts_a_shared_prefix_once(caching: bool, used: int) -> None:
    async with _engine(kv_capacity_tokens=100_000, enable_prefix_caching=caching) as engine:
        group = [engine.submit(PROMPT, 100, prefix_key="task") for _ in range(GROUP)]
        await group[-1].first_token
        assert engine.steps == (1 if caching else 2)
        assert engine.stats().kv_usage == pytest.approx(used / 100_000)
        await asyncio.gather(*(r.finished for r in group))
        # Nobody holds the prefix now: it stays cached but counts as free, as in vLLM.
        assert engine.stats().kv_usage == 0
        await engine.submit(PROMPT, 1, prefix_key="task").finished
        assert engine.stats().prefix_cache_hits_total == (8 * 1984 if caching else 0)


async def test_decode_attention_still_reads_the_shared_prefix() -> None:
    # Sharing saves prefill only. Step 1 runs 2,112 prefill tokens whose attention reads
    # all 8 × 2,000 prompt tokens; steps 2 and 3 decode 8 sequences of 2,001 and 2,002
    # tokens (8 × 2,001 = 16,008 and 16,016 context tokens); all finish after 3 tokens.
    async with _engine() as engine:
        group = [engine.submit(PROMPT, 3, prefix_key="task") for _ in range(GROUP)]
        await asyncio.gather(*(r.finished for r in group))
    assert engine.steps == 3
    expected = (
        step_time_s(H100, L8B, 1, decode_seqs=0, prefill_tokens=2112, context_tokens=16_000)
        + step_time_s(H100, L8B, 1, decode_seqs=8, prefill_tokens=0, context_tokens=16_008)
        + step_time_s(H100, L8B, 1, decode_seqs=8, prefill_tokens=0, context_tokens=16_016)
    )
    assert engine.sim_time_s == pytest.approx(expected)


async def test_free_cached_prefixes_are_evicted_least_recently_released_first() -> None:
    # 5,000 KV tokens. "a" then "b" run alone and leave 1,984 cached tokens each (3,968
    # free-cached). "c" needs 2,001 + 8: 2,009 + 3,968 > 5,000, so the older "a" goes and
    # "b" stays (2,009 + 1,984 ≤ 5,000). Then "b" hits and "a" misses.
    async with _engine(kv_capacity_tokens=5000) as engine:
        for key in ("a", "b", "c"):
            await engine.submit(PROMPT, 10, prefix_key=key).finished
        assert engine.stats().prefix_cache_hits_total == 0
        await engine.submit(PROMPT, 10, prefix_key="b").finished
        assert engine.stats().prefix_cache_hits_total == 1984
        await engine.submit(PROMPT, 10, prefix_key="a").finished
        stats = engine.stats()
    assert stats.prefix_cache_hits_total == 1984
    assert stats.prefill_tokens_computed_total == 4 * 2000 + 16


async def test_a_preempted_request_hits_again_when_readmitted() -> None:
    # 400 KV tokens, two requests of a 160-token prompt (shared: ⌊159 ÷ 16⌋ × 16 = 144),
    # 200 output tokens each, admitted together: 144 + 2 × 17 + 2 × 8 = 194 tokens after
    # step 1, then 2 more a step: 192 + 2s after step s. Planning step s + 1 needs
    # 192 + 2s + 2 ≤ 400, false from s = 104: the later one is preempted with 104 tokens
    # out and released. It comes back once the first finishes (step 200; the first alone
    # needs 144 + 16 + 200 + 8 = 368), hits the 144 cached tokens again and recomputes
    # 160 + 104 − 144 = 120. Prefill: 160 + 16 + 120 = 296 (not 160 + 16 + 264 = 440).
    async with _engine(kv_capacity_tokens=400) as engine:
        first = engine.submit(160, 200, prefix_key="task")
        second = engine.submit(160, 200, prefix_key="task")
        await asyncio.gather(first.finished, second.finished)
        stats = engine.stats()
    assert stats.preemptions_total == 1
    assert second.tokens_done() == 200
    assert stats.prefill_tokens_computed_total == 296
    assert stats.prefix_cache_hits_total == 144  # a re-lookup is not counted, as in vLLM


async def test_abort_releases_the_shared_prefix() -> None:
    async with _engine() as engine:
        group = [engine.submit(PROMPT, 10_000, prefix_key="task") for _ in range(2)]
        await group[-1].first_token
        for req in group:
            req.abort()
        assert engine.stats().kv_usage == 0
        await engine.submit(PROMPT, 1, prefix_key="task").finished
        assert engine.stats().prefix_cache_hits_total == 2 * 1984
