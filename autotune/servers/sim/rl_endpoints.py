"""The RL endpoints of vLLM's dev mode (pause, resume, update_weights, sleep, wake_up,
reset_prefix_cache) on the simulated engines, each charged what it costs on a GPU.
Why: docs/design/simulator.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiohttp import web

from autotune.engine_model.scheduler import SimEngine
from autotune.hardware.deployment import SimConfig

PAUSE_MODES = ("abort", "wait", "keep")
GB = 1e9


class WeightSyncEndpoints:
    """The handlers, over every engine of the server (data parallel: each holds weights)."""

    def __init__(self, config: SimConfig, engines: Sequence[SimEngine]) -> None:
        self._engines = tuple(engines)
        weights = config.weight_bytes_per_gpu
        self.update_s = weights / (config.weight_sync_gbps * GB)
        self.host_copy_s = weights / (config.host_gbps * GB)

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
            return _bad(f"Invalid pause mode: {mode}")
        await asyncio.gather(*(engine.pause(mode) for engine in self._engines))
        if mode != "keep" and _flag(request, "clear_cache", True):
            for engine in self._engines:
                engine.reset_prefix_cache()
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        for engine in self._engines:
            engine.resume()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": any(e.paused for e in self._engines)})

    async def init_transfer(self, request: web.Request) -> web.Response:
        return web.json_response({"message": "Weight transfer initialized"})

    async def update_weights(self, request: web.Request) -> web.Response:
        await asyncio.gather(*(engine.busy(self.update_s) for engine in self._engines))
        return web.json_response({"message": "Weights updated"})

    async def sleep(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            level = -1
        if mode not in PAUSE_MODES or level not in (0, 1, 2):
            return _bad(f"Invalid sleep level {request.query.get('level')} or mode {mode}")
        await asyncio.gather(
            *(engine.sleep(level, mode, self.host_copy_s) for engine in self._engines)
        )
        return web.json_response({"status": "sleeping", "level": level})

    async def wake_up(self, request: web.Request) -> web.Response:
        await asyncio.gather(*(engine.wake_up(self.host_copy_s) for engine in self._engines))
        return web.json_response({"status": "awake", "tags": None})

    async def is_sleeping(self, request: web.Request) -> web.Response:
        asleep = any(e.sleeping is not None for e in self._engines)
        return web.json_response({"is_sleeping": asleep})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        for engine in self._engines:
            engine.reset_prefix_cache()
        return web.Response(status=200)


def _flag(request: web.Request, name: str, default: bool) -> bool:
    value = request.query.get(name)
    return default if value is None else value.lower() in ("1", "true", "yes")


def _bad(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)
