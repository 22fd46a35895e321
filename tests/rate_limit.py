"""A rate-limited OpenAI-compatible endpoint, for the rate-limit tests and benchmark.

A sliding-window limit stands in front of chat completions that answer at once
(streamed: content chunks, a usage chunk, `[DONE]`). Like many hosted APIs, the limit
counts every attempt, refused ones too, and refuses with 429 and `Retry-After: 1`; so
a client whose refused calls all retry together keeps it tripped.

    python -m tests.rate_limit --limit 15 --port P

serves on 127.0.0.1 (`/health`, `/v1/models`, `/v1/chat/completions`, and `/stats`:
attempts admitted and refused so far) and prints one ready line.
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

MODEL = "rate-limited"
REPLY = "The answer is 42."
PROMPT_TOKENS = 16
READY_PREFIX = "rate-limit ready"


class SlidingWindowLimit:
    """At most `limit_per_s × window_s` attempts in any `window_s` seconds; an attempt
    counts whether it is admitted or refused."""

    def __init__(self, limit_per_s: float, window_s: float = 1.0) -> None:
        if limit_per_s <= 0 or window_s <= 0:
            raise ValueError("the limit and its window must be positive")
        self.window_s = window_s
        self.capacity = limit_per_s * window_s
        self.admitted = 0
        self.refused = 0
        self._attempts: deque[float] = deque()

    def admit(self, now: float) -> bool:
        """Counts an attempt at `now` (seconds, never decreasing); True if it is within the
        limit."""
        attempts = self._attempts
        since = now - self.window_s
        while attempts and attempts[0] <= since:
            attempts.popleft()
        attempts.append(now)
        if len(attempts) <= self.capacity:
            self.admitted += 1
            return True
        self.refused += 1
        return False


def _answers(model: str, reply: str) -> tuple[bytes, bytes]:
    """The whole answer, pre-encoded: as one JSON body and as an SSE stream."""
    created = int(time.time())
    words = reply.split(" ")
    pieces = [w + " " for w in words[:-1]] + words[-1:]
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": len(pieces),
        "total_tokens": PROMPT_TOKENS + len(pieces),
    }
    head = {"id": "chatcmpl-rl", "created": created, "model": model}
    message = {"role": "assistant", "content": reply}
    full = {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": usage,
    }
    chunk = {**head, "object": "chat.completion.chunk"}

    def event(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
        return {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [event({"role": "assistant", "content": ""}, None)]
    events += [event({"content": p}, None) for p in pieces]
    events += [event({}, "stop"), {**chunk, "choices": [], "usage": usage}]
    stream = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    return orjson.dumps(full), stream + b"data: [DONE]\n\n"


def rate_limited_app(
    limit: SlidingWindowLimit,
    *,
    retry_after: str = "1",
    model: str = MODEL,
    reply: str = REPLY,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    """An aiohttp app serving chat completions behind `limit` (429 + `retry_after` when over)."""
    full, stream = _answers(model, reply)
    refusal = orjson.dumps(
        {"error": {"message": "rate limit exceeded", "type": "rate_limit_error", "code": 429}}
    )

    async def chat(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if not limit.admit(clock()):
            return web.Response(
                status=429,
                body=refusal,
                content_type="application/json",
                headers={"Retry-After": retry_after},
            )
        if body.get("stream"):
            return web.Response(body=stream, content_type="text/event-stream")
        return web.Response(body=full, content_type="application/json")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"admitted": limit.admitted, "refused": limit.refused})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, required=True, help="requests per second")
    parser.add_argument("--window", type=float, default=1.0, help="window, seconds")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    app = rate_limited_app(SlidingWindowLimit(args.limit, args.window))
    url = f"http://127.0.0.1:{args.port}"
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        print=lambda _: print(f"{READY_PREFIX} {url}", flush=True),
        access_log=None,
    )


if __name__ == "__main__":
    main()
