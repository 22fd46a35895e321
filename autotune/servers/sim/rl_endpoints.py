"""The RL endpoints on the simulated engines, each charged what it costs on a GPU: what every
engine's share (ControlEndpoints), and vLLM's dev mode (pause, resume, update_weights,
sleep, wake_up, reset_prefix_cache); SGLang's and TensorRT-LLM's are in modules of their own.
Why: docs/design/simulator.md.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from autotune import __version__
from autotune.engine_model.scheduler import SimEngine
from autotune.hardware.deployment import SimConfig

PAUSE_MODES = ("abort", "wait", "keep")
GB = 1e9
VERSION = f"{__version__}+autotune-sim"


class ControlEndpoints(ABC):
    """What every engine's endpoints share: the engines (data parallel: each holds
    weights), what a weight load and a host copy cost, and what was served."""

    def __init__(self, config: SimConfig, engines: Sequence[SimEngine]) -> None:
        self._config = config
        self._engines = tuple(engines)
        weights = config.weight_bytes_per_gpu
        self.update_s = weights / (config.weight_sync_gbps * GB)
        self.host_copy_s = weights / (config.host_gbps * GB)
        self.pauses = 0  # served by the engine's pause endpoint
        self.weight_updates = 0

    @abstractmethod
    def register(self, app: web.Application) -> None: ...

    async def _pause(self, mode: str) -> None:
        """Every engine paused in autotune's `mode` (the engine model's)."""
        await asyncio.gather(*(engine.pause(mode) for engine in self._engines))
        self.pauses += 1

    def _resume(self) -> None:
        for engine in self._engines:
            engine.resume()

    async def _load_weights(self) -> None:
        """New weights arrive at every engine; no step runs meanwhile."""
        await asyncio.gather(*(engine.busy(self.update_s) for engine in self._engines))
        self.weight_updates += 1

    async def _sleep(self, level: int, mode: str) -> None:
        await asyncio.gather(
            *(engine.sleep(level, mode, self.host_copy_s) for engine in self._engines)
        )

    async def _wake_up(self) -> None:
        await asyncio.gather(*(engine.wake_up(self.host_copy_s) for engine in self._engines))

    def _reset_prefix_cache(self) -> None:
        for engine in self._engines:
            engine.reset_prefix_cache()


class VllmEndpoints(ControlEndpoints):
    """vLLM's dev-mode endpoints (VLLM_SERVER_DEV_MODE=1), modes in the query."""

    def register(self, app: web.Application) -> None:
        router = app.router
        router.add_post("/pause", self.pause)
        router.add_post("/resume", self.resume)
        router.add_get("/is_paused", self.is_paused)
        router.add_post("/init_weight_transfer_engine", self.init_transfer)
        router.add_post("/update_weights", self.update_weights)
        router.add_post("/sleep", self.sleep)
        router.add_post("/wake_up", self.wake_up)
        router.add_get("/is_sleeping", self.is_sleeping)
        router.add_post("/reset_prefix_cache", self.reset_prefix_cache)

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return bad_request(f"Invalid pause mode: {mode}")
        await self._pause(mode)
        if mode != "keep" and _flag(request, "clear_cache", True):
            self._reset_prefix_cache()
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self._resume()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": any(e.paused for e in self._engines)})

    async def init_transfer(self, request: web.Request) -> web.Response:
        return web.json_response({"message": "Weight transfer initialized"})

    async def update_weights(self, request: web.Request) -> web.Response:
        await self._load_weights()
        return web.json_response({"message": "Weights updated"})

    async def sleep(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            level = -1
        if mode not in PAUSE_MODES or level not in (0, 1, 2):
            return bad_request(f"Invalid sleep level {request.query.get('level')} or mode {mode}")
        await self._sleep(level, mode)
        return web.json_response({"status": "sleeping", "level": level})

    async def wake_up(self, request: web.Request) -> web.Response:
        await self._wake_up()
        return web.json_response({"status": "awake", "tags": None})

    async def is_sleeping(self, request: web.Request) -> web.Response:
        asleep = any(e.sleeping is not None for e in self._engines)
        return web.json_response({"is_sleeping": asleep})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self._reset_prefix_cache()
        return web.Response(status=200)


async def healthy(request: web.Request) -> web.Response:
    """A health check that generates (`/health_generate`): the simulator always can."""
    return web.Response(status=200)


async def json_body(request: web.Request) -> Any:
    """The JSON body: {} when there is none, None when it is not JSON."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def tags_problem(body: Any) -> str | None:
    """Why a memory endpoint's body is refused: it may name `tags`, a list of strings."""
    tags = body.get("tags") if isinstance(body, dict) else ()
    if tags is None or (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        return None
    return "the body must be a JSON object whose tags, if any, are a list of strings"


def _flag(request: web.Request, name: str, default: bool) -> bool:
    value = request.query.get(name)
    return default if value is None else value.lower() in ("1", "true", "yes")


def bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)
