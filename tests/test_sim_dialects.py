"""The simulated server in SGLang's and TensorRT-LLM's dialects, each started in-process from
the very line `Engine.launch_line` writes: its metric names and figures, its knob flags,
its request checks and its RL endpoints."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from autotune.cli.sim import split_sim_serve
from autotune.engines import ENGINES, Engine
from autotune.engines.description import (
    GENERATION_TOKENS,
    HISTOGRAMS,
    PROMPT_TOKENS,
    RUNNING,
    TTFT,
    WAITING,
)
from autotune.hardware.memory import RUNTIME_RESERVE_BYTES, kv_bytes_per_token_per_gpu
from autotune.hardware.profiles import GPUS, MODELS
from autotune.servers.sim.server import _start_up_lines, load_config, serve_in_process
from autotune.telemetry.prometheus import (
    KV_CAPACITY_TOKENS,
    as_quantities,
    iteration_stats,
    parse_prometheus,
)

SIM = (sys.executable, "-m", "autotune.servers.sim")
MODEL = "llama-3.1-8b"
LONG = {"prompt": "p" * 40, "max_tokens": 8000, "ignore_eos": True, "stream": True}
Metrics = dict[str, float]


def launch(
    engine: Engine, knobs: Mapping[str, object], scale: float = 0.01, **kw: Any
) -> list[str]:
    """The simulator's flags: the line `engine.launch_line` writes, less the program."""
    command = [*SIM, "--engine", engine.name, "--time-scale", str(scale)]
    line = engine.launch_line(command, MODEL, knobs, port=0, host="127.0.0.1", **kw)
    return line[len(SIM) :]


class Server:
    """A served simulator: its root URL, a client session and its engine's metrics."""

    def __init__(self, engine: Engine, root: str, session: aiohttp.ClientSession) -> None:
        self.engine, self.root, self.session = engine, root, session

    async def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, the answer: JSON decoded, else its text)."""
        async with self.session.post(self.root + path, json=body) as resp:
            text = await resp.text()
        is_json = resp.content_type == "application/json"
        return resp.status, orjson.loads(text) if is_json else text

    async def text(self, path: str) -> str:
        async with self.session.get(self.root + path) as resp:
            assert resp.status == 200, path
            return await resp.text()

    async def metrics(self) -> Metrics:
        return parse_prometheus(await self.text(self.engine.metrics.path))

    async def until(self, check: Callable[[Metrics], bool], timeout: float = 15) -> Metrics:
        """Scrape until `check` holds; fails after `timeout` seconds."""
        deadline = asyncio.get_running_loop().time() + timeout
        metrics: Metrics = {}
        while asyncio.get_running_loop().time() < deadline:
            if check(metrics := await self.metrics()):
                return metrics
        pytest.fail(f"{self.engine.name}: not reached within {timeout} s: {metrics}")

    async def steady(self, name: str, seconds: float) -> bool:
        """Whether metric `name` keeps its value while scraped for `seconds`."""
        first = (await self.metrics())[name]
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline:
            if (await self.metrics())[name] != first:
                return False
        return True

    async def stream(self, body: Mapping[str, Any]) -> tuple[int, str]:
        """(tokens received, final finish_reason) of one streamed completion."""
        tokens, reason = 0, ""
        async with self.session.post(self.root + "/v1/completions", json=body) as resp:
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    choice = orjson.loads(line.removeprefix("data: "))["choices"][0]
                    tokens += choice["text"].count("tok ")
                    reason = choice["finish_reason"] or reason
        return tokens, reason


@asynccontextmanager
async def serving(engine: Engine, args: list[str]) -> AsyncIterator[Server]:
    async with serve_in_process(args) as url, aiohttp.ClientSession() as session:
        yield Server(engine, url.removesuffix("/v1"), session)


@pytest.mark.parametrize("name", ["sglang", "trtllm"])
async def test_metrics_in_the_engines_names_carry_the_served_figures(name: str) -> None:
    engine = ENGINES[name]
    async with serving(engine, launch(engine, {"max_model_len": 4096})) as server:
        received = prompt = 0
        for text in ("a" * 40, "b" * 400, "b" * 400):
            request = {"prompt": text, "max_tokens": 9, "ignore_eos": True}
            status, body = await server.post("/v1/completions", request)
            assert status == 200
            received += body["usage"]["completion_tokens"]
            prompt += body["usage"]["prompt_tokens"]
        received += (await server.stream({**LONG, "max_tokens": 30}))[0]
        text = await server.text(engine.metrics.path)
    metrics = parse_prometheus(text)
    for quantity, metric in engine.metrics.names.items():
        histogram = [metric + "_sum", metric + "_count", metric + '_bucket{le="+Inf"}']
        assert all(n in metrics for n in (histogram if quantity in HISTOGRAMS else [metric]))
    assert not any(line.startswith("vllm:") for line in text.splitlines())
    names = engine.metrics.names
    assert metrics[names[GENERATION_TOKENS]] == received == 3 * 9 + 30
    assert metrics[names[PROMPT_TOKENS]] == prompt + 10 and metrics[names[TTFT] + "_count"] == 4
    read = as_quantities(metrics, engine)  # as autotune's telemetry reads a real server
    assert read[GENERATION_TOKENS] == received and read["autotune_simulated"] == 1
    assert read["autotune_pauses_total"] == read["autotune_weight_updates_total"] == 0
    config = load_config(launch(engine, {"max_model_len": 4096}))
    assert config.max_model_len == 4096
    if engine.metrics.kv_capacity is not None:
        assert read[KV_CAPACITY_TOKENS] == config.kv_capacity_tokens
    if name == "sglang":  # one family gives prompt tokens and prefix-cache queries: once
        assert text.count("# TYPE sglang:prompt_tokens counter") == 1
        assert metrics["sglang:cached_tokens_total"] == 96  # six blocks of the 100-token prompt


@pytest.mark.parametrize("name", ["sglang", "trtllm"])
async def test_max_running_requests_caps_the_running_batch(name: str) -> None:
    engine = ENGINES[name]
    running, waiting = engine.metrics.names[RUNNING], engine.metrics.names[WAITING]
    async with serving(engine, launch(engine, {"max_num_seqs": 2}, scale=0.05)) as server:
        body = {**LONG, "max_tokens": 1500}
        streams = [asyncio.create_task(server.stream(body)) for _ in range(3)]
        peak = 0.0

        def full(m: Metrics) -> bool:
            nonlocal peak
            peak = max(peak, m[running])
            return m[running] == 2 and m[waiting] == 1

        await server.until(full)
        results = await asyncio.gather(*streams)
        idle = await server.metrics()
    assert peak == 2 and results == [(1500, "length")] * 3
    assert idle[running] == idle[waiting] == 0


async def test_sglang_pause_modes_flush_and_weight_updates() -> None:
    engine = ENGINES["sglang"]
    args = launch(engine, {"max_num_seqs": 2, "enable_prefix_caching": False}, scale=0.05)
    assert "--disable-radix-cache" in args and "--max-running-requests" in args
    async with serving(engine, args) as server:
        streams = [asyncio.create_task(server.stream(LONG)) for _ in range(3)]
        await server.until(lambda m: m["sglang:num_running_reqs"] == 2)
        paused = await server.post("/pause_generation", {"mode": "in_place"})
        assert paused == (200, {"message": "Generation paused successfully.", "status": "ok"})
        # ~1,000 steps' worth of real time at this scale, and not one token comes
        assert await server.steady("sglang:generation_tokens_total", 0.3)
        frozen = await server.metrics()
        assert frozen["sglang:num_running_reqs"] == 2 and frozen["sglang:num_queue_reqs"] == 1
        assert (await server.post("/flush_cache"))[0] == 400  # requests are inside

        assert (await server.post("/pause_generation", {"mode": "retract"}))[0] == 200
        retracted = await server.metrics()  # running sent back to wait, their KV freed
        assert retracted["sglang:num_running_reqs"] == retracted["sglang:token_usage"] == 0
        assert retracted["sglang:num_queue_reqs"] == 3
        assert retracted["sglang:num_retracted_requests_total"] == 2
        assert (await server.post("/flush_cache"))[0] == 400  # still waiting

        status, body = await server.post("/update_weights_from_disk", {"model_path": MODEL})
        assert status == 200 and body["success"] is True and body["num_paused_requests"] == 3
        assert (await server.post("/continue_generation"))[0] == 200
        await server.until(
            lambda m: (
                m["sglang:num_running_reqs"] == 2
                and m["sglang:generation_tokens_total"] > frozen["sglang:generation_tokens_total"]
            )
        )
        assert (await server.post("/pause_generation"))[0] == 200  # no body: abort
        results = await asyncio.gather(*streams)
        done = await server.until(lambda m: m["sglang:num_aborted_requests_total"] == 3)
        flushed = await server.post("/flush_cache")  # idle now
        assert (await server.post("/pause_generation", {"mode": "drain"}))[0] == 400
        for path in ("/release_memory_occupation", "/resume_memory_occupation"):
            assert await server.post(path, {"tags": ["kv_cache", "weights"]}) == (200, None)
        info = orjson.loads(await server.text("/get_server_info"))
        model = orjson.loads(await server.text("/get_model_info"))
        assert (await server.post("/pause"))[0] == 404  # vLLM's endpoints are not SGLang's
    assert [reason for _, reason in results] == ["abort"] * 3
    never_admitted, *ran = sorted(tokens for tokens, _ in results)  # the cap held it back
    assert never_admitted == 0 and all(0 < tokens < 8000 for tokens in ran)
    assert flushed[0] == 200 and flushed[1].startswith("Cache flushed.")
    assert done["autotune_pauses_total"] == 3 and done["autotune_weight_updates_total"] == 1
    assert info["max_running_requests"] == 2 and info["disable_radix_cache"] is True
    assert model["model_path"] == MODEL


async def test_vllm_pause_and_weight_update_are_counted() -> None:
    engine = ENGINES["vllm"]
    async with serving(engine, launch(engine, {})) as server:
        for path in ("/pause?mode=keep", "/resume", "/update_weights", "/pause?mode=abort"):
            assert (await server.post(path, {}))[0] == 200
        metrics = await server.metrics()
    assert metrics["autotune_pauses_total"] == 2 and metrics["autotune_weight_updates_total"] == 1


async def test_trtllm_refuses_unknown_fields_and_serves_its_rl_endpoints() -> None:
    engine = ENGINES["trtllm"]
    async with serving(engine, launch(engine, {})) as server:
        ok = {"prompt": "hi", "max_tokens": 7, "ignore_eos": True, "top_k": 5, "seed": 1}
        assert (await server.post("/v1/completions", ok))[1]["usage"]["completion_tokens"] == 7
        # vLLM's own field, which TensorRT-LLM's request models forbid
        status, refused = await server.post("/v1/completions", {**ok, "return_token_ids": True})
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "prompt": "x"}
        chat_status, chat_refused = await server.post("/v1/chat/completions", chat)
        for path in ("/release_memory", "/resume_memory", "/update_weights"):
            assert await server.post(path) == (200, {"status": "success"})
        assert (await server.post("/pause_generation"))[0] == 404  # it has no pause
        version = orjson.loads(await server.text("/version"))
        models = orjson.loads(await server.text("/v1/models"))
        metrics = await server.metrics()
    assert status == 400 and "extra_forbidden" in refused["error"]
    assert "('body', 'return_token_ids')" in refused["error"]
    assert chat_status == 400 and "('body', 'prompt')" in chat_refused["error"]
    assert metrics["autotune_weight_updates_total"] == 1 and metrics["autotune_pauses_total"] == 0
    assert "version" in version and "max_model_len" not in models["data"][0]


def expected_kv_tokens(share: float) -> int:
    """TensorRT-LLM's KV cache for `share` of the memory the weights leave free, less the
    simulator's runtime reserve, in whole 16-token blocks (one H100, Llama 3.1 8B)."""
    gpu, model = GPUS["h100-80gb"], MODELS[MODEL]
    free = share * (gpu.memory_bytes - model.weight_bytes) - RUNTIME_RESERVE_BYTES
    return int(free // (kv_bytes_per_token_per_gpu(model, 1) * 16)) * 16


async def test_trtllm_kv_share_and_options_file_size_the_cache(tmp_path: Path) -> None:
    engine = ENGINES["trtllm"]
    default, half = (
        load_config(launch(engine, knobs)).kv_capacity_tokens
        for knobs in ({}, {"kv_cache_free_gpu_memory_fraction": 0.5})
    )
    assert abs(default - expected_kv_tokens(0.9)) <= 16  # one block of rounding
    assert abs(half - expected_kv_tokens(0.5)) <= 16
    options = engine.options({"enable_prefix_caching": False})
    options["kv_cache_config"]["free_gpu_memory_fraction"] = 0.5
    options["cuda_graph_config"] = {"max_batch_size": 8}
    path = tmp_path / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    knobs = {"kv_cache_free_gpu_memory_fraction": 0.9}  # the file wins, as in TensorRT-LLM
    args = launch(engine, knobs, options_file=str(path))
    config = load_config(args)
    assert config.kv_capacity_tokens == half and config.enable_prefix_caching is False
    assert config.ignored_flags == (f"{path}:cuda_graph_config.max_batch_size",)
    reused = {}
    for label, flags in (("file", args), ("default", launch(engine, {}))):
        async with serving(engine, flags) as server:
            for _ in range(2):  # the same 100-token prompt twice
                await server.post("/v1/completions", {"prompt": "q" * 400, "max_tokens": 2})
            text = await server.text("/metrics")  # its JSON iteration stats
        stats, read = orjson.loads(text)[-1], iteration_stats(text)
        capacity = load_config(flags).kv_capacity_tokens
        assert {"iterLatencyMS", "numActiveRequests", "numQueuedRequests"} <= stats.keys()
        assert stats["iterLatencyMS"] > 0 and stats["inflightBatchingStats"]["numGenRequests"] == 0
        kv = stats["kvCacheStats"]
        assert kv["maxNumBlocks"] * kv["tokensPerBlock"] == capacity
        assert read is not None and read[KV_CAPACITY_TOKENS] == capacity  # as autotune reads it
        reused[label] = kv["reusedBlocks"]
    assert reused == {"file": 0, "default": 6}


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
def test_the_launch_line_reads_the_same_through_autotune_sim_serve(name: str) -> None:
    engine = ENGINES[name]
    knobs = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "tensor_parallel_size": 2}
    line = engine.launch_line(("autotune", "sim", "serve", "--engine", name), MODEL, knobs)
    _, sim_args = split_sim_serve(line[1:])
    config = load_config(sim_args)
    assert (config.engine, config.max_num_seqs, config.max_num_batched_tokens) == (engine, 8, 1024)
    assert config.tensor_parallel_size == 2 and config.ignored_flags == ()
    title = f"simulated {engine.title}-like server"
    assert _start_up_lines(config, 8000)[0].startswith(f"INFO: {title} (SIMULATED, h100-80gb")
