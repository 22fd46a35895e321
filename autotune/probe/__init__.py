"""Probes: measure one setting (a parallelism, against one running configuration) →
ProbeResult, all in `window`'s steady-state window: `EngineProbe`, `CommandProbe`,
`VirtualProbe`. Diagnose, sweep and bench are all made of probes.
Why: docs/design/probes.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from autotune.results.probes import ProbeResult
from autotune.window import ProbeSettings, Window, steady_window


class Probe(Protocol):
    """Measures throughput at one parallelism of an already running configuration.

    `settings` set how long and how precisely for this measurement only (a sweep's short
    first rungs, a long validation run); None: the probe's own.
    """

    async def measure(
        self, parallelism: int, settings: ProbeSettings | None = None
    ) -> ProbeResult: ...


class Launcher(Protocol):
    """Starts a server configuration and stops it when the block ends.

    A configuration the server refuses raises ServerStartupError, whose `reason` is the
    server's own error line.
    """

    def running(self, knobs: Mapping[str, Any]) -> AbstractAsyncContextManager[Probe]: ...


__all__ = ["Launcher", "Probe", "ProbeResult", "ProbeSettings", "Window", "steady_window"]
