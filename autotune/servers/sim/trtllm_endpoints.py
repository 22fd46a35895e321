"""TensorRT-LLM's RL endpoints on the simulated engines: release_memory, resume_memory and
update_weights (it has no pause), and its version. Why: docs/design/simulator.md.
"""

from __future__ import annotations

from aiohttp import web

from autotune.servers.sim.rl_endpoints import (
    VERSION,
    ControlEndpoints,
    bad_request,
    healthy,
    json_body,
    tags_problem,
)


class TrtllmEndpoints(ControlEndpoints):
    """TensorRT-LLM's RL endpoints (tensorrt_llm/serve/openai_server.py), which real servers
    serve where they wrap a Ray-orchestrated AsyncLLM; it has no pause. Releasing its memory
    frees the KV cache of requests inside, which recompute on resuming."""

    def register(self, app: web.Application) -> None:
        router = app.router
        router.add_post("/release_memory", self.release_memory)
        router.add_post("/resume_memory", self.resume_memory)
        router.add_post("/update_weights", self.update_weights)
        router.add_get("/version", self.version)
        router.add_get("/health_generate", healthy)

    async def release_memory(self, request: web.Request) -> web.Response:
        if (problem := tags_problem(await json_body(request))) is not None:
            return bad_request(problem)
        await self._sleep(1, "keep")
        return web.json_response({"status": "success"})

    async def resume_memory(self, request: web.Request) -> web.Response:
        if (problem := tags_problem(await json_body(request))) is not None:
            return bad_request(problem)
        await self._wake_up()
        return web.json_response({"status": "success"})

    async def update_weights(self, request: web.Request) -> web.Response:
        await self._load_weights()
        return web.json_response({"status": "success"})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})
