"""What must match for two benchmark results to be compared (method, workload, model,
server software, GPUs and driver), and what is only recorded.
Why: docs/design/bench.md.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import orjson

from autotune import __version__

if TYPE_CHECKING:
    import aiohttp

NOT_USED = "not used"
DECISIVE = ("method", "workload", "model", "server", "gpu", "driver")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """One case's environment: the DECISIVE fields, then what is only recorded."""

    method: str  # what was measured and how, e.g. "probe/1"
    workload: str  # sha256 of the requests' content
    model: str  # the served model's path (vLLM's /v1/models `root`) or name
    server: str  # the server's version (GET /version), "simulated", "null" or "unknown"
    gpu: str  # "2 × NVIDIA H100 80GB HBM3", "none", or "not used"
    driver: str  # NVIDIA driver version, "none", or "not used"
    autotune: str
    host: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(**{f.name: str(data[f.name]) for f in fields(cls)})


def differences(baseline: Fingerprint, new: Fingerprint, ignore: Iterable[str] = ()) -> list[str]:
    """'field: baseline value → new value' for each decisive field that differs."""
    skip = set(ignore)
    return [
        f"{name}: {getattr(baseline, name)} → {getattr(new, name)}"
        for name in DECISIVE
        if name not in skip and getattr(baseline, name) != getattr(new, name)
    ]


def digest(value: Any) -> str:
    """A short stable hash of JSON-able data (key order does not matter)."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def hardware(used: bool) -> tuple[str, str]:
    """(GPU model and count, driver) from NVML; "not used" for a server that uses no GPU."""
    if not used:
        return NOT_USED, NOT_USED
    from autotune.telemetry.gpu import gpu_inventory

    gpus = gpu_inventory()
    if not gpus:
        return "none", "none"
    names = sorted({gpu["name"] for gpu in gpus})
    return f"{len(gpus)} × {' + '.join(names)}", str(gpus[0]["driver_version"])


def machine() -> dict[str, Any]:
    """The run's machine, recorded with every result (never decisive by itself)."""
    from autotune.telemetry.gpu import gpu_inventory

    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "autotune": __version__,
        "gpus": gpu_inventory(),
    }


def fingerprint(method: str, workload: str, model: str, server: str, uses_gpu: bool) -> Fingerprint:
    gpu, driver = hardware(uses_gpu)
    return Fingerprint(
        method=method,
        workload=workload,
        model=model,
        server=server,
        gpu=gpu,
        driver=driver,
        autotune=__version__,
        host=platform.node(),
    )


async def server_identity(
    session: aiohttp.ClientSession, base_url: str, model: str, simulated: bool
) -> tuple[str, str]:
    """(server version, model identity) as the server itself reports them.

    vLLM answers `GET /version` with {"version": ...} and lists each model's path as
    `root` in /v1/models; a server that says neither is "unknown" / the model's name.
    """
    if simulated:
        return "simulated", model
    root = base_url.rstrip("/").removesuffix("/v1")
    version = await _get_json(session, root + "/version")
    listing = await _get_json(session, base_url.rstrip("/") + "/models")
    entries: Sequence[Any] = listing.get("data") or ()
    path = next(
        (e.get("root") for e in entries if isinstance(e, dict) and e.get("id") == model), None
    )
    return str(version.get("version") or "unknown"), str(path or model)


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """The JSON object at `url`, or {} when the server has none there."""
    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return {}
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
