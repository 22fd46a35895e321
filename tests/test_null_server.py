"""The null server speaks enough OpenAI-compatible HTTP/1.1 for the clients we measure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from autotune.servers.null import DEFAULT_REPLY, serve_null


@pytest.fixture
async def base() -> AsyncIterator[str]:
    server, port = await serve_null("127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}"
    server.close()
    await server.wait_closed()


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "null", "messages": [{"role": "user", "content": "hi"}], **extra}


async def _sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """The stream's events, `[DONE]` as the string "[DONE]"."""
    events: list[Any] = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            data = line[6:].strip()
            events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events


def _check_usage(usage: dict[str, int]) -> None:
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_health_and_models(base: str, session: aiohttp.ClientSession) -> None:
    async with session.get(base + "/health") as resp:
        assert resp.status == 200
    async with session.get(base + "/v1/models") as resp:
        assert resp.status == 200
        assert (await resp.json())["data"][0]["id"] == "null"


async def test_chat_non_streaming(base: str, session: aiohttp.ClientSession) -> None:
    async with session.post(base + "/v1/chat/completions", json=_chat()) as resp:
        assert resp.status == 200
        body = await resp.json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == DEFAULT_REPLY
    assert choice["finish_reason"] == "stop"
    _check_usage(body["usage"])


async def test_completions_non_streaming(base: str, session: aiohttp.ClientSession) -> None:
    payload = {"model": "null", "prompt": "hi", "stream": False}
    async with session.post(base + "/v1/completions", json=payload) as resp:
        body = await resp.json()
    assert body["choices"][0]["text"] == DEFAULT_REPLY
    assert body["choices"][0]["finish_reason"] == "stop"
    _check_usage(body["usage"])


async def test_chat_streaming_with_usage(base: str, session: aiohttp.ClientSession) -> None:
    payload = _chat(stream=True, stream_options={"include_usage": True})
    async with session.post(base + "/v1/chat/completions", json=payload) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        events = await _sse(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == DEFAULT_REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    _check_usage(chunks[-1]["usage"])


async def test_completions_streaming_without_usage(
    base: str, session: aiohttp.ClientSession
) -> None:
    payload = {"model": "null", "prompt": "hi", "stream": True}
    async with session.post(base + "/v1/completions", json=payload) as resp:
        events = await _sse(resp)
    chunks = events[:-1]
    assert events[-1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in chunks) == DEFAULT_REPLY
    assert not any("usage" in c for c in chunks)


@pytest.mark.parametrize(
    ("raw", "streams"),
    [
        (b'{"messages":[{"role":"user","content":"say \\"stream\\": true"}]}', False),
        (b'{"messages":[], "stream" : true}', True),
        (b'{"messages":[], "stream": false}', False),
    ],
)
async def test_stream_detection(
    base: str, session: aiohttp.ClientSession, raw: bytes, streams: bool
) -> None:
    """Prompt text never looks like the flag; odd spellings still work."""
    async with session.post(base + "/v1/chat/completions", data=raw) as resp:
        assert (resp.headers["Content-Type"] == "text/event-stream") is streams


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return status, head, await reader.readexactly(length)


def _request(path: str, body: bytes = b"", extra: bytes = b"") -> bytes:
    method = b"POST" if body else b"GET"
    return (
        b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n"
        % (method, path.encode(), len(body), extra)
        + body
    )


async def test_keep_alive_pipelining_and_split_reads(base: str) -> None:
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chat = _request("/v1/chat/completions", orjson.dumps(_chat()))
    try:
        for _ in range(5):  # one after another on one connection
            writer.write(chat)
            status, _, body = await _read_response(reader)
            assert status == 200 and orjson.loads(body)["choices"]
        writer.write(chat + _request("/health") + chat)  # pipelined in one write
        assert [(await _read_response(reader))[0] for _ in range(3)] == [200, 200, 200]
        for cut in (10, len(chat) - 5):  # a request split inside its head, then its body
            writer.write(chat[:cut])
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(chat[cut:])
            assert (await _read_response(reader))[0] == 200
        writer.write(_request("/nope"))
        assert (await _read_response(reader))[0] == 404
        writer.write(_request("/health", extra=b"Connection: close\r\n"))
        status, head, _ = await _read_response(reader)
        assert status == 200 and b"Connection: close" in head
        assert await reader.read() == b""  # the server closed it
    finally:
        writer.close()
        await writer.wait_closed()


async def test_reply_is_configurable(session: aiohttp.ClientSession) -> None:
    server, port = await serve_null("127.0.0.1", 0, reply="Paris", model="m")
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with session.post(url, json=_chat()) as resp:
            body = await resp.json()
        assert body["choices"][0]["message"]["content"] == "Paris"
        assert body["model"] == "m"
    finally:
        server.close()
        await server.wait_closed()


def test_the_bench_null_server_is_a_server_process() -> None:
    """`autotune bench` and benchmarks/overhead.py start it the one way servers start."""
    from autotune.bench.overhead import NullServer, bare_loop
    from autotune.servers.launcher import ServerProcess

    with NullServer() as server:
        assert isinstance(server, ServerProcess) and server.is_alive()
        run = bare_loop(server.base_url, 4, 100)
        assert (run.requests, run.failed) == (100, 0)
    assert not server.is_alive()
