"""A null-latency OpenAI-compatible server: it answers every request at once, to measure the
client's own overhead. `python -m autotune.servers.null --port 8000` serves it.
Why, its routes and flags: docs/design/servers.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import orjson

DEFAULT_REPLY = "The answer is 42."
DEFAULT_MODEL = "null"
READY_PREFIX = "autotune-null ready"
PROMPT_TOKENS = 16  # a fixed count: the server never reads the prompt
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024

_STREAM_TRUE = (b'"stream": true', b'"stream":true')
_STREAM_FALSE = (b'"stream": false', b'"stream":false')
_USAGE_TRUE = (b'"include_usage": true', b'"include_usage":true')
_USAGE_FALSE = (b'"include_usage": false', b'"include_usage":false')

# Statuses the server can answer with.
_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    411: b"Length Required",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
}


def _http(status: int, content_type: bytes, body: bytes, *, close: bool = False) -> bytes:
    """One complete HTTP/1.1 response, headers and body."""
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        status,
        _REASONS[status],
        content_type,
        len(body),
    )
    if close:
        head += b"Connection: close\r\n"
    return head + b"\r\n" + body


def _json(status: int, obj: Any, *, close: bool = False) -> bytes:
    return _http(status, b"application/json", orjson.dumps(obj), close=close)


def _error(status: int, message: str, *, close: bool = False) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return _json(status, {"error": {"message": message, "type": kind, "code": status}}, close=close)


def _sse(events: list[dict[str, Any]]) -> bytes:
    """An SSE stream as one body: the server answers at once, so chunking buys nothing."""
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _pieces(text: str) -> list[str]:
    """The reply cut at spaces, a stand-in for tokens (each piece keeps its space)."""
    words = text.split(" ")
    return [w if i == len(words) - 1 else w + " " for i, w in enumerate(words)] or [""]


class _Answers:
    """Every answer the server gives, pre-encoded once at start-up."""

    def __init__(self, reply: str, model: str, tool_turns: int = 1) -> None:
        self.tool_turns = tool_turns
        created = int(time.time())
        pieces = _pieces(reply)
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": len(pieces),
            "total_tokens": PROMPT_TOKENS + len(pieces),
        }
        self.health = _http(200, b"text/plain", b"OK")
        self.models = _json(
            200,
            {
                "object": "list",
                "data": [
                    {"id": model, "object": "model", "created": created, "owned_by": "autotune"}
                ],
            },
        )
        chat_head = {"id": "chatcmpl-null", "object": "chat.completion", "created": created}
        self.chat = _json(
            200,
            {
                **chat_head,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            },
        )
        cmpl_head = {"id": "cmpl-null", "object": "text_completion", "created": created}
        self.completions = _json(
            200,
            {
                **cmpl_head,
                "model": model,
                "choices": [{"index": 0, "text": reply, "logprobs": None, "finish_reason": "stop"}],
                "usage": usage,
            },
        )

        chunk = {"id": "chatcmpl-null", "object": "chat.completion.chunk", "created": created}
        chunk["model"] = model

        def chat_choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        chat_events = [chat_choice({"role": "assistant", "content": ""}, None)]
        chat_events += [chat_choice({"content": p}, None) for p in pieces]
        chat_events.append(chat_choice({}, "stop"))
        chat_usage = [{**chunk, "choices": [], "usage": usage}]

        text_chunk = {**cmpl_head, "model": model}

        def text_choice(text: str, finish: str | None) -> dict[str, Any]:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return {**text_chunk, "choices": [choice]}

        text_events = [text_choice(p, None) for p in pieces] + [text_choice("", "stop")]
        text_usage = [{**text_chunk, "choices": [], "usage": usage}]

        sse = b"text/event-stream"
        self.chat_stream = _http(200, sse, _sse(chat_events))
        self.chat_stream_usage = _http(200, sse, _sse(chat_events + chat_usage))
        self.completions_stream = _http(200, sse, _sse(text_events))
        self.completions_stream_usage = _http(200, sse, _sse(text_events + text_usage))

        function = {"name": "null", "arguments": "{}"}
        call = {"id": "call_null", "type": "function", "function": function}
        tool_message = {"role": "assistant", "content": None, "tool_calls": [call]}
        tool_choice = {"index": 0, "message": tool_message, "finish_reason": "tool_calls"}
        self.chat_tool = _json(
            200, {**chat_head, "model": model, "choices": [tool_choice], "usage": usage}
        )
        tool_delta = {"role": "assistant", "tool_calls": [{"index": 0, **call}]}
        tool_events = [chat_choice(tool_delta, "tool_calls")]
        self.chat_tool_stream = _http(200, sse, _sse(tool_events))
        self.chat_tool_stream_usage = _http(200, sse, _sse(tool_events + chat_usage))

    def calls_a_tool(self, body: bytes) -> bool:
        """Whether this chat request gets a tool call: tools offered, and fewer tool
        results in the conversation than --tool-turns − 1."""
        return (
            self.tool_turns > 1
            and b'"tools"' in body
            and body.count(b'"tool_call_id"') < self.tool_turns - 1
        )


def _flag(
    body: bytes,
    yes: tuple[bytes, bytes],
    no: tuple[bytes, bytes],
    key: str,
    nested: str | None = None,
) -> bool:
    """Whether the JSON body sets `key` (optionally inside `nested`) to true.

    A byte search settles almost every body: inside a JSON string every quote is
    escaped, so `"stream": true` cannot match prompt text. Only when the key appears in
    an unusual spelling (`"stream" : true`) is the body parsed.
    """
    if yes[0] in body or yes[1] in body:
        return True
    if no[0] in body or no[1] in body or b'"%s"' % key.encode() not in body:
        return False
    try:
        obj = orjson.loads(body)
        if nested is not None:
            obj = obj.get(nested) or {}
        return obj.get(key) is True
    except (orjson.JSONDecodeError, AttributeError):
        return False


class NullProtocol(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; pipelined requests are answered in order."""

    __slots__ = ("_answers", "_buf", "_connections", "_transport")

    def __init__(self, answers: _Answers, connections: set[asyncio.Transport]) -> None:
        self._answers = answers
        self._connections = connections
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only look-alikes.
        self._transport = cast(asyncio.Transport, transport)
        self._connections.add(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._connections.discard(self._transport)
        self._transport = None

    def pause_writing(self) -> None:
        # A client that stops reading stops being read from, so buffers stay bounded.
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        if self._buf:
            self._buf += data
            buf: bytes | bytearray = self._buf
        else:
            buf = data  # the common case: one whole request in one read, no copy
        out: list[bytes] = []
        pos = 0
        close = False
        while True:
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                if len(buf) - pos > MAX_HEAD_BYTES:
                    out.append(_error(431, "request head too large", close=True))
                    close = True
                break
            answer, consumed, close = self._answer(buf, pos, end)
            if answer is None:
                break  # the body has not all arrived
            out.append(answer)
            pos = consumed
            if close:
                break
        if out:
            transport.write(b"".join(out) if len(out) > 1 else out[0])
        if close:
            self._buf = bytearray()
            transport.close()
        elif pos == len(buf):
            self._buf = bytearray()
        elif buf is self._buf:
            del self._buf[:pos]
        else:
            self._buf = bytearray(buf[pos:])

    def _answer(
        self, buf: bytes | bytearray, start: int, end: int
    ) -> tuple[bytes | None, int, bool]:
        """The answer to the request whose head is buf[start:end], where it ends, close?"""
        line_end = buf.find(b"\r\n", start, end + 2)
        parts = bytes(buf[start:line_end]).split(b" ")
        if len(parts) != 3:
            return _error(400, "malformed request line", close=True), end + 4, True
        method, target, version = parts
        head = bytes(buf[line_end : end + 2]).lower()

        keep_alive = version == b"HTTP/1.1"
        at = head.find(b"\r\nconnection:")
        if at >= 0:
            value = head[at + 13 : head.find(b"\r\n", at + 2)].strip()
            keep_alive = b"close" not in value and (keep_alive or b"keep-alive" in value)
        close = not keep_alive

        length = 0
        at = head.find(b"\r\ncontent-length:")
        if at >= 0:
            try:
                length = int(head[at + 17 : head.find(b"\r\n", at + 2)])
            except ValueError:
                length = -1
            if length < 0:
                return _error(400, "bad Content-Length", close=True), end + 4, True
        elif b"\r\ntransfer-encoding:" in head:
            return _error(411, "send a Content-Length body", close=True), end + 4, True
        if length > MAX_BODY_BYTES:
            return _error(413, "request body too large", close=True), end + 4, True
        body_start = end + 4
        body_end = body_start + length
        if len(buf) < body_end:
            return None, start, False

        path = target.split(b"?", 1)[0].rstrip(b"/")
        answers = self._answers
        answer: bytes
        if path in (b"/v1/chat/completions", b"/v1/completions"):
            if method != b"POST":
                answer = _error(405, "use POST")
            else:
                body = bytes(buf[body_start:body_end])
                chat = path == b"/v1/chat/completions"
                tool = chat and answers.calls_a_tool(body)
                if _flag(body, _STREAM_TRUE, _STREAM_FALSE, "stream"):
                    usage = _flag(
                        body, _USAGE_TRUE, _USAGE_FALSE, "include_usage", "stream_options"
                    )
                    if tool:
                        answer = (
                            answers.chat_tool_stream_usage if usage else answers.chat_tool_stream
                        )
                    elif chat:
                        answer = answers.chat_stream_usage if usage else answers.chat_stream
                    else:
                        answer = (
                            answers.completions_stream_usage
                            if usage
                            else answers.completions_stream
                        )
                elif tool:
                    answer = answers.chat_tool
                else:
                    answer = answers.chat if chat else answers.completions
        elif path == b"/health":
            answer = answers.health if method == b"GET" else _error(405, "use GET")
        elif path == b"/v1/models":
            answer = answers.models if method == b"GET" else _error(405, "use GET")
        else:
            answer = _error(404, f"no route {target.decode(errors='replace')}")
        if close:
            answer = answer.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
        return answer, body_end, close


async def _serve(
    host: str, port: int, reply: str, model: str, tool_turns: int = 1
) -> tuple[asyncio.AbstractServer, int, set[asyncio.Transport]]:
    answers = _Answers(reply, model, tool_turns)
    connections: set[asyncio.Transport] = set()
    loop = asyncio.get_running_loop()
    factory: Callable[[], asyncio.Protocol] = lambda: NullProtocol(answers, connections)  # noqa: E731
    server = await loop.create_server(factory, host, port, reuse_address=True, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    return server, bound, connections


async def serve_null(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    reply: str = DEFAULT_REPLY,
    model: str = DEFAULT_MODEL,
    tool_turns: int = 1,
) -> tuple[asyncio.AbstractServer, int]:
    """Start the null server on the running loop; port 0 picks a free one (returned)."""
    server, bound, _ = await _serve(host, port, reply, model, tool_turns)
    return server, bound


async def _main(host: str, port: int, reply: str, model: str, tool_turns: int) -> None:
    server, bound, connections = await _serve(host, port, reply, model, tool_turns)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, stop.set)
    print(f"{READY_PREFIX} http://{host}:{bound}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        for transport in list(connections):
            transport.close()
        await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m autotune.servers.null",
        description="A null-latency OpenAI-compatible server, to measure client overhead.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--reply", default=DEFAULT_REPLY, help="the text every answer carries")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the model id it reports")
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this core")
    parser.add_argument(
        "--tool-turns",
        type=int,
        default=1,
        help="model calls per rollout that offers tools: a tool call until the last",
    )
    args = parser.parse_args(argv)
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        pass
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_main(args.host, args.port, args.reply, args.model, args.tool_turns))
    except OSError as error:
        print(f"cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
