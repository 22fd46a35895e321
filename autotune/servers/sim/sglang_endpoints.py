"""SGLang's RL endpoints on the simulated engines: pause_generation in its three modes,
continue_generation, flush_cache, memory occupation, weights from disk and its server and
model info. Why: docs/design/simulator.md.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from autotune.config.flags import field_name
from autotune.servers.sim.rl_endpoints import (
    VERSION,
    ControlEndpoints,
    bad_request,
    healthy,
    json_body,
    tags_problem,
)

# SGLang's answer to /flush_cache, 200 or 400 alike (python/sglang/srt/entrypoints/http_server.py)
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class SglangEndpoints(ControlEndpoints):
    """SGLang's endpoints (http_server.py), modes and tags in a JSON body. Releasing its
    memory frees the KV cache of requests a pause kept, which recompute on resuming."""

    def register(self, app: web.Application) -> None:
        router = app.router
        router.add_post("/pause_generation", self.pause_generation)
        router.add_post("/continue_generation", self.continue_generation)
        for method in ("GET", "POST"):
            router.add_route(method, "/flush_cache", self.flush_cache)
        router.add_post("/release_memory_occupation", self.release_memory)
        router.add_post("/resume_memory_occupation", self.resume_memory)
        router.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        for path in ("/get_server_info", "/server_info"):
            router.add_get(path, self.server_info)
        for path in ("/get_model_info", "/model_info"):
            router.add_get(path, self.model_info)
        router.add_get("/health_generate", healthy)

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        spelled = self._config.engine.control.pause_modes.items()
        modes = {engine_mode: mode for mode, engine_mode in spelled}
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in modes:
            return bad_request(f"Invalid pause mode: {mode}; one of {', '.join(modes)}")
        await self._pause(modes[mode])
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self._resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if any(e.num_running or e.num_waiting for e in self._engines):
            return web.Response(status=400, text=FLUSHED)
        self._reset_prefix_cache()
        return web.Response(text=FLUSHED)

    async def release_memory(self, request: web.Request) -> web.Response:
        if (problem := tags_problem(await json_body(request))) is not None:
            return bad_request(problem)
        await self._sleep(1, "keep")
        return web.json_response(None)

    async def resume_memory(self, request: web.Request) -> web.Response:
        if (problem := tags_problem(await json_body(request))) is not None:
            return bad_request(problem)
        await self._wake_up()
        return web.json_response(None)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return bad_request(
                "update_weights_from_disk needs a JSON body with a model_path string"
            )
        held = sum(e.num_running + e.num_waiting for e in self._engines)
        await self._load_weights()
        if body.get("flush_cache", True):
            self._reset_prefix_cache()
        return web.json_response(
            {
                "success": True,
                "message": "Succeeded to update model weights.",
                "num_paused_requests": held,
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        config = self._config
        args: dict[str, Any] = {
            field_name(flag): getattr(config, name)
            for name, flag in config.engine.knob_flags.items()
        }
        for name, (on, off) in config.engine.switches.items():
            for flag, value in ((on, True), (off, False)):
                if flag is not None:
                    args[field_name(flag)] = getattr(config, name) == value
        return web.json_response(
            {
                "model_path": config.model.name,
                "served_model_name": config.served_model_name,
                **args,
                "page_size": config.block_size,
                "host": config.host,
                "port": config.port,
                "max_total_num_tokens": config.kv_capacity_tokens,
                "internal_states": [
                    {"num_running_reqs": e.num_running, "num_queue_reqs": e.num_waiting}
                    for e in self._engines
                ],
                "version": VERSION,
                "simulated": True,
            }
        )

    async def model_info(self, request: web.Request) -> web.Response:
        name = self._config.model.name
        return web.json_response(
            {"model_path": name, "tokenizer_path": name, "is_generation": True}
        )
