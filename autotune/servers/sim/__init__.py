"""The simulated vLLM-like server: a roofline performance model, a continuous-batching
engine in scaled real time with prefix caching, and an OpenAI-compatible HTTP front end
over one or more engines (all marked SIMULATED). Its GPU and model profiles, KV-cache
sizing, flags and the datasheet ceiling of a layout of GPUs live in hardware/, which the
sweep shares.

The HTTP layer (aiohttp) is imported only when one of its names is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.servers.sim.scheduler import EngineConfig, EngineStats, Request, SimEngine

if TYPE_CHECKING:
    from autotune.servers.sim.server import main, serve_in_process

__all__ = [
    "EngineConfig",
    "EngineStats",
    "Request",
    "SimEngine",
    "main",
    "serve_in_process",
]

_SERVER_NAMES = {"main", "serve_in_process"}


def __getattr__(name: str) -> Any:
    if name in _SERVER_NAMES:
        from autotune.servers.sim import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
