"""An OpenAI-compatible HTTP front end on the simulated engine, taking vLLM's flag names.

Every response carries `x-autotune-simulated: true`, the served model id starts with `sim/`
and /metrics exports `autotune_simulated 1`: nothing measured here can pass for a real GPU.

Token accounting: a prompt is ceil(characters / 4) tokens (all message contents for chat);
the output is `max_tokens` (or `max_completion_tokens`, default 256) with `ignore_eos`, else
the shorter of that and a deterministic draw (exponential, mean `--natural-output-tokens`)
keyed on the prompt text and `--seed`, which is where the fake model "emits EOS". Output
text is "tok " per token. Streams send the first token at once, then coalesce tokens into
at most one chunk per STREAM_INTERVAL_S of real time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson
from aiohttp import web

from autotune.errors import UsageError
from autotune.servers.sim.perf_model import InsufficientMemory, kv_capacity_tokens
from autotune.servers.sim.profiles import GPUS, MODELS, GpuProfile, ModelProfile, find_model
from autotune.servers.sim.scheduler import EngineConfig, Histogram, Request, SimEngine

log = logging.getLogger(__name__)

STREAM_INTERVAL_S = 0.02
"""Least real time between two stream chunks of one request after its first token."""

DEFAULT_MAX_TOKENS = 256
LISTEN_BACKLOG = 4096
BLOCK_SIZES = (8, 16, 32, 64, 128)
TOKEN_TEXT = "tok "  # 4 characters: one simulated token
SIM_PREFIX = "sim/"


class SimConfigError(ValueError):
    """A flag value the simulator (like vLLM) refuses at start-up; str() is the error text."""


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting 2, so errors stay one vLLM-like line."""

    def error(self, message: str) -> NoReturn:
        raise SimConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    """vLLM's flag names (those the simulator models) plus the simulator's own knobs."""
    p = _Parser(
        prog="python -m autotune.servers.sim",
        description="Simulated vLLM-like OpenAI-compatible server (SIMULATED: no model runs).",
        allow_abbrev=False,
    )
    p.add_argument("--model", default="llama-3.1-8b", help=f"one of {', '.join(MODELS)}")
    p.add_argument("--served-model-name", nargs="+", default=None, help="default sim/<model>")
    p.add_argument("--gpu", default="h100-80gb", help=f"one of {', '.join(GPUS)}")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="real seconds per simulated second (0.05 runs 20x faster, 0 as fast as possible)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--natural-output-tokens",
        type=int,
        default=400,
        help="mean output length at which the fake model stops when ignore_eos is not set",
    )
    p.add_argument(
        "--die-after-requests",
        type=int,
        default=None,
        metavar="N",
        help="exit abruptly (os._exit(1)) once N requests have been accepted",
    )
    p.add_argument(
        "--crash-above-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="exit abruptly (os._exit(1)) when more than N requests are in the server at "
        "once, like a server that runs out of memory under load",
    )
    p.add_argument(
        "--max-request-rate",
        type=float,
        default=None,
        metavar="R",
        help="requests/s; past it answer 429 with Retry-After, like a hosted API",
    )
    return p


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The validated server configuration."""

    gpu: GpuProfile
    model: ModelProfile
    served_model_names: tuple[str, ...]
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    max_model_len: int
    host: str
    port: int
    time_scale: float
    seed: int
    natural_output_tokens: int
    die_after_requests: int | None
    crash_above_concurrency: int | None
    max_request_rate: float | None
    kv_capacity_tokens: int
    ignored_flags: tuple[str, ...]

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            gpu=self.gpu,
            model=self.model,
            tp=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size,
            time_scale=self.time_scale,
            kv_capacity_tokens=self.kv_capacity_tokens,
        )


def load_config(argv: Sequence[str]) -> SimConfig:
    """Parse and validate flags the way vLLM does at start-up; raises SimConfigError."""
    ns, unknown = build_parser().parse_known_args(list(argv))
    gpu = GPUS.get(ns.gpu)
    if gpu is None:
        raise SimConfigError(
            f"Unknown GPU profile {ns.gpu!r}. Known profiles: {', '.join(GPUS)}; "
            "pass one with --gpu."
        )
    model = find_model(ns.model)
    if model is None:
        raise SimConfigError(
            f"Unknown model profile {ns.model!r}. Known profiles: {', '.join(MODELS)}; "
            "pass one with --model."
        )
    tp = ns.tensor_parallel_size
    if tp < 1 or model.attention_heads % tp:
        raise SimConfigError(
            f"Total number of attention heads ({model.attention_heads}) must be divisible by "
            f"tensor parallel size ({tp})."
        )
    if not 0 < ns.gpu_memory_utilization <= 1:
        raise SimConfigError(
            f"GPU memory utilization must be within (0, 1]. Got {ns.gpu_memory_utilization}."
        )
    if ns.block_size not in BLOCK_SIZES:
        raise SimConfigError(
            f"Invalid block size {ns.block_size}; choose one of "
            f"{', '.join(map(str, BLOCK_SIZES))} with --block-size."
        )
    if ns.max_num_seqs < 1:
        raise SimConfigError(f"max_num_seqs ({ns.max_num_seqs}) must be at least 1.")
    if ns.max_num_batched_tokens < ns.max_num_seqs:
        raise SimConfigError(
            f"max_num_batched_tokens ({ns.max_num_batched_tokens}) must be greater than or "
            f"equal to max_num_seqs ({ns.max_num_seqs})."
        )
    if not 1 <= ns.max_model_len <= model.max_position_embeddings:
        raise SimConfigError(
            f"User-specified max_model_len ({ns.max_model_len}) is outside 1.."
            f"{model.max_position_embeddings} (max_position_embeddings in {model.name}'s "
            "config.json)."
        )
    if ns.time_scale < 0 or not math.isfinite(ns.time_scale):
        raise SimConfigError(f"--time-scale must be a finite number >= 0, got {ns.time_scale}.")
    if ns.natural_output_tokens < 1:
        raise SimConfigError("--natural-output-tokens must be at least 1.")
    if ns.die_after_requests is not None and ns.die_after_requests < 1:
        raise SimConfigError("--die-after-requests must be at least 1.")
    if ns.crash_above_concurrency is not None and ns.crash_above_concurrency < 1:
        raise SimConfigError("--crash-above-concurrency must be at least 1.")
    if ns.max_request_rate is not None and not ns.max_request_rate > 0:
        raise SimConfigError("--max-request-rate must be a positive number of requests/s.")
    try:
        capacity = kv_capacity_tokens(gpu, model, tp, ns.gpu_memory_utilization, ns.block_size)
    except InsufficientMemory as e:
        raise SimConfigError(str(e)) from None
    if ns.max_model_len > capacity - ns.block_size // 2:
        raise SimConfigError(
            f"The model's max seq len ({ns.max_model_len}) is larger than the maximum number "
            f"of tokens that can be stored in KV cache ({capacity}). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )
    names = ns.served_model_name if ns.served_model_name else [SIM_PREFIX + model.name]
    names = [n if n.startswith(SIM_PREFIX) else SIM_PREFIX + n for n in names]
    return SimConfig(
        gpu=gpu,
        model=model,
        served_model_names=tuple(names),
        tensor_parallel_size=tp,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        block_size=ns.block_size,
        max_model_len=ns.max_model_len,
        host=ns.host,
        port=ns.port,
        time_scale=ns.time_scale,
        seed=ns.seed,
        natural_output_tokens=ns.natural_output_tokens,
        die_after_requests=ns.die_after_requests,
        crash_above_concurrency=ns.crash_above_concurrency,
        max_request_rate=ns.max_request_rate,
        kv_capacity_tokens=capacity,
        ignored_flags=tuple(unknown),
    )


def natural_output_tokens(text: str, seed: int, mean: int) -> int:
    """Where the fake model stops on its own: exponential with `mean`, fixed by text and seed."""
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=str(seed).encode()).digest()
    u = (int.from_bytes(digest, "big") + 1) / 2.0**64  # (0, 1]
    return max(1, round(-mean * math.log(u)))


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """vLLM's (OpenAI-style) error body."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class _BadRequest(Exception):
    """A request the server answers with 400 and this message."""


def _text_of(content: Any) -> str:
    """Message content: a string, or a list of parts whose `text` fields count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    raise _BadRequest("message content must be a string or a list of content parts")


def _prompt_of(body: dict[str, Any], chat: bool) -> tuple[str, int]:
    """(text the output length is keyed on, prompt tokens)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("`messages` must be a non-empty list")
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                raise _BadRequest("each message must be an object")
            parts.append(_text_of(m.get("content")))
        text = "".join(parts)
        return text, max(1, math.ceil(len(text) / 4))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, max(1, math.ceil(len(prompt) / 4))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return ",".join(map(str, prompt)), len(prompt)
    raise _BadRequest("`prompt` must be a string, a list of token ids or a list of one string")


async def _wait_briefly(fut: asyncio.Future[None], timeout: float) -> None:
    """Return when `fut` is done or `timeout` passed, without wrapping it in a task."""
    if fut.done():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout, wake)
    fut.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        fut.remove_done_callback(wake)


class _Service:
    """The HTTP handlers, bound to one engine and one configuration."""

    def __init__(self, config: SimConfig, engine: SimEngine) -> None:
        self.config = config
        self.engine = engine
        self.created = int(time.time())
        self.accepted = 0
        self._known_models = {*config.served_model_names, config.model.name}
        rate = config.max_request_rate
        self._burst = max(1.0, rate) if rate else 0.0
        self._bucket = self._burst
        self._bucket_at = time.monotonic()

    # -- admission ---------------------------------------------------------------------------

    def _rate_limited(self) -> float | None:
        """Seconds to wait if this request is over --max-request-rate (leaky bucket), else None."""
        rate = self.config.max_request_rate
        if not rate:
            return None
        now = time.monotonic()
        self._bucket = min(self._burst, self._bucket + (now - self._bucket_at) * rate)
        self._bucket_at = now
        if self._bucket >= 1.0:
            self._bucket -= 1.0
            return None
        return (1.0 - self._bucket) / rate

    def _accept(self) -> None:
        self.accepted += 1
        limit = self.config.die_after_requests
        if limit is not None and self.accepted >= limit:
            _crash(f"--die-after-requests {limit} reached")
        ceiling = self.config.crash_above_concurrency
        if ceiling is not None:
            stats = self.engine.stats()
            if stats.running + stats.waiting + 1 > ceiling:
                _crash(f"more than --crash-above-concurrency {ceiling} requests at once")

    # -- endpoints ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "autotune-sim",
                "root": self.config.model.name,
                "parent": None,
                "max_model_len": self.config.max_model_len,
                "simulated": True,
            }
            for name in self.config.served_model_names
        ]
        return web.json_response({"object": "list", "data": data}, dumps=_dumps)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.render_metrics(), content_type="text/plain")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        wait = self._rate_limited()
        if wait is not None:
            resp = _error(
                429,
                f"Rate limit reached for {self.config.served_model_name} (simulated): "
                f"{self.config.max_request_rate:g} requests/s. Please try again in {wait:.3f}s.",
                "rate_limit_error",
            )
            resp.headers["Retry-After"] = str(max(1, math.ceil(wait)))
            resp.headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
            return resp
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return _error(400, f"Request body is not valid JSON: {e}", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "Request body must be a JSON object", "BadRequestError")
        model = body.get("model")
        if model is not None and model not in self._known_models:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        try:
            text, prompt_tokens = _prompt_of(body, chat)
            max_tokens, explicit = self._max_tokens(body, chat, prompt_tokens)
            if body.get("n") not in (None, 1):
                raise _BadRequest("the simulated server supports only n=1")
        except _BadRequest as e:
            return _error(400, str(e), "BadRequestError")
        limit = self.config.max_model_len
        if prompt_tokens + max_tokens > limit:
            where = "messages" if chat else "prompt"
            return _error(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {where}, "
                f"{max_tokens} in the completion). Please reduce the length of the {where} or "
                "completion.",
                "BadRequestError",
                "max_tokens" if explicit else None,
            )
        if body.get("ignore_eos"):
            output = max_tokens
        else:
            seed_text = text if body.get("seed") is None else f"{body['seed']}\x00{text}"
            natural = natural_output_tokens(
                seed_text, self.config.seed, self.config.natural_output_tokens
            )
            output = min(max_tokens, natural)
        finish = "length" if output == max_tokens else "stop"
        self._accept()
        req = self.engine.submit(prompt_tokens, output)
        try:
            if body.get("stream"):
                options = body.get("stream_options") or {}
                usage = isinstance(options, dict) and bool(options.get("include_usage"))
                return await self._stream(request, req, chat, finish, usage)
            await req.finished
            return self._full_response(req, chat, finish)
        finally:
            if not req.done:
                req.abort()

    def _max_tokens(self, body: dict[str, Any], chat: bool, prompt: int) -> tuple[int, bool]:
        value = body.get("max_completion_tokens") if chat else None
        if value is None:
            value = body.get("max_tokens")
        if value is None:
            room = self.config.max_model_len - prompt
            return (min(DEFAULT_MAX_TOKENS, room) if room > 0 else DEFAULT_MAX_TOKENS), False
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _BadRequest(f"max_tokens must be at least 1, got {value!r}.")
        return value, True

    def _usage(self, req: Request) -> dict[str, int]:
        out = req.tokens_done()
        return {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": out,
            "total_tokens": req.prompt_tokens + out,
        }

    def _full_response(self, req: Request, chat: bool, finish: str) -> web.Response:
        text = TOKEN_TEXT * req.output_tokens
        name = self.config.served_model_name
        choice: dict[str, Any]
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
            kind, prefix = "chat.completion", "chatcmpl-"
        else:
            choice = {"index": 0, "text": text}
            kind, prefix = "text_completion", "cmpl-"
        choice.update(logprobs=None, finish_reason=finish, stop_reason=None)
        body = {
            "id": prefix + uuid.uuid4().hex,
            "object": kind,
            "created": int(time.time()),
            "model": name,
            "choices": [choice],
            "usage": self._usage(req),
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _stream(
        self, request: web.Request, req: Request, chat: bool, finish: str, include_usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        base: dict[str, Any] = {
            "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.config.served_model_name,
        }

        def chunk(tokens: int, first: bool, reason: str | None) -> bytes:
            text = TOKEN_TEXT * tokens
            choice: dict[str, Any]
            if chat:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                choice = {"index": 0, "delta": delta}
            else:
                choice = {"index": 0, "text": text}
            choice.update(logprobs=None, finish_reason=reason)
            return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

        try:
            await req.first_token
            sent = 0
            while True:
                done = req.tokens_done()
                finished = req.done
                if done > sent or finished:
                    await resp.write(chunk(done - sent, sent == 0, finish if finished else None))
                    sent = done
                if finished:
                    break
                await _wait_briefly(req.finished, STREAM_INTERVAL_S)
            if include_usage:
                usage = {**base, "choices": [], "usage": self._usage(req)}
                await resp.write(b"data: " + orjson.dumps(usage) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client left; the caller aborts the request
        return resp

    # -- /metrics ----------------------------------------------------------------------------

    def render_metrics(self) -> str:
        """Prometheus text in vLLM's metric names, plus `autotune_simulated 1`."""
        s = self.engine.stats()
        label = f'model_name="{self.config.served_model_name}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float) -> None:
            base = name.removesuffix("_total") if kind == "counter" else name
            lines.extend(
                (
                    f"# HELP {base} {help_} (SIMULATED)",
                    f"# TYPE {base} {kind}",
                    f"{name}{{{label}}} {value}",
                )
            )

        def histogram(name: str, help_: str, h: Histogram) -> None:
            lines.extend((f"# HELP {name} {help_} (SIMULATED)", f"# TYPE {name} histogram"))
            for bound, n in h.cumulative():
                le = "+Inf" if math.isinf(bound) else repr(bound)
                lines.append(f'{name}_bucket{{le="{le}",{label}}} {n}')
            lines.append(f"{name}_sum{{{label}}} {h.sum!r}")
            lines.append(f"{name}_count{{{label}}} {h.count}")

        metric("vllm:num_requests_running", "gauge", "Requests in the running batch.", s.running)
        metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", s.waiting)
        metric(
            "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 means 100 percent.", s.kv_usage
        )
        metric(
            "vllm:num_preemptions_total", "counter", "Cumulative preemptions.", s.preemptions_total
        )
        metric(
            "vllm:prompt_tokens_total",
            "counter",
            "Prefill tokens processed.",
            s.prompt_tokens_total,
        )
        metric(
            "vllm:generation_tokens_total",
            "counter",
            "Generation tokens processed.",
            s.generation_tokens_total,
        )
        e = self.engine
        histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in real seconds.", e.ttft
        )
        histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end latency in real seconds.", e.e2e_latency
        )
        histogram(
            "vllm:request_queue_time_seconds",
            "Time waiting before admission, real seconds.",
            e.queue_time,
        )
        lines.append("# HELP autotune_simulated 1: this is autotune's simulated server, not a GPU.")
        lines.append("# TYPE autotune_simulated gauge")
        lines.append("autotune_simulated 1")
        return "\n".join(lines) + "\n"


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


async def _mark_simulated(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["x-autotune-simulated"] = "true"


def build_app(config: SimConfig, engine: SimEngine) -> web.Application:
    """The aiohttp application; the caller owns the engine's lifetime."""
    service = _Service(config, engine)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_response_prepare.append(_mark_simulated)
    app.router.add_get("/health", service.health)
    app.router.add_get("/v1/models", service.models)
    app.router.add_get("/metrics", service.metrics)
    app.router.add_post("/v1/chat/completions", service.chat)
    app.router.add_post("/v1/completions", service.completions)
    return app


@contextlib.asynccontextmanager
async def _serving(config: SimConfig) -> AsyncIterator[int]:
    """Run engine + HTTP site for the block's duration; yields the bound port."""
    async with SimEngine(config.engine_config()) as engine:
        runner = web.AppRunner(
            build_app(config, engine), access_log=None, handler_cancellation=True
        )
        await runner.setup()
        try:
            # A deep accept queue: 128 (the default) makes bursts of new connections wait for
            # a 1 s SYN retry, which would pass for server latency in a measurement.
            site = web.TCPSite(runner, config.host, config.port, backlog=LISTEN_BACKLOG)
            await site.start()
            yield int(runner.addresses[0][1])  # the real port when --port 0
        finally:
            await runner.cleanup()


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


@contextlib.asynccontextmanager
async def serve_in_process(args: Sequence[str]) -> AsyncIterator[str]:
    """Serve on this event loop; yields the base URL `http://HOST:PORT/v1`.

    Raises UsageError for flags the server would refuse at start-up.
    """
    try:
        config = load_config(args)
    except SimConfigError as e:
        raise UsageError(f"Simulated server flags rejected: {e}") from None
    if config.die_after_requests is not None or config.crash_above_concurrency is not None:
        raise UsageError(
            "--die-after-requests and --crash-above-concurrency would kill this process; "
            "run the simulator as a subprocess "
            "(autotune.servers.launcher.ServerProcess with sim_command) instead."
        )
    if config.ignored_flags:
        log.warning("simulated server ignores flags: %s", " ".join(config.ignored_flags))
    async with _serving(config) as port:
        yield f"http://{_client_host(config.host)}:{port}/v1"


async def _serve_forever(config: SimConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with _serving(config) as port:
            print(
                f"INFO: simulated vLLM-like server (SIMULATED, {config.gpu.name}, "
                f"{config.model.name}, tp={config.tensor_parallel_size}, kv capacity "
                f"{config.kv_capacity_tokens} tokens) listening on "
                f"http://{config.host}:{port}",
                flush=True,
            )
            await stop.wait()
    except OSError as e:
        print(f"OSError: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m autotune.servers.sim`; returns the exit status."""
    try:
        config = load_config(sys.argv[1:] if argv is None else argv)
    except SimConfigError as e:
        print(f"ValueError: {e}", file=sys.stderr, flush=True)
        return 1
    if config.ignored_flags:
        print(
            "WARNING: the simulated server ignores flags it does not model: "
            + " ".join(config.ignored_flags),
            file=sys.stderr,
            flush=True,
        )
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve_forever(config))
    return uvloop.run(_serve_forever(config))


def _crash(why: str) -> None:
    """Die the way a crashed server does: no answer, no clean shutdown."""
    sys.stderr.write(f"ERROR: simulated crash: {why}, exiting abruptly\n")
    sys.stderr.flush()
    os._exit(1)
