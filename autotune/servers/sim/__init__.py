"""The simulated vLLM-like server: a roofline performance model, a continuous-batching
engine in scaled real time with prefix caching, an OpenAI-compatible HTTP front end over
one or more engines (all marked SIMULATED), and the datasheet ceiling of a layout of GPUs.

The HTTP layer (aiohttp) is imported only when one of its names is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.servers.sim.perf_model import InsufficientMemory
from autotune.servers.sim.profiles import GPUS, MODELS, GpuProfile, ModelProfile
from autotune.servers.sim.roofline import Roofline, roofline
from autotune.servers.sim.scheduler import EngineConfig, EngineStats, Request, SimEngine

if TYPE_CHECKING:
    from autotune.servers.sim.server import build_parser, main, serve_in_process

__all__ = [
    "GPUS",
    "MODELS",
    "EngineConfig",
    "EngineStats",
    "GpuProfile",
    "InsufficientMemory",
    "ModelProfile",
    "Request",
    "Roofline",
    "SimEngine",
    "build_parser",
    "main",
    "roofline",
    "serve_in_process",
]

_SERVER_NAMES = {"build_parser", "main", "serve_in_process"}


def __getattr__(name: str) -> Any:
    if name in _SERVER_NAMES:
        from autotune.servers.sim import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
