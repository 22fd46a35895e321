"""Probes: measure one setting (a parallelism, against one running configuration) →
ProbeResult, all in `probe.window`'s steady-state window: `EngineProbe`, `CommandProbe`,
`VirtualProbe`. Diagnose, sweep and bench are all made of probes.
Why: docs/design/probes.md.
"""

from __future__ import annotations

from typing import Protocol

from autotune.probe.window import ProbeSettings, Window, steady_window
from autotune.results.probes import ProbeResult


class Probe(Protocol):
    """Measures throughput at one parallelism of an already running configuration.

    `settings` set how long and how precisely for this measurement only (a sweep's short
    first rungs, a long validation run); None: the probe's own.
    """

    async def measure(
        self, parallelism: int, settings: ProbeSettings | None = None
    ) -> ProbeResult: ...


__all__ = ["Probe", "ProbeResult", "ProbeSettings", "Window", "steady_window"]
