"""A model server that misbehaves on purpose, for the fault-injection suite (issue 10).

OpenAI-compatible (`GET /v1/models`, `POST /v1/chat/completions` and `/v1/completions`,
streamed or not, `GET /health`) and healthy but for its one fault. A fault hits the
first attempt of every k-th prompt (`every=k`, counted in arrival order), so the
client's retry gets a healthy answer, a run can complete and the number of faults is
known; or every attempt (`always=True`). `die`, `rate_limit` and `models_list` ignore
the share: they are about the server, not an answer.

In-process: `await serve_app(fault_app("truncate", every=3))`. As a process, for
`autotune` run as a subprocess: `python -m tests.faults --fault die --port P`; it
listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.rate_limit import SlidingWindowLimit

MODEL = "fault/model"
LONG_LINE_BYTES = 200_000  # one SSE line three times aiohttp's default line limit
STALL_AFTER_CHUNKS = 2

# Each fault and what it does. "stream:" parts apply to streamed answers only, "whole:"
# to non-streamed ones; a fault without the answer's form leaves that answer healthy.
FAULTS: dict[str, str] = {
    "none": "healthy",
    "truncate": "stream: half the text, then a clean end with no finish_reason or [DONE]; "
    "whole: half the JSON body",
    "close": "the connection closed mid-body (more bytes promised than sent)",
    "invalid_json": "a stream chunk, or the body, that is not JSON",
    "usage_str": 'usage.prompt_tokens is "abc"',
    "choices_str": 'choices is "abc"',
    "choice_int": "choices is [1]",
    "message_null": "whole: message is null",
    "delta_str": 'stream: delta is "x"; whole: message is "x"',
    "chunk_list": "a stream chunk, or the body, is a JSON list",
    "long_line": f"the whole text in one chunk of over {LONG_LINE_BYTES:,} bytes",
    "stall": f"stream: {STALL_AFTER_CHUNKS} chunks, then silence; whole: silence",
    "429_huge": "HTTP 429 with Retry-After: 1e9",
    "429_inf": "HTTP 429 with Retry-After: inf",
    "429_nan": "HTTP 429 with Retry-After: nan",
    "429_negative": "HTTP 429 with Retry-After: -5",
    "429_date": "HTTP 429 with Retry-After as an HTTP date 1 s ahead",
    "rate_limit": "HTTP 429 (no Retry-After) beyond `limit_per_s` × `window_s` requests in "
    "any `window_s` seconds, counting every attempt, refused ones too",
    "die": "after `die_after` completion requests the server stops answering (as a "
    "process: it exits)",
    "models_list": "/v1/models answers a JSON list",
    # Dialects: what some OpenAI-compatible servers do, each a whole answer.
    "json_for_stream": "stream: the whole answer as one application/json body",
    "no_usage": "no usage, streamed or whole",
    "reasoning": "chat: reasoning_content beside content (vLLM's reasoning parser)",
    "reasoning_only": "chat: the text in `reasoning` (vLLM 0.16 on), content null",
    "length": 'finish_reason "length": cut at the token limit',
    "multi_token_pieces": "stream: four tokens a piece, as usage counts them (vLLM's "
    "stream_interval above 1)",
}
TOKENS_PER_PIECE = 4  # multi_token_pieces
_RETRY_AFTER = {
    "429_huge": "1e9",
    "429_inf": "inf",
    "429_nan": "nan",
    "429_negative": "-5",
}


def answer_text(prompt: str, fault: str = "none", chat: bool = True) -> str:
    """The whole answer's content to `prompt` (ends in 42): a test recomputes it from a
    saved row."""
    text = f"The answer to {prompt[:16]!r} is 42."
    if fault == "long_line":
        return "x" * LONG_LINE_BYTES + text
    if fault == "reasoning_only" and chat:
        return ""
    return text


def reasoning_text(prompt: str, fault: str = "none", chat: bool = True) -> str:
    """What the answer to `prompt` sends as reasoning (chat only)."""
    if not chat:
        return ""
    if fault == "reasoning":
        return f"Thinking about {prompt[:16]!r}."
    if fault == "reasoning_only":
        return answer_text(prompt)
    return ""


@dataclass
class _State:
    fault: str
    every: int
    always: bool
    die_after: int
    on_die: Callable[[], None] | None
    window: SlidingWindowLimit
    piece_delay_s: float = 0.0  # before each streamed piece: an answer that takes time
    attempts: Counter[str] = field(default_factory=Counter)  # per prompt
    prompts: int = 0  # distinct prompts seen
    requests: int = 0  # completion requests
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends stalls at shutdown

    def faulty(self, prompt: str) -> bool:
        """Whether this attempt at `prompt` gets the fault."""
        self.attempts[prompt] += 1
        if self.attempts[prompt] == 1:
            self.prompts += 1
            return self.always or self.prompts % self.every == 0
        return self.always


_STATE = web.AppKey("state", _State)


def fault_app(
    fault: str,
    *,
    every: int = 1,
    always: bool = False,
    die_after: int = 10,
    limit_per_s: float = 10.0,
    window_s: float = 1.0,
    on_die: Callable[[], None] | None = None,
    piece_delay_s: float = 0.0,
) -> web.Application:
    """The server with `fault` (a FAULTS key). `on_die` runs when `die` strikes; without
    it the server stays up but closes every later connection unanswered. A streamed
    answer waits `piece_delay_s` before each piece."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    app = web.Application()
    app[_STATE] = _State(
        fault,
        max(1, every),
        always,
        die_after,
        on_die,
        SlidingWindowLimit(limit_per_s, window_s),
        piece_delay_s,
    )
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", _complete)
    app.router.add_post("/v1/completions", _complete)

    async def release_stalls(app: web.Application) -> None:
        app[_STATE].release.set()

    app.on_shutdown.append(release_stalls)
    return app


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _models(request: web.Request) -> web.Response:
    if request.app[_STATE].fault == "models_list":
        return web.json_response([MODEL])
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def _complete(request: web.Request) -> web.StreamResponse:
    state = request.app[_STATE]
    body = await request.json()
    state.requests += 1
    if state.fault == "die" and state.requests > state.die_after:
        if state.on_die is not None:
            state.on_die()
        assert request.transport is not None
        request.transport.close()
        return web.Response()
    if state.fault == "rate_limit" and not state.window.admit(time.monotonic()):
        return web.json_response({"error": {"message": "rate limited"}}, status=429)
    chat = "messages" in body
    prompt = str(body["messages"][-1]["content"] if chat else body["prompt"])
    fault = state.fault if state.faulty(prompt) else "none"
    if fault in _RETRY_AFTER or fault == "429_date":
        retry_after = _RETRY_AFTER.get(fault) or email.utils.formatdate(
            time.time() + 1, usegmt=True
        )
        return web.json_response(
            {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": retry_after}
        )
    text = answer_text(prompt, fault, chat)
    tokens = 5 * (TOKENS_PER_PIECE if fault == "multi_token_pieces" else 1)  # five pieces
    usage: dict[str, Any] | None = {"prompt_tokens": len(prompt) // 4, "completion_tokens": tokens}
    if fault == "no_usage":
        usage = None
    thought = reasoning_text(prompt, fault, chat)
    if body.get("stream") and fault != "json_for_stream":
        return await _stream(request, fault, chat, text, thought, usage)
    return await _whole(request, fault, chat, text, thought, usage)


def _reasoning_fields(prompt_text: str, fault: str) -> dict[str, Any]:
    """A chat message's or delta's reasoning, as the fault's server names it."""
    if fault == "reasoning":
        return {"reasoning_content": prompt_text}
    if fault == "reasoning_only":
        return {"reasoning": prompt_text, "content": None}
    return {}


def _pieces(text: str, fault: str) -> list[str]:
    """The text in five pieces (one, for `long_line`)."""
    if fault == "long_line":
        return [text]
    size = len(text) // 5 + 1
    return [text[i : i + size] for i in range(0, len(text), size)]


async def _stream(
    request: web.Request,
    fault: str,
    chat: bool,
    text: str,
    thought: str,
    usage: dict[str, Any] | None,
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    if fault == "close":
        response.content_length = 1_000_000  # promise more than is sent, then hang up
    await response.prepare(request)

    def chunk(piece: str | None, finish: str | None = None, **fields: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["delta"] = {"content": piece, **fields} if piece is not None else fields
        else:
            choice["text"] = piece or ""
        return {"id": "fault-1", "object": "chunk", "model": MODEL, "choices": [choice]}

    events: list[Any] = (
        [chunk(None, **_reasoning_fields(piece, fault)) for piece in _pieces(thought, fault)]
        if thought
        else []
    )
    events += [chunk(piece) for piece in _pieces(text, fault)]
    events.append(chunk(None, "length" if fault == "length" else "stop"))
    if usage is not None:
        events.append({"id": "fault-1", "choices": [], "usage": usage})
    if fault == "truncate":
        events = events[: len(events) // 2]
    elif fault == "invalid_json":
        events[1] = b'{"choices": ['
    elif fault == "usage_str":
        events[-1]["usage"] = {**(usage or {}), "prompt_tokens": "abc"}
    elif fault == "choices_str":
        events[1]["choices"] = "abc"
    elif fault == "choice_int":
        events[1]["choices"] = [1]
    elif fault == "delta_str":
        events[1]["choices"][0]["delta"] = "x"
    elif fault == "chunk_list":
        events[1] = [1, 2]
    delay_s = request.app[_STATE].piece_delay_s
    for number, event in enumerate(events):
        if delay_s:
            await asyncio.sleep(delay_s)
        data = event if isinstance(event, bytes) else orjson.dumps(event)
        await response.write(b"data: " + data + b"\n\n")
        if fault == "close" and number == 1:
            assert request.transport is not None
            request.transport.close()
            return response
        if fault == "stall" and number + 1 == STALL_AFTER_CHUNKS:
            await request.app[_STATE].release.wait()
            return response
    if fault != "truncate":
        await response.write(b"data: [DONE]\n\n")
    return response


async def _whole(
    request: web.Request,
    fault: str,
    chat: bool,
    text: str,
    thought: str,
    usage: dict[str, Any] | None,
) -> web.StreamResponse:
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": "length" if fault == "length" else "stop",
    }
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        choice["message"].update(_reasoning_fields(thought, fault))
    else:
        choice["text"] = text
    answer: Any = {"id": "fault-1", "object": "completion", "choices": [choice]}
    if usage is not None:
        answer["usage"] = usage
    if fault == "usage_str":
        answer["usage"] = {**(usage or {}), "prompt_tokens": "abc"}
    elif fault == "choices_str":
        answer["choices"] = "abc"
    elif fault == "choice_int":
        answer["choices"] = [1]
    elif fault == "message_null" and chat:
        choice["message"] = None
    elif fault == "delta_str" and chat:
        choice["message"] = "x"
    elif fault == "chunk_list":
        answer = [1, 2]
    data = orjson.dumps(answer)
    if fault == "invalid_json":
        data = b'{"choices": ['
    elif fault == "truncate":
        data = data[: len(data) // 2]
    elif fault == "stall":  # until shutdown, when the client has long given up
        await request.app[_STATE].release.wait()
        return web.Response(status=503)
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(data) * (2 if fault == "close" else 1)
    await response.prepare(request)
    await response.write(data[: len(data) // 2] if fault == "close" else data)
    if fault == "close":
        assert request.transport is not None
        request.transport.close()
    return response


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--fault", choices=FAULTS, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--every", type=int, default=1, help="the k-th prompts' first try")
    parser.add_argument("--always", action="store_true", help="every attempt")
    parser.add_argument("--die-after", type=int, default=10, help="requests before dying")
    parser.add_argument("--limit", type=float, default=10, help="rate_limit: requests a second")
    parser.add_argument("--window", type=float, default=1.0, help="rate_limit: window, s")
    args = parser.parse_args(argv)
    app = fault_app(
        args.fault,
        every=args.every,
        always=args.always,
        die_after=args.die_after,
        limit_per_s=args.limit,
        window_s=args.window,
        on_die=lambda: os._exit(0),  # a crashed server: no goodbye to anyone
    )
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
