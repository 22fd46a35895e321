"""The OpenAI-compatible backend against in-process handlers: retries, 429s, streams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from autotune.backends import ModelCallError
from autotune.backends.openai import OpenAIBackend
from autotune.config import TargetConfig
from autotune.workload import task_from_row
from tests.helpers import ServeApp

TASK = task_from_row(0, {"prompt": "hello", "max_tokens": 3})


def _chat_answer(text: str = "hi") -> dict[str, Any]:
    return {
        "id": "c1",
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }


@pytest.fixture
def serve(serve_app: ServeApp) -> Callable[..., Any]:
    """`await serve(handler)`: an OpenAI-style server whose completion routes call
    `handler`; returns its base URL (ending in /v1)."""

    async def start(handler: Callable[[web.Request], Any]) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        app.router.add_post("/v1/completions", handler)
        return await serve_app(app) + "/v1"

    return start


async def _generate(base_url: str, **target: Any) -> Any:
    config = TargetConfig(base_url=base_url, retry_base_s=0.01, **target)
    async with aiohttp.ClientSession() as session:
        backend = OpenAIBackend(session, config, "m", api_key="sk-secret")
        generation = await backend.generate(TASK)
        return generation, backend.counters


async def test_retry_after_is_honoured_then_succeeds(serve: Callable[..., Any]) -> None:
    calls: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        calls.append(time.monotonic())
        assert request.headers["Authorization"] == "Bearer sk-secret"
        if len(calls) == 1:
            return web.json_response(
                {"error": "slow down"}, status=429, headers={"Retry-After": "0.3"}
            )
        return web.json_response(_chat_answer())

    generation, counters = await _generate(await serve(handler), stream=False)
    assert generation.text == "hi" and generation.attempts == 2
    assert calls[1] - calls[0] >= 0.28
    assert counters.rate_limited_responses == 1 and counters.retry_after_seen == 1


async def test_retries_are_bounded(serve: Callable[..., Any]) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.json_response({"error": "boom"}, status=500)

    with pytest.raises(ModelCallError) as caught:
        await _generate(await serve(handler), stream=False, max_retries=2)
    assert caught.value.failure_class == "http_5xx"
    assert calls == 3


async def test_client_errors_are_not_retried(serve: Callable[..., Any]) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.json_response({"error": "unknown field ignore_eos"}, status=400)

    with pytest.raises(ModelCallError, match="unknown field") as caught:
        await _generate(await serve(handler), stream=False)
    assert caught.value.failure_class == "http_4xx" and calls == 1


async def test_per_request_timeout(serve: Callable[..., Any]) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        import asyncio

        await asyncio.sleep(1)
        return web.json_response(_chat_answer())

    started = time.monotonic()
    with pytest.raises(ModelCallError) as caught:
        await _generate(await serve(handler), stream=False, request_timeout_s=0.2, max_retries=1)
    assert caught.value.failure_class == "timeout"
    assert time.monotonic() - started < 2


async def test_stream_measures_first_token_and_reads_usage(serve: Callable[..., Any]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True  # extra body only because it was asked for
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in ("Hel", "lo"):
            chunk = {"id": "s1", "choices": [{"delta": {"content": piece}, "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        done = {"id": "s1", "choices": [{"delta": {}, "finish_reason": "length"}]}
        usage = {"id": "s1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
        for chunk in (done, usage):
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    generation, _ = await _generate(await serve(handler), extra_body={"ignore_eos": True})
    assert generation.text == "Hello"
    assert generation.finish_reason == "length"
    assert (generation.input_tokens, generation.output_tokens) == (5, 2)
    assert generation.model_start <= generation.first_token <= generation.model_end


async def test_no_extra_fields_unless_asked(serve: Callable[..., Any]) -> None:
    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        assert set(body) == {"model", "prompt", "max_tokens"}
        return web.json_response({"id": "x", "choices": [{"text": "4", "finish_reason": "stop"}]})

    generation, _ = await _generate(await serve(handler), stream=False, api="completions")
    assert generation.text == "4"


async def test_connection_refused_is_classified() -> None:
    with pytest.raises(ModelCallError) as caught:
        await _generate("http://127.0.0.1:9/v1", stream=False, max_retries=1)
    assert caught.value.failure_class == "connection"


async def test_stream_cut_off_mid_answer_is_a_connection_failure(serve: Callable[..., Any]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.content_length = 10_000  # promise more than is sent, then hang up
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
        assert request.transport is not None
        request.transport.close()
        return response

    with pytest.raises(ModelCallError) as caught:
        await _generate(await serve(handler), max_retries=0)
    assert caught.value.failure_class == "connection"


async def test_rpm_limit_paces_requests(serve: Callable[..., Any]) -> None:
    seen: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(time.monotonic())
        return web.json_response(_chat_answer())

    base_url = await serve(handler)
    config = TargetConfig(base_url=base_url, stream=False, rpm=600)  # 10 a second
    async with aiohttp.ClientSession() as session:
        backend = OpenAIBackend(session, config, "m")
        await asyncio.gather(*(backend.generate(TASK) for _ in range(25)))
    # A burst of at most one second's quota, then 10 a second: 25 requests span ≥ 1.5 s.
    assert seen[-1] - seen[0] >= 1.4
    assert sum(1 for t in seen if t - seen[0] < 0.5) <= 16  # 10 at once, then 10 a second
    assert backend.counters.limiter_wait_s > 0


async def test_error_event_mid_stream_is_a_failure_not_a_rollout(serve: Callable[..., Any]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "par"}}]}\n\n')
        await response.write(b'data: {"error": {"message": "engine dead", "code": 500}}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    with pytest.raises(ModelCallError, match="engine dead") as caught:
        await _generate(await serve(handler))
    assert caught.value.failure_class == "bad_response"


async def test_non_object_chunk_is_a_bad_response(serve: Callable[..., Any]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: null\n\n")
        return response

    with pytest.raises(ModelCallError) as caught:
        await _generate(await serve(handler))
    assert caught.value.failure_class == "bad_response"


@pytest.mark.slow
async def test_slow_rpm_and_big_tpm_requests_are_paced_not_refused(
    serve: Callable[..., Any],
) -> None:
    seen: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(time.monotonic())
        return web.json_response(_chat_answer())

    base_url = await serve(handler)
    # 30 a minute: one request now, the next 2 s later; each asks 3 + 1 tokens of a 120/min
    # budget whose bucket holds 2: paid in parts, never refused.
    config = TargetConfig(base_url=base_url, stream=False, rpm=30, tpm=120)
    async with aiohttp.ClientSession() as session:
        backend = OpenAIBackend(session, config, "m")
        await asyncio.gather(*(backend.generate(TASK) for _ in range(2)))
    assert 1.8 <= seen[1] - seen[0] < 4
