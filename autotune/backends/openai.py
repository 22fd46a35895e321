"""OpenAI-compatible chat completions and completions, streaming or not.

Retries are bounded, with exponential backoff and full jitter; a 429/503 `Retry-After`
is honoured. Optional request and token rate limits use aiolimiter's leaky bucket
(weighted acquire, so tokens per minute works as well as requests per minute).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import orjson
from aiolimiter import AsyncLimiter

from autotune.backends import CallCounters, Generation, ModelCallError
from autotune.config import TargetConfig
from autotune.workload import CHARS_PER_TOKEN, Task

_RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_DEFAULT_MAX_TOKENS_ESTIMATE = 256  # for the token limiter when a task sets no max_tokens


class _Retry(Exception):
    """One failed attempt that may be retried."""

    def __init__(self, failure_class: str, message: str, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.failure_class = failure_class
        self.wait_s = wait_s


def _per_minute_limiter(per_minute: float) -> AsyncLimiter:
    """A leaky bucket that holds one second's quota (at least one unit).

    A bucket of a whole minute would let the minute's quota out in one burst, which is
    exactly what trips a hosted API's limiter; below 60 a minute, one unit is the least
    a bucket can hold, refilled every 60/rate seconds.
    """
    if per_minute >= 60:
        return AsyncLimiter(per_minute / 60, 1)
    return AsyncLimiter(1, 60 / per_minute)


def _retry_after_s(headers: Any) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date; rare on model APIs, fall back to backoff


class OpenAIBackend:
    """Calls `{base_url}/chat/completions` or `{base_url}/completions`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: TargetConfig,
        model: str,
        api_key: str | None = None,
    ) -> None:
        self._session = session
        self._target = target
        self.model = model
        self.counters = CallCounters()
        base = target.base_url or ""
        self._url = base.rstrip("/") + (
            "/chat/completions" if target.api == "chat" else "/completions"
        )
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(
            total=target.request_timeout_s, sock_connect=target.connect_timeout_s
        )
        self._rpm = _per_minute_limiter(target.rpm) if target.rpm else None
        self._tpm = _per_minute_limiter(target.tpm) if target.tpm else None

    def _body(self, task: Task) -> dict[str, Any]:
        target = self._target
        body: dict[str, Any] = {"model": self.model, **task.sampling}
        if target.api == "chat":
            body["messages"] = task.messages
        else:
            body["prompt"] = task.prompt
            body.pop("tools", None)
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        if target.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if target.extra_body:
            body.update(target.extra_body)
        return body

    async def _wait_for_limits(self, task: Task) -> None:
        started = time.perf_counter()
        if self._rpm is not None:
            await self._rpm.acquire()
        if self._tpm is not None:
            estimate = float(
                len(task.prompt) // CHARS_PER_TOKEN
                + int(task.sampling.get("max_tokens") or _DEFAULT_MAX_TOKENS_ESTIMATE)
            )
            # A request may need more than the bucket holds: pay for it in bucket-sized parts.
            while estimate > 0:
                part = min(estimate, self._tpm.max_rate)
                await self._tpm.acquire(part)
                estimate -= part
        self.counters.limiter_wait_s += time.perf_counter() - started

    async def generate(self, task: Task) -> Generation:
        """One generation, retried on transient failures; raises ModelCallError."""
        if self._rpm is not None or self._tpm is not None:
            await self._wait_for_limits(task)
        data = orjson.dumps(self._body(task))
        target = self._target
        attempt = 0
        while True:
            attempt += 1
            model_start = time.time()
            try:
                generation = await self._attempt(data, model_start)
                generation.attempts = attempt
                return generation
            except _Retry as failure:
                if attempt > target.max_retries:
                    raise ModelCallError(failure.failure_class, str(failure), attempt) from None
                self.counters.count_retry(failure.failure_class)
                backoff = min(target.retry_max_s, target.retry_base_s * 2 ** (attempt - 1))
                wait = failure.wait_s if failure.wait_s is not None else random.uniform(0, backoff)
                await asyncio.sleep(wait)

    async def _attempt(self, data: bytes, model_start: float) -> Generation:
        try:
            async with self._session.post(
                self._url, data=data, headers=self._headers, timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    await self._raise_for_status(resp)
                if self._target.stream:
                    return await self._read_stream(resp, model_start)
                payload = orjson.loads(await resp.read())
        except (TimeoutError, aiohttp.ServerTimeoutError) as error:
            raise _Retry(
                "timeout", f"no answer within the timeout ({error or 'timed out'})"
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            # Refused, reset, or cut off mid-answer (a server that died while streaming).
            raise _Retry("connection", f"connection failed ({error})") from None
        except orjson.JSONDecodeError as error:
            raise ModelCallError(
                "bad_response", f"the server's answer is not JSON ({error})"
            ) from None
        return self._parse_full(payload, model_start)

    async def _raise_for_status(self, resp: aiohttp.ClientResponse) -> None:
        status = resp.status
        text = (await resp.text(errors="replace"))[:300].replace("\n", " ")
        if status in (429, 503):
            wait = _retry_after_s(resp.headers)
            if status == 429:
                self.counters.rate_limited_responses += 1
            if wait is not None:
                self.counters.retry_after_seen += 1
            raise _Retry(
                "rate_limited" if status == 429 else "http_5xx", f"HTTP {status}: {text}", wait
            )
        if status in _RETRYABLE_STATUS:
            raise _Retry("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}: {text}")
        raise ModelCallError("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}: {text}")

    def _parse_full(self, payload: dict[str, Any], model_start: float) -> Generation:
        try:
            choice = payload["choices"][0]
            usage = payload.get("usage") or {}
            if self._target.api == "chat":
                message = choice["message"]
                text = message.get("content") or ""
                tool_calls = message.get("tool_calls") or []
            else:
                text = choice.get("text") or ""
                tool_calls = []
            return Generation(
                text=text,
                tool_calls=tool_calls,
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
                finish_reason=choice.get("finish_reason"),
                response_id=str(payload.get("id", "")),
                model_start=model_start,
                first_token=None,
                model_end=time.time(),
            )
        except (KeyError, IndexError, TypeError) as error:
            raise ModelCallError(
                "bad_response", f"the server's answer has no choices ({error!r})"
            ) from None

    async def _read_stream(self, resp: aiohttp.ClientResponse, model_start: float) -> Generation:
        chat = self._target.api == "chat"
        parts: list[str] = []
        tool_calls: dict[int, dict[str, Any]] = {}
        first_token: float | None = None
        finish_reason = None
        response_id = ""
        usage: dict[str, Any] = {}
        chunks = 0
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError as error:
                raise ModelCallError(
                    "bad_response", f"a stream chunk is not JSON ({error})"
                ) from None
            if not isinstance(chunk, dict) or "error" in chunk or chunk.get("object") == "error":
                # A server that fails mid-stream sends an error event, not an HTTP status.
                detail = str(chunk.get("error") if isinstance(chunk, dict) else chunk)[:300]
                raise ModelCallError("bad_response", f"the stream ended in an error: {detail}")
            response_id = response_id or str(chunk.get("id", ""))
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if chat:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    for call in delta.get("tool_calls") or ():
                        _merge_tool_call(tool_calls, call)
                        first_token = first_token or time.time()
                else:
                    piece = choice.get("text")
                if piece:
                    first_token = first_token or time.time()
                    parts.append(piece)
                    chunks += 1
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
        return Generation(
            text="".join(parts),
            tool_calls=[tool_calls[i] for i in sorted(tool_calls)],
            input_tokens=int(usage.get("prompt_tokens") or 0),
            # Without a usage chunk, count content chunks: one token each on most servers.
            output_tokens=int(usage.get("completion_tokens") or chunks),
            finish_reason=finish_reason,
            response_id=response_id,
            model_start=model_start,
            first_token=first_token,
            model_end=time.time(),
        )


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """Streamed tool calls arrive in pieces keyed by index; join their arguments."""
    index = int(delta.get("index", 0))
    call = calls.setdefault(
        index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]
