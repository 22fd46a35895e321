"""The parts every rollout job wires together: a checked target, a backend, a verifier.

Collect and diagnose (and bench) open the same pipeline; the embedded simulator and the
verifier's worker pool live exactly as long as the `async with` block.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import aiohttp

from autotune.backends.openai import OpenAIBackend
from autotune.config import CollectConfig, TargetConfig
from autotune.target import Target, api_key, connect, synthetic_defaults
from autotune.verifiers import Verifier, VerifierOptions, load_verifier


@dataclass(frozen=True, slots=True)
class Pipeline:
    session: aiohttp.ClientSession
    target: Target
    backend: OpenAIBackend
    verifier: Verifier
    target_config: TargetConfig


@asynccontextmanager
async def open_pipeline(
    config: CollectConfig, default_sim_args: Sequence[str] = ()
) -> AsyncIterator[Pipeline]:
    target_config = synthetic_defaults(config.target, config.input is None)
    async with connect(target_config, default_sim_args) as (session, target):
        backend = OpenAIBackend(
            session,
            replace(target_config, base_url=target.base_url),
            target.model,
            api_key(target_config),
        )
        verifier = await load_verifier(
            config.verifier,
            VerifierOptions(
                workers=config.verifier_workers,
                cost_ms=config.verifier_cost_ms,
                timeout_s=config.verifier_timeout_s,
            ),
            session,
        )
        try:
            yield Pipeline(session, target, backend, verifier, target_config)
        finally:
            await verifier.aclose()
