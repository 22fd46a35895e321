"""The OpenAI-compatible backend against in-process handlers: retries, 429s, streams."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from autotune.config.collection import TargetConfig
from autotune.errors import ServerUnreachable
from autotune.rollout.backends import ModelCallError
from autotune.rollout.backends.openai import OpenAIBackend, _Stream, retry_after_s
from autotune.rollout.target import resolve_target
from autotune.rollout.workload import task_from_row
from tests.faults import answer_text, fault_app
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


async def test_a_503_without_retry_after_counts_as_an_overload(serve: Callable[..., Any]) -> None:
    """A server shedding load (503, no Retry-After) is what adaptive concurrency backs off
    on, as much as a 429; a 500 is not."""
    statuses = [503, 500]

    async def handler(request: web.Request) -> web.Response:
        if statuses:
            return web.json_response({"error": "busy"}, status=statuses.pop(0))
        return web.json_response(_chat_answer())

    generation, counters = await _generate(await serve(handler), stream=False)
    assert generation.attempts == 3
    assert counters.unavailable_responses == 1 and counters.overloads == 1
    assert counters.rate_limited_responses == 0 and counters.retry_after_seen == 0


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
        started = time.monotonic()
        await asyncio.gather(*(backend.generate(TASK) for _ in range(25)))
    # A burst of at most one second's quota, then 10 a second: the 25th request leaves
    # 1.5 s after the first could (timed from the start: the first to arrive may have
    # waited for its connection, which a span from it would take off).
    assert seen[-1] - started >= 1.4
    assert sum(1 for t in seen if t - started < 0.5) <= 16  # 10 at once, then 10 a second
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


# -- issue 10: whatever a server sends, a failed attempt or a whole answer -----------------

CLASS_OF_FAULT = {
    "truncate": ("truncated", "bad_response"),  # (streamed, not streamed)
    "close": ("connection", "connection"),
    "invalid_json": ("bad_response", "bad_response"),
    "usage_str": ("bad_response", "bad_response"),
    "choices_str": ("bad_response", "bad_response"),
    "choice_int": ("bad_response", "bad_response"),
    "message_null": (None, "bad_response"),  # a stream has no message
    "delta_str": ("bad_response", "bad_response"),
    "chunk_list": ("bad_response", "bad_response"),
    "long_line": (None, None),
    "429_nan": ("rate_limited", "rate_limited"),
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fault", CLASS_OF_FAULT)
async def test_faults_fail_the_attempt_and_the_retry_succeeds(
    fault: str, stream: bool, serve_app: ServeApp
) -> None:
    failure_class = CLASS_OF_FAULT[fault][0 if stream else 1]
    retried = await serve_app(fault_app(fault)) + "/v1"  # the first attempt only
    generation, counters = await _generate(retried, stream=stream)
    assert generation.text == answer_text("hello", fault if failure_class is None else "none")
    assert generation.finish_reason == "stop"
    assert counters.retries == ({failure_class: 1} if failure_class else {})
    if failure_class is None:
        return
    always = await serve_app(fault_app(fault, always=True)) + "/v1"
    with pytest.raises(ModelCallError) as caught:
        await _generate(always, stream=stream, max_retries=1)
    assert (caught.value.failure_class, caught.value.attempts) == (failure_class, 2)


async def test_stream_with_finish_reason_but_no_done_is_whole(serve: Callable[..., Any]) -> None:
    """Some servers never send [DONE]: a finish_reason ends the answer as well (and the
    last line may lack its newline)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n\n')
        await response.write(b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}')
        return response

    generation, _ = await _generate(await serve(handler))
    assert (generation.text, generation.finish_reason, generation.attempts) == ("Hi", "stop", 1)


@pytest.mark.parametrize("size", [1, 2, 5, 64, 10_000])
def test_stream_lines_split_anywhere_parse_alike(size: int) -> None:
    """Lines are split by hand (so a line may be of any length): a body read in blocks of
    any size gives the same answer."""
    chunks = [{"id": "s", "choices": [{"delta": {"content": piece}}]} for piece in ("a", "é", "c")]
    chunks.append({"id": "s", "choices": [{"delta": {}, "finish_reason": "length"}]})
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    body += b": a comment\n\ndata: [DONE]\n\n"
    stream = _Stream(chat=True)
    done = any(stream.feed(body[i : i + size]) for i in range(0, len(body), size))
    generation = stream.generation(model_start=0.0)
    assert done and (generation.text, generation.finish_reason) == ("aéc", "length")
    assert generation.output_tokens == 3 and generation.response_id == "s"


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ("0.3", 0.3),
        ("1e9", 30.0),  # capped at the backoff ceiling
        ("inf", None),  # not finite: jittered backoff instead
        ("nan", None),
        ("-5", None),
        ("soon", None),
        (None, None),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),  # a past date: now
        ("Fri, 31 Dec 9999 23:59:59 GMT", 30.0),
    ],
)
def test_retry_after_is_read_and_capped(header: str | None, wait: float | None) -> None:
    assert retry_after_s(header, ceiling_s=30.0) == wait


def test_retry_after_as_an_http_date() -> None:
    header = email.utils.formatdate(time.time() + 10, usegmt=True)
    wait = retry_after_s(header, ceiling_s=30.0)
    assert wait is not None and 8 < wait <= 10


async def test_huge_retry_after_waits_only_the_ceiling(serve: Callable[..., Any]) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return web.json_response({}, status=429, headers={"Retry-After": "1e9"})
        return web.json_response(_chat_answer())

    started = time.monotonic()
    generation, counters = await _generate(await serve(handler), stream=False, retry_max_s=0.2)
    assert generation.attempts == 2 and counters.retry_after_seen == 1
    assert 0.15 < time.monotonic() - started < 2


async def test_stalled_stream_ends_at_the_idle_timeout(serve_app: ServeApp) -> None:
    base_url = await serve_app(fault_app("stall", always=True)) + "/v1"
    started = time.monotonic()
    with pytest.raises(ModelCallError, match=r"no byte for 0\.2 s") as caught:
        await _generate(base_url, idle_timeout_s=0.2, request_timeout_s=30, max_retries=1)
    assert caught.value.failure_class == "timeout" and caught.value.attempts == 2
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("stream", [True, False], ids=["queued-stream", "whole"])
async def test_silence_before_the_first_byte_is_not_a_stall(
    stream: bool, serve: Callable[..., Any]
) -> None:
    """A request queued in the server, or a non-streamed answer still being made, sends
    nothing for a while: only --timeout bounds that wait, not the idle timeout."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.5)  # the server's queue, or the whole generation
        if not stream:
            return web.json_response(_chat_answer())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response

    generation, _ = await _generate(await serve(handler), stream=stream, idle_timeout_s=0.1)
    assert (generation.text, generation.attempts) == ("hi", 1)


async def test_unreadable_max_tokens_under_tpm_is_estimated(serve: Callable[..., Any]) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(_chat_answer())

    config = TargetConfig(base_url=await serve(handler), stream=False, tpm=60_000)
    task = task_from_row(0, {"prompt": "hi", "max_tokens": "lots"})
    async with aiohttp.ClientSession() as session:
        backend = OpenAIBackend(session, config, "m")
        assert (await backend.generate(task)).text == "hi"


@pytest.mark.parametrize(
    "answer", [b'["m"]', b'{"data": "abc"}', b'{"data": [1, {"id": 5}, {}]}', b"<html>", b""]
)
async def test_models_of_the_wrong_shape_list_no_model(
    answer: bytes, serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    base_url = await serve_app(app) + "/v1"
    assert (await resolve_target(session, base_url, "m", None)).model == "m"
    with pytest.raises(ServerUnreachable, match=r"lists no model at /models; pass --model NAME\."):
        await resolve_target(session, base_url, None, None)


async def test_server_that_stops_answering_is_a_connection_failure(serve_app: ServeApp) -> None:
    base_url = await serve_app(fault_app("die", die_after=1)) + "/v1"
    generation, _ = await _generate(base_url)
    assert generation.text == answer_text("hello")
    with pytest.raises(ModelCallError) as caught:
        await _generate(base_url, max_retries=1)
    assert caught.value.failure_class == "connection"


@pytest.mark.parametrize(
    "reply", [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n"]
)
async def test_an_answer_that_is_not_http_is_a_bad_response(reply: bytes) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.write(reply)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    async with server, aiohttp.ClientSession() as session:
        with pytest.raises(ModelCallError, match="not valid HTTP") as caught:
            await _generate(base_url, max_retries=1)
        with pytest.raises(ServerUnreachable, match="does not answer in HTTP"):
            await resolve_target(session, base_url, None, None)
    assert (caught.value.failure_class, caught.value.attempts) == ("bad_response", 2)
