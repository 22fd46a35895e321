"""The simulated server's HTTP face: an OpenAI-compatible API, /metrics and RL endpoints in
vLLM's, SGLang's or TensorRT-LLM's dialect over one or more engines of the engine model,
every response marked SIMULATED. What it counts and how it answers: docs/design/simulator.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiohttp import web

from autotune.engine_model.scheduler import SimEngine
from autotune.engine_model.state import Request, engine_config
from autotune.errors import UsageError
from autotune.hardware.deployment import SimConfig, SimConfigError
from autotune.servers.sim.dialect import (
    DEFAULT_MAX_TOKENS,
    TOKEN_TEXT,
    BadRequest,
    error_response,
    json_text,
    natural_output_tokens,
    prefix_key,
    prompt_of,
    simulated_tool_call,
    unknown_fields,
    validation_error,
)
from autotune.servers.sim.metrics import IterationStats, Served, prometheus_text
from autotune.servers.sim.policy import Policy, RolloutReplay, uniform
from autotune.servers.sim.rl_endpoints import ControlEndpoints, VllmEndpoints
from autotune.servers.sim.sglang_endpoints import SglangEndpoints
from autotune.servers.sim.trtllm_endpoints import TrtllmEndpoints

log = logging.getLogger(__name__)


STREAM_INTERVAL_S = 0.02


"""Least real time between two stream chunks of one request after its first token."""


LISTEN_BACKLOG = 4096


CONTROL_ENDPOINTS: dict[str, type[ControlEndpoints]] = {
    "vllm": VllmEndpoints,
    "sglang": SglangEndpoints,
    "trtllm": TrtllmEndpoints,
}
"""Each engine's RL endpoints, by the engine's name."""


@dataclass(frozen=True, slots=True)
class ServerConfig(SimConfig):
    """The validated server configuration, and the engines' configuration it gives."""

    replay: RolloutReplay | None = None  # the --rollouts file, read once by load_config


def load_config(argv: Sequence[str], prog: str | None = None) -> ServerConfig:
    """The configuration the flags give (SimConfig.from_args), with its --rollouts file
    read; raises SimConfigError."""
    config = ServerConfig.from_args(argv, prog)
    if config.rollouts is None:
        return config
    return replace(config, replay=RolloutReplay.load(config.rollouts))


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
    """The HTTP handlers, bound to the engines and one configuration."""

    def __init__(
        self, config: ServerConfig, engines: Sequence[SimEngine], control: ControlEndpoints
    ) -> None:
        self.config = config
        self.engines = tuple(engines)
        self.control = control
        self.imitated = config.engine  # the engine whose dialect it speaks
        # the finish_reason of a request a pause or sleep ended, as that engine writes it
        self.cancelled = min(config.engine.dialect.cancelled_reasons)
        self.iteration_stats = IterationStats(engines, config.time_scale)
        self.created = int(time.time())
        self.accepted = 0
        self._known_models = {*config.served_model_names, config.model.name}
        rate = config.max_request_rate
        self._burst = max(1.0, rate) if rate else 0.0
        self._bucket = self._burst
        self._bucket_at = time.monotonic()
        self._policy = Policy(
            config.seed,
            config.natural_output_tokens,
            config.output_length_sigma,
            config.uninformative_share,
            config.replay,
        )
        # Per engine, requests that ended by vLLM's finished_reason (abort: the client left;
        # vLLM 0.32 itself leaves client aborts out of this count, upstream issue #31503).
        self._finished = [dict.fromkeys(("stop", "length", "abort"), 0) for _ in self.engines]

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
            inside = sum(e.num_running + e.num_waiting for e in self.engines)
            if inside + 1 > ceiling:
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
                "data_parallel_size": self.config.data_parallel_size,
            }
            for name in self.config.served_model_names
        ]
        if self.imitated.name == "trtllm":  # its model cards say no context length
            for card in data:
                del card["max_model_len"]
        return web.json_response({"object": "list", "data": data}, dumps=json_text)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.render_metrics(), content_type="text/plain")

    async def iteration_stats_json(self, request: web.Request) -> web.Response:
        """TensorRT-LLM's GET /metrics: its iteration stats as JSON."""
        return web.json_response(self.iteration_stats.take(), dumps=json_text)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        wait = self._rate_limited()
        if wait is not None:
            resp = error_response(
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
            return error_response(400, f"Request body is not valid JSON: {e}", "BadRequestError")
        if not isinstance(body, dict):
            return error_response(400, "Request body must be a JSON object", "BadRequestError")
        dialect = self.imitated.dialect
        if dialect.forbids_unknown and (unknown := unknown_fields(body, chat, dialect)):
            return validation_error(body, unknown)
        model = body.get("model")
        if model is not None and model not in self._known_models:
            return error_response(
                404, f"The model `{model}` does not exist.", "NotFoundError", "model"
            )
        try:
            text, prompt_tokens = prompt_of(body, chat)
            max_tokens, explicit = self._max_tokens(body, chat, prompt_tokens)
            if body.get("n") not in (None, 1):
                raise BadRequest("the simulated server supports only n=1")
        except BadRequest as e:
            return error_response(400, str(e), "BadRequestError")
        limit = self.config.max_model_len
        if prompt_tokens + max_tokens > limit:
            where = "messages" if chat else "prompt"
            return error_response(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {where}, "
                f"{max_tokens} in the completion). Please reduce the length of the {where} or "
                "completion.",
                "BadRequestError",
                "max_tokens" if explicit else None,
            )
        seed_text = text if body.get("seed") is None else f"{body['seed']}\x00{text}"
        natural, answer = self._policy.sample(seed_text) if self._policy.active else (None, "")
        if body.get("ignore_eos"):
            output = max_tokens
        else:
            if natural is None:
                natural = natural_output_tokens(
                    seed_text, self.config.seed, self.config.natural_output_tokens
                )
            output = min(max_tokens, natural)
        finish = "length" if output == max_tokens else "stop"
        call = self._tool_call(body, text) if chat else None
        if call is not None:
            length = math.ceil(len(call["function"]["arguments"] + call["function"]["name"]) / 4)
            output, finish, answer = min(max_tokens, max(1, length)), "tool_calls", ""
        self._accept()
        key = prefix_key(body, chat) if self.config.enable_prefix_caching else None
        engine = self._engine()
        req = engine.submit(prompt_tokens, output, key)
        try:
            if body.get("stream"):
                options = body.get("stream_options") or {}
                usage = isinstance(options, dict) and bool(options.get("include_usage"))
                return await self._stream(request, req, chat, finish, usage, call, answer)
            await req.finished
            return self._full_response(req, chat, self._reason(req, finish), call, answer)
        finally:
            aborted = not req.done
            if aborted:
                req.abort()
            if aborted or req.server_aborted:
                reason = "abort"
            else:
                reason = "length" if finish == "length" else "stop"
            self._finished[self.engines.index(engine)][reason] += 1

    def _engine(self) -> SimEngine:
        """The engine for the next request: vLLM's DP load balancer picks the lowest
        waiting × 4 + running, the lower index on ties (`min` keeps the first)."""
        if len(self.engines) == 1:
            return self.engines[0]
        return min(self.engines, key=lambda e: e.num_waiting * 4 + e.num_running)

    def _tool_call(self, body: dict[str, Any], text: str) -> dict[str, Any] | None:
        """The simulated tool call this turn makes (--tool-call-share), if any."""
        share, tools = self.config.tool_call_share, body.get("tools")
        if (
            not share
            or not tools
            or not isinstance(tools, list)
            or body.get("tool_choice") == "none"
        ):
            return None
        if uniform(text, f"{self.config.seed}/call") > share:
            return None
        return simulated_tool_call(tools, text, self.config.seed)

    def _max_tokens(self, body: dict[str, Any], chat: bool, prompt: int) -> tuple[int, bool]:
        value = body.get("max_completion_tokens") if chat else None
        if value is None:
            value = body.get("max_tokens")
        if value is None:
            room = self.config.max_model_len - prompt
            return (min(DEFAULT_MAX_TOKENS, room) if room > 0 else DEFAULT_MAX_TOKENS), False
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {value!r}.")
        return value, True

    def _usage(self, req: Request) -> dict[str, int]:
        out = req.tokens_done()
        return {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": out,
            "total_tokens": req.prompt_tokens + out,
        }

    def _full_response(
        self,
        req: Request,
        chat: bool,
        finish: str,
        call: dict[str, Any] | None = None,
        answer: str = "",
    ) -> web.Response:
        text = TOKEN_TEXT * req.tokens_done() + answer
        if finish == self.cancelled:
            call = None
        name = self.config.served_model_name
        choice: dict[str, Any]
        if call is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message}
            kind, prefix = "chat.completion", "chatcmpl-"
        elif chat:
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
        self,
        request: web.Request,
        req: Request,
        chat: bool,
        finish: str,
        include_usage: bool,
        call: dict[str, Any] | None = None,
        answer: str = "",
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
            text = TOKEN_TEXT * tokens + (answer if reason is not None else "")
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
            if call is not None and not req.server_aborted:  # the whole call at its end
                await req.finished
            if call is not None and not req.server_aborted:
                delta = {"role": "assistant", "tool_calls": [{"index": 0, **call}]}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                await resp.write(b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n")
            while call is None or req.server_aborted:
                done = req.tokens_done()
                finished = req.done
                if done > sent or finished:
                    reason = self._reason(req, finish) if finished else None
                    await resp.write(chunk(done - sent, sent == 0, reason))
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
        """Prometheus text in the imitated engine's metric names (servers/sim/metrics.py)."""
        served = Served(self.control.pauses, self.control.weight_updates)
        name = self.config.served_model_name
        return prometheus_text(self.imitated, name, self.engines, self._finished, served)

    def _reason(self, req: Request, finish: str) -> str:
        """The finish_reason of a request that has ended: the engine's cancel reason when
        a pause or sleep ended it."""
        return self.cancelled if req.server_aborted else finish


def _marker(time_scale: float) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """Marks every response simulated, with the time scale the engine runs at, so a
    client can report simulated time (real seconds = simulated seconds × the scale)."""

    async def mark(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-autotune-simulated"] = "true"
        response.headers["x-autotune-time-scale"] = repr(time_scale)

    return mark


def build_app(config: ServerConfig, engines: Sequence[SimEngine]) -> web.Application:
    """The aiohttp application; the caller owns the engines' lifetime."""
    control = CONTROL_ENDPOINTS[config.engine.name](config, engines)
    service = _Service(config, engines, control)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_response_prepare.append(_marker(config.time_scale))
    app.router.add_get("/health", service.health)
    app.router.add_get("/v1/models", service.models)
    app.router.add_get(config.engine.metrics.path, service.metrics)
    if config.engine.metrics.path != "/metrics":  # TensorRT-LLM: JSON iteration stats there
        app.router.add_get("/metrics", service.iteration_stats_json)
    app.router.add_post("/v1/chat/completions", service.chat)
    app.router.add_post("/v1/completions", service.completions)
    control.register(app)
    return app


@contextlib.asynccontextmanager
async def _serving(config: ServerConfig) -> AsyncIterator[int]:
    """Run the engines + HTTP site for the block's duration; yields the bound port."""
    async with contextlib.AsyncExitStack() as stack:
        one_engine = engine_config(config)
        engines = [
            await stack.enter_async_context(SimEngine(one_engine))
            for _ in range(config.data_parallel_size)
        ]
        runner = web.AppRunner(
            build_app(config, engines), access_log=None, handler_cancellation=True
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


def _start_up_lines(config: ServerConfig, port: int) -> list[str]:
    """What the server is and where it listens (and what a replay assumes)."""
    lines = [
        f"INFO: simulated {config.engine.title}-like server (SIMULATED, {config.gpu.name}, "
        f"{config.model.name}, tp={config.tensor_parallel_size}, "
        f"dp={config.data_parallel_size}, kv capacity {config.kv_capacity_tokens} "
        f"tokens per engine) listening on http://{config.host}:{port}"
    ]
    measured = config.measured
    if measured is not None:
        lines.append(
            f"INFO: replaying {measured.describe()}: steps take the measured time per "
            "output token at the running concurrency, interpolated between measured "
            f"points, and below {measured.lowest} as at {measured.lowest}"
        )
    return lines


async def _serve_forever(config: ServerConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with _serving(config) as port:
            if not config.quiet:
                print("\n".join(_start_up_lines(config, port)), flush=True)
            await stop.wait()
    except OSError as e:
        print(f"OSError: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of `python -m autotune.servers.sim` and `autotune sim serve`; returns
    the exit status."""
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, prog)
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
