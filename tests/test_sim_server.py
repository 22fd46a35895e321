"""The simulated server's HTTP surface, served in-process on a free port."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from autotune.errors import UsageError
from autotune.servers.sim.server import load_config, serve_in_process

FAST = ["--port", "0", "--time-scale", "0.01"]
MODEL = "sim/llama-3.1-8b"
LABEL = f'{{engine="0",model_name="{MODEL}"}}'  # vLLM's labels, sorted as prometheus_client does


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    async with serve_in_process(FAST) as url:
        yield url


def _root(base: str) -> str:
    return base.removesuffix("/v1")


async def _sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """The `data:` payloads of an SSE stream, decoded, with the final `[DONE]` kept as a str."""
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def _metrics(text: str) -> dict[str, float]:
    """Sample name (with labels) → value."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


async def test_health_models_and_simulated_marking(
    base_url: str, session: aiohttp.ClientSession
) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", base_url)
    async with session.get(_root(base_url) + "/health") as resp:
        assert resp.status == 200
        assert resp.headers["x-autotune-simulated"] == "true"
    async with session.get(base_url + "/models") as resp:
        body = await resp.json()
        assert resp.headers["x-autotune-simulated"] == "true"
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == 8192
    assert body["data"][0]["data_parallel_size"] == 1
    async with session.get(_root(base_url) + "/nowhere") as resp:
        assert resp.status == 404
        assert resp.headers["x-autotune-simulated"] == "true"


async def test_chat_non_stream_counts_tokens(base_url: str, session: aiohttp.ClientSession) -> None:
    messages = [
        {"role": "system", "content": "x" * 10},
        {"role": "user", "content": [{"type": "text", "text": "y" * 7}, {"type": "image_url"}]},
    ]
    payload = {"model": MODEL, "messages": messages, "max_tokens": 12, "ignore_eos": True}
    async with session.post(base_url + "/chat/completions", json=payload) as resp:
        assert resp.status == 200
        assert resp.headers["x-autotune-simulated"] == "true"
        body = await resp.json()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert choice["message"] == {"role": "assistant", "content": "tok " * 12}
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}


async def test_natural_stop_is_deterministic_and_below_max_tokens(
    session: aiohttp.ClientSession,
) -> None:
    payload = {"model": MODEL, "prompt": "hello world", "max_tokens": 5000}
    async with serve_in_process([*FAST, "--natural-output-tokens", "8"]) as url:
        results = []
        for _ in range(2):
            async with session.post(url + "/completions", json=payload) as resp:
                results.append(await resp.json())
    first, second = (r["choices"][0] for r in results)
    assert first["finish_reason"] == "stop"
    assert first["text"] == second["text"]
    assert 1 <= results[0]["usage"]["completion_tokens"] < 100


async def test_completions_stream_with_usage(base_url: str, session: aiohttp.ClientSession) -> None:
    payload = {
        "model": MODEL,
        "prompt": "abcdefghi",  # 9 characters → 3 tokens
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with session.post(base_url + "/completions", json=payload) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["x-autotune-simulated"] == "true"
        events = await _sse(resp)
    assert events[-1] == "[DONE]"
    usage_chunk, chunks = events[-2], events[:-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": 40, "total_tokens": 43}
    assert "".join(c["choices"][0]["text"] for c in chunks) == "tok " * 40
    assert chunks[0]["choices"][0]["text"] == "tok "  # the first token goes out on its own
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all(c["object"] == "text_completion" for c in chunks)


async def test_chat_stream_without_usage(base_url: str, session: aiohttp.ClientSession) -> None:
    payload = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 6,
        "ignore_eos": True,
        "stream": True,
    }
    async with session.post(base_url + "/chat/completions", json=payload) as resp:
        events = await _sse(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "tok " * 6
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (orjson.dumps({"messages": "hi"}), 400, "messages"),
        (orjson.dumps({"model": "gpt-9", "messages": [{"content": "x"}]}), 404, "gpt-9"),
        (orjson.dumps({"messages": [{"content": "x"}], "max_tokens": 0}), 400, "max_tokens"),
        (
            orjson.dumps({"messages": [{"content": "x" * 4 * 8000}], "max_tokens": 500}),
            400,
            "maximum context length is 8192 tokens. However, you requested 8500 tokens",
        ),
    ],
)
async def test_bad_requests_get_vllm_like_errors(
    base_url: str, session: aiohttp.ClientSession, body: bytes, status: int, fragment: str
) -> None:
    headers = {"Content-Type": "application/json"}
    async with session.post(base_url + "/chat/completions", data=body, headers=headers) as resp:
        assert resp.status == status
        assert resp.headers["x-autotune-simulated"] == "true"
        error = (await resp.json())["error"]
    assert fragment in error["message"] and error["code"] == status


async def test_rate_limit_answers_429_with_retry_after(session: aiohttp.ClientSession) -> None:
    payload = {"prompt": "x", "max_tokens": 1}
    async with serve_in_process([*FAST, "--max-request-rate", "2"]) as url:
        statuses = []
        for _ in range(4):
            async with session.post(url + "/completions", json=payload) as resp:
                statuses.append(resp.status)
                if resp.status == 429:
                    limited = resp
                    error = (await resp.json())["error"]
    assert statuses[:2] == [200, 200] and 429 in statuses[2:]  # a 2-request burst, then limited
    assert limited.headers["Retry-After"] == "1"
    assert 0 < int(limited.headers["retry-after-ms"]) <= 500
    assert error["type"] == "rate_limit_error"


async def test_metrics_match_tokens_served(base_url: str, session: aiohttp.ClientSession) -> None:
    prompts = ["a" * 40, "b" * 41, "c" * 400]
    served_prompt = served_output = 0

    async def one(i: int, prompt: str) -> None:
        nonlocal served_prompt, served_output
        payload = {"prompt": prompt, "max_tokens": 20 + i}
        async with session.post(base_url + "/completions", json=payload) as resp:
            usage = (await resp.json())["usage"]
        served_prompt += usage["prompt_tokens"]
        served_output += usage["completion_tokens"]

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    assert served_prompt == 10 + 11 + 100
    async with session.get(_root(base_url) + "/metrics") as resp:
        assert resp.headers["x-autotune-simulated"] == "true"
        text = await resp.text()
    m = _metrics(text)
    label = LABEL
    assert m["vllm:prompt_tokens_total" + label] == served_prompt
    assert m["vllm:generation_tokens_total" + label] == served_output
    assert m["vllm:num_requests_running" + label] == 0
    assert m["vllm:num_requests_waiting" + label] == 0
    assert m["vllm:kv_cache_usage_perc" + label] == 0
    assert m["vllm:num_preemptions_total" + label] == 0
    assert m["autotune_simulated"] == 1
    for hist in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        name = f"vllm:{hist}_seconds"
        assert m[f"{name}_count{label}"] == 3
        assert m[f'{name}_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}}'] == 3
        assert m[f"{name}_sum{label}"] >= 0
    assert "# TYPE vllm:num_preemptions counter" in text
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in text


async def test_many_concurrent_streams_complete() -> None:
    """256 streams at once: every token arrives and the batch really holds them together.
    In real time (a second a stream): the client and the server share this event loop,
    and at 0.2 a loaded host's slow loop could let the first streams end before the last
    were sent."""
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        serve_in_process(["--port", "0", "--time-scale", "1"]) as url,
    ):
        payload = {"prompt": "p" * 400, "max_tokens": 64, "ignore_eos": True, "stream": True}
        label = LABEL

        async def one() -> str:
            async with session.post(url + "/completions", json=payload) as resp:
                events = await _sse(resp)
            return "".join(e["choices"][0]["text"] for e in events[:-1])

        async def peak_running() -> float:
            peak = 0.0
            while True:
                async with session.get(_root(url) + "/metrics") as resp:
                    m = _metrics(await resp.text())
                peak = max(peak, m["vllm:num_requests_running" + label])
                if m["vllm:e2e_request_latency_seconds_count" + label] == 256:
                    return peak

        monitor = asyncio.create_task(peak_running())
        texts = await asyncio.gather(*(one() for _ in range(256)))
        peak = await monitor
    assert all(t == "tok " * 64 for t in texts)
    assert peak > 200


async def test_client_disconnect_aborts_the_request(session: aiohttp.ClientSession) -> None:
    async with serve_in_process(["--port", "0", "--time-scale", "1"]) as url:
        payload = {"prompt": "x", "max_tokens": 5000, "ignore_eos": True, "stream": True}
        async with session.post(url + "/completions", json=payload) as resp:
            await resp.content.readline()  # the first token's chunk
        running = "vllm:num_requests_running" + LABEL
        deadline = asyncio.get_running_loop().time() + 5
        while asyncio.get_running_loop().time() < deadline:
            async with session.get(_root(url) + "/metrics") as resp:
                if _metrics(await resp.text())[running] == 0:
                    break
        else:
            pytest.fail("the request kept running after its client left")


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--model", "llama-3.1-70b"], "No available memory"),
        (["--gpu", "b300"], "Known profiles: h100-80gb, h200, a100-80gb"),
        (["--block-size", "24"], "Invalid block size 24"),
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "must be greater than"),
        (["--gpu-memory-utilization", "0.22"], "max seq len (8192) is larger than"),
        (["--tensor-parallel-size", "3"], "divisible by tensor parallel size (3)"),
        (["--max-num-seqs", "many"], "invalid int value"),
    ],
)
async def test_invalid_flags_are_refused_before_serving(flags: list[str], fragment: str) -> None:
    with pytest.raises(UsageError, match=re.escape(fragment)):
        async with serve_in_process(["--port", "0", *flags]):
            pytest.fail("served despite invalid flags")


async def test_die_after_requests_is_refused_in_process() -> None:
    with pytest.raises(UsageError, match="subprocess"):
        async with serve_in_process(["--port", "0", "--die-after-requests", "1"]):
            pass


def test_unknown_vllm_flags_are_kept_for_a_warning() -> None:
    config = load_config(["--dtype", "bfloat16", "--swap-space", "4", "--max-num-seqs", "8"])
    assert config.ignored_flags == ("--dtype", "bfloat16", "--swap-space", "4")
    assert config.max_num_seqs == 8
    assert config.served_model_name == MODEL
    assert load_config(["--served-model-name", "mine"]).served_model_name == "sim/mine"
    assert math.isclose(load_config([]).time_scale, 1.0)
