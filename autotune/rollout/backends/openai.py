"""OpenAI-compatible chat completions and completions, streaming or not: bounded retries with
backoff, optional rate limits, and an answer saved only when it is whole.
Why: docs/design/backends.md.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
from aiolimiter import AsyncLimiter

from autotune.config.collection import TargetConfig
from autotune.results.responses import CHARS_PER_TOKEN
from autotune.rollout.backends import CallCounters, Generation, ModelCallError
from autotune.rollout.replicas import Replica, ReplicaSet
from autotune.rollout.workload import Task

log = logging.getLogger("autotune")

_RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_DEFAULT_MAX_TOKENS_ESTIMATE = 256  # for the token limiter when a task sets no max_tokens
# One SSE line longer than this is a server gone wrong, not an answer: even a whole
# million-token answer in one chunk is a few MB.
_MAX_LINE_BYTES = 64 * 1024 * 1024


class _Retry(Exception):
    """One failed attempt that may be retried."""

    def __init__(self, failure_class: str, message: str, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.failure_class = failure_class
        self.wait_s = wait_s


def _bad(message: str) -> _Retry:
    """An answer autotune cannot read: retried, as a server's hiccup usually is."""
    return _Retry("bad_response", message)


def _per_minute_limiter(per_minute: float) -> AsyncLimiter:
    """A leaky bucket that holds one second's quota (at least one unit).

    A bucket of a whole minute would let the minute's quota out in one burst, which is
    exactly what trips a hosted API's limiter; below 60 a minute, one unit is the least
    a bucket can hold, refilled every 60/rate seconds.
    """
    if per_minute >= 60:
        return AsyncLimiter(per_minute / 60, 1)
    return AsyncLimiter(1, 60 / per_minute)


def retry_after_s(value: str | None, ceiling_s: float) -> float | None:
    """Seconds a `Retry-After` header asks for, capped at `ceiling_s`; None to ignore it.

    Both forms are read: seconds, and an HTTP date (a past date means now). A value that
    is no finite, non-negative number of seconds and no date is ignored (the caller
    backs off with jitter instead); with the cap, neither `1e9` nor `inf` stalls a run.
    """
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less one is taken as such
            when = when.replace(tzinfo=UTC)
        seconds = max(0.0, (when - datetime.now(UTC)).total_seconds())
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, ceiling_s)


def _max_tokens_estimate(sampling: dict[str, Any]) -> int:
    """The task's max_tokens for the token limiter; the default when it is not a count
    (a task's `"lots"` is the server's to refuse, not the limiter's to crash on)."""
    value = sampling.get("max_tokens")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf:
        return int(value)
    return _DEFAULT_MAX_TOKENS_ESTIMATE


class OpenAIBackend:
    """Calls `{base_url}/chat/completions` or `{base_url}/completions`.

    Timeouts: `request_timeout_s` bounds a whole attempt; `idle_timeout_s` bounds the
    silence between bytes of a stream once its first byte has come. The idle clock
    starts there because a request queued in the server (vLLM sends nothing before the
    first token) may rightly wait long, and it is not applied to non-streamed calls,
    which send nothing until the whole answer is made.
    """

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
        path = "/chat/completions" if target.api == "chat" else "/completions"
        urls = target.base_urls or ("",)
        self.replicas = ReplicaSet(urls, gpus=target.replica_gpus)
        self.counters.replicas = self.replicas
        self._urls = [url.rstrip("/") + path for url in urls]
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
                len(task.prompt) // CHARS_PER_TOKEN + _max_tokens_estimate(task.sampling)
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
        failed_on: Replica | None = None
        while True:
            attempt += 1
            replica = self.replicas.acquire(task.index, avoid=failed_on)
            model_start = time.time()
            try:
                generation = await self._attempt(self._urls[replica.index], data, model_start)
            except _Retry as failure:
                self.replicas.failed(replica, failure.failure_class, str(failure))
                if attempt > target.max_retries:
                    raise ModelCallError(failure.failure_class, str(failure), attempt) from None
                self.counters.count_retry(failure.failure_class)
                failed_on = replica
                await asyncio.sleep(self._backoff_s(failure, attempt, replica))
                await self.counters.before_retry()  # the adaptive limit may hold it
                continue
            except ModelCallError as error:
                self.replicas.failed(replica, error.failure_class, str(error))
                raise
            except BaseException:  # cancelled: the call did not finish, for better or worse
                self.replicas.abandoned(replica)
                raise
            if generation.finish_reason == "abort":  # a pause for a weight sync ended it
                self.replicas.abandoned(replica)
                raise ModelCallError(
                    "aborted",
                    "the server aborted the request (finish_reason abort: a pause or sleep "
                    f"for a weight sync) after {generation.output_tokens} output tokens",
                    attempt,
                )
            generation.attempts = attempt
            generation.replica = replica.index
            self.replicas.succeeded(
                replica, generation.model_end - model_start, generation.output_tokens
            )
            return generation

    def _backoff_s(self, failure: _Retry, attempt: int, replica: Replica) -> float:
        """Seconds before the next attempt: what Retry-After asks, else full jitter; none
        when a connection failed and another replica can take the call at once."""
        if failure.wait_s is not None:
            return failure.wait_s
        if failure.failure_class == "connection" and self.replicas.up_besides(replica):
            return 0.0
        target = self._target
        return random.uniform(0, min(target.retry_max_s, target.retry_base_s * 2 ** (attempt - 1)))

    async def _attempt(self, url: str, data: bytes, model_start: float) -> Generation:
        try:
            async with self._session.post(
                url, data=data, headers=self._headers, timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    await self._raise_for_status(resp)
                if self._target.stream and resp.content_type == "application/json":
                    self._unstreamed()
                elif self._target.stream:
                    return await self._read_stream(resp, model_start)
                payload = orjson.loads(await resp.read())
        except (TimeoutError, aiohttp.ServerTimeoutError) as error:
            reason = str(error) or f"no whole answer within {self._target.request_timeout_s:g} s"
            raise _Retry("timeout", f"timed out ({reason})") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            # Refused, reset, or cut off mid-answer (a server that died while streaming).
            raise _Retry("connection", f"connection failed ({error})") from None
        except aiohttp.ClientResponseError as error:  # a status line or header aiohttp refuses
            reason = error.message.splitlines()[0] if error.message else f"HTTP {error.status}"
            raise _bad(f"the server's answer is not valid HTTP ({reason})") from None
        except orjson.JSONDecodeError as error:
            raise _bad(f"the server's answer is not JSON ({error})") from None
        return self._parse_full(payload, model_start)

    def _unstreamed(self) -> None:
        """A streamed request answered with one JSON body: read whole, said once."""
        if not self.counters.unstreamed_answers:
            log.warning(
                "the server answers streamed requests with one JSON body (it does not "
                "stream): its answers are read whole, with no time to first token; pass "
                "--no-stream to ask it that way."
            )
        self.counters.unstreamed_answers += 1

    async def _raise_for_status(self, resp: aiohttp.ClientResponse) -> None:
        status = resp.status
        text = (await resp.text(errors="replace"))[:300].replace("\n", " ")
        if status in (429, 503):
            wait = retry_after_s(resp.headers.get("Retry-After"), self._target.retry_max_s)
            if status == 429:
                self.counters.rate_limited_responses += 1
            else:
                self.counters.unavailable_responses += 1
            if wait is not None:
                self.counters.retry_after_seen += 1
            raise _Retry(
                "rate_limited" if status == 429 else "http_5xx", f"HTTP {status}: {text}", wait
            )
        if status in _RETRYABLE_STATUS:
            raise _Retry("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}: {text}")
        raise ModelCallError("http_5xx" if status >= 500 else "http_4xx", f"HTTP {status}: {text}")

    def _parse_full(self, payload: Any, model_start: float) -> Generation:
        if not isinstance(payload, dict):
            raise _bad(f"the server's answer is not a JSON object ({_clip(payload)})")
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _bad(f"the server's answer has no choices ({_clip(choices)})")
        choice = choices[0]
        reasoning = ""
        if self._target.api == "chat":
            message = choice.get("message")
            if not isinstance(message, dict):
                raise _bad(f"the answer's message is not an object ({_clip(message)})")
            text = _text(message.get("content"), "message content")
            tool_calls = _tool_calls(message.get("tool_calls"))
            reasoning = _reasoning(message)
        else:
            text = _text(choice.get("text"), "text")
            tool_calls = []
        usage = _usage(payload.get("usage"))
        # Without usage, its text at four characters a token: a server that never sends
        # usage would otherwise read as generating nothing.
        output_tokens = (
            _count(usage, "completion_tokens")
            if usage
            else -(-(len(reasoning) + len(text)) // CHARS_PER_TOKEN)
        )
        return Generation(
            text=text,
            tool_calls=tool_calls,
            input_tokens=_count(usage, "prompt_tokens"),
            output_tokens=output_tokens,
            reasoning=reasoning,
            finish_reason=_finish_reason(choice),
            response_id=_id(payload.get("id")),
            model_start=model_start,
            first_token=None,
            model_end=time.time(),
        )

    async def _read_stream(self, resp: aiohttp.ClientResponse, model_start: float) -> Generation:
        stream = _Stream(self._target.api == "chat")
        idle_s = self._target.idle_timeout_s
        watch: _IdleWatch | None = None
        counters, counted = self.counters, 0
        try:
            async for block in resp.content.iter_any():
                if watch is not None:
                    watch.last = watch.loop.time()
                elif idle_s is not None:
                    watch = _IdleWatch(resp.content, idle_s)
                done = stream.feed(block)
                counters.streamed_tokens += stream.chunks - counted  # as they arrive
                counted = stream.chunks
                if done:
                    break
        finally:
            if watch is not None:
                watch.stop()
        generation = stream.generation(model_start)
        counters.ended_pieces += stream.chunks
        counters.ended_tokens += generation.output_tokens
        return generation


class _IdleWatch:
    """Fails a stream's reads once no byte has come for `idle_s` (a stalled server).

    A timer that rearms itself at the last byte's time plus `idle_s`: a read costs one
    clock reading, not a timer of its own.
    """

    __slots__ = ("_content", "_handle", "_idle_s", "last", "loop")

    def __init__(self, content: aiohttp.StreamReader, idle_s: float) -> None:
        self._content = content
        self._idle_s = idle_s
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._handle = self.loop.call_at(self.last + idle_s, self._check)

    def _check(self) -> None:
        due = self.last + self._idle_s
        if self.loop.time() < due:
            self._handle = self.loop.call_at(due, self._check)
            return
        self._content.set_exception(
            _Retry("timeout", f"the stream stalled: no byte for {self._idle_s:g} s")
        )

    def stop(self) -> None:
        self._handle.cancel()


class _Stream:
    """One SSE answer as it arrives: lines split here (so a line may be of any length),
    every chunk checked for shape, text and tool calls joined."""

    __slots__ = (
        "_chat", "_partial", "_partial_bytes", "chunks", "done", "finish_reason",
        "first_token", "parts", "reasoning", "response_id", "tool_calls", "usage",
    )  # fmt: skip

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self._partial: list[bytes] = []  # a line not yet ended, in the blocks it came in
        self._partial_bytes = 0
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.first_token: float | None = None
        self.finish_reason: str | None = None
        self.response_id = ""
        self.usage: dict[str, Any] = {}
        self.chunks = 0
        self.done = False

    def feed(self, block: bytes) -> bool:
        """Takes the next bytes of the body; True once `data: [DONE]` has come."""
        if b"\n" not in block:
            self._partial.append(block)
            self._partial_bytes += len(block)
            if self._partial_bytes > _MAX_LINE_BYTES:
                raise _bad(f"a stream line is longer than {_MAX_LINE_BYTES >> 20} MiB")
            return False
        lines = block.split(b"\n")
        if self._partial:
            lines[0] = b"".join(self._partial) + lines[0]
            self._partial.clear()
        last = lines.pop()
        self._partial_bytes = len(last)
        if last:
            self._partial.append(last)
        return any(self._line(line) for line in lines)

    def generation(self, model_start: float) -> Generation:
        """The answer, once the body has ended; a stream cut short raises `truncated`."""
        if not self.done and self._partial:  # the last line may lack its newline
            self._line(b"".join(self._partial))
        if not self.done and self.finish_reason is None:
            raise _Retry(
                "truncated",
                "the stream ended with neither a finish_reason nor data: [DONE] "
                "(the server cut the answer short)",
            )
        return Generation(
            text="".join(self.parts),
            tool_calls=[self.tool_calls[i] for i in sorted(self.tool_calls)],
            input_tokens=_count(self.usage, "prompt_tokens"),
            # Without a usage chunk, count content chunks: one token each on most servers.
            output_tokens=_count(self.usage, "completion_tokens") or self.chunks,
            finish_reason=self.finish_reason,
            response_id=self.response_id,
            model_start=model_start,
            first_token=self.first_token,
            model_end=time.time(),
            reasoning="".join(self.reasoning),
        )

    def _line(self, line: bytes) -> bool:
        """A `data:` line is read; comments, `event:` and blank lines are skipped.
        True at `data: [DONE]`."""
        return line.startswith(b"data:") and self._event(line[5:].strip())

    def _event(self, data: bytes) -> bool:
        if data == b"[DONE]":
            self.done = True
            return True
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as error:
            raise _bad(f"a stream chunk is not JSON ({error})") from None
        if not isinstance(chunk, dict):
            raise _bad(f"a stream chunk is not a JSON object ({_clip(chunk)})")
        if chunk.get("error") or chunk.get("object") == "error":
            # A server that fails mid-stream sends an error event, not an HTTP status.
            raise _bad(f"the stream ended in an error: {_clip(chunk.get('error') or chunk)}")
        if not self.response_id:
            self.response_id = _id(chunk.get("id"))
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise _bad(f"a stream chunk's choices is not a list ({_clip(choices)})")
        for choice in choices:
            if not isinstance(choice, dict):
                raise _bad(f"a stream chunk's choice is not an object ({_clip(choice)})")
            self._choice(choice)
        return False

    def _choice(self, choice: dict[str, Any]) -> None:
        if self._chat:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise _bad(f"a stream chunk's delta is not an object ({_clip(delta)})")
            piece = delta.get("content")
            thought = _reasoning(delta)
            if thought:
                self.first_token = self.first_token or time.time()
                self.reasoning.append(thought)
                self.chunks += 1
            calls = delta.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _bad(f"a streamed tool_calls is not a list ({_clip(calls)})")
            for call in calls:
                _merge_tool_call(self.tool_calls, call)
                self.first_token = self.first_token or time.time()
        else:
            piece = choice.get("text")
        if piece:
            if not isinstance(piece, str):
                raise _bad(f"a stream chunk's text is not a string ({_clip(piece)})")
            self.first_token = self.first_token or time.time()
            self.parts.append(piece)
            self.chunks += 1
        if choice.get("finish_reason") is not None:
            self.finish_reason = _finish_reason(choice)


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: Any) -> None:
    """Streamed tool calls arrive in pieces keyed by index; join their arguments."""
    if not isinstance(delta, dict):
        raise _bad(f"a streamed tool call is not an object ({_clip(delta)})")
    index = delta.get("index", 0)
    function = delta.get("function") or {}
    if not isinstance(index, int) or not isinstance(function, dict):
        raise _bad(f"a streamed tool call has the wrong shape ({_clip(delta)})")
    call = calls.setdefault(
        index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = _id(delta["id"])
    call["function"]["name"] += _text(function.get("name"), "tool call name")
    call["function"]["arguments"] += _text(function.get("arguments"), "tool call arguments")


def _tool_calls(value: Any) -> list[dict[str, Any]]:
    """A non-streamed answer's tool calls, each an object with an object `function`
    (what the saved response is built from)."""
    if not value:
        return []
    if not isinstance(value, list) or not all(
        isinstance(call, dict) and isinstance(call.get("function") or {}, dict) for call in value
    ):
        raise _bad(f"the answer's tool_calls are not a list of calls ({_clip(value)})")
    return value


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _bad(f"the answer's {what} is not a string ({_clip(value)})")
    return value


def _reasoning(message: dict[str, Any]) -> str:
    """The reasoning a parser split off: `reasoning_content` (vLLM before 0.16, DeepSeek)
    or `reasoning` (vLLM 0.16 on); a server that sends both sends the same text. Another
    shape under those names (an object of settings, say) is not text: left out."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _usage(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"the answer's usage is not an object ({_clip(value)})")
    return value


def _count(usage: dict[str, Any], key: str) -> int:
    """A token count from `usage` (0 when absent); anything but a whole number ≥ 0 is a
    bad answer, since a wrong count would mislead every throughput figure."""
    value = usage.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad(f"the answer's usage.{key} is not a token count ({_clip(value)})")
    return value


def _finish_reason(choice: dict[str, Any]) -> str | None:
    value = choice.get("finish_reason")
    if value is not None and not isinstance(value, str):
        raise _bad(f"the answer's finish_reason is not a string ({_clip(value)})")
    return value


def _id(value: Any) -> str:
    return "" if value is None else str(value)


def _clip(value: Any) -> str:
    """A value as it came, short enough for one failure message."""
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."
