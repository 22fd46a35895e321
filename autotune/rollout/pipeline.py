"""The parts every rollout job wires together: a checked target, a backend, a verifier.
Why: docs/design/rollout.md.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import aiohttp

from autotune.config.collection import CollectConfig, TargetConfig
from autotune.errors import ServerUnreachable
from autotune.rollout.backends import ModelBackend
from autotune.rollout.backends.nemo_gym_agent import (
    AGENT_MODEL,
    AgentBackend,
    AgentRewardVerifier,
    check_agent,
)
from autotune.rollout.backends.openai import OpenAIBackend
from autotune.rollout.target import Target, api_key, connect, open_session, synthetic_defaults
from autotune.rollout.tools import load_tools
from autotune.rollout.turns import MultiTurnBackend
from autotune.telemetry.prometheus import parse_prometheus
from autotune.verifiers import Verifier, VerifierOptions, load_verifier

log = logging.getLogger("autotune")
# Real tools answer in real time, so the embedded simulator beside them must run in real
# time too: at 20× its speed the model would seem 20× faster than the environment.
REAL_TIME_SIM_ARGS = ("--time-scale", "1.0")


@dataclass(frozen=True, slots=True)
class Pipeline:
    session: aiohttp.ClientSession
    target: Target
    backend: ModelBackend
    verifier: Verifier
    target_config: TargetConfig


@asynccontextmanager
async def open_pipeline(
    config: CollectConfig,
    default_sim_args: Sequence[str] = REAL_TIME_SIM_ARGS,
    metered: bool = False,
) -> AsyncIterator[Pipeline]:
    """`metered`: the session counts connection-pool waits (a live-metered collect)."""
    synthetic = config.synthetic if config.input is None else None
    target_config = synthetic_defaults(config.target, synthetic, config.num_repeats)
    agent_url = target_config.agent_url
    if agent_url is not None:
        async with open_session(target_config, metered) as session:
            await check_agent(session, agent_url)
            simulated, scale = await _model_server(session, target_config.metrics_url)
            target = Target(agent_url, AGENT_MODEL, simulated, scale)
            agent = AgentBackend(session, target_config, agent_url)
            yield Pipeline(session, target, agent, AgentRewardVerifier(), target_config)
        return
    if config.tools is not None and config.input is None:
        log.warning(
            "synthetic tasks offer the model no tools, so --tools %s is never called and "
            "every rollout is one model call; pass --input with tasks that list tools "
            "(responses_create_params.tools) for multi-turn rollouts",
            config.tools,
        )
    if _real_tools(config.tools) and target_config.base_url is None:
        default_sim_args = REAL_TIME_SIM_ARGS
        log.info("the embedded simulator runs in real time beside the tools at %s", config.tools)
    async with connect(target_config, default_sim_args, metered) as (session, target):
        backend: ModelBackend = OpenAIBackend(
            session,
            replace(target_config, base_url=target.base_url),
            target.model,
            api_key(target_config),
        )
        tools = await load_tools(config.tools, session, config.tool_timeout_s)
        if tools is not None:
            backend = MultiTurnBackend(backend, tools, config.max_turns, config.tool_errors)
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


def _real_tools(spec: str | None) -> bool:
    """`--tools` names a resources server (not the in-process null tools)."""
    return spec is not None and spec.lower().startswith(("http://", "https://"))


async def _model_server(
    session: aiohttp.ClientSession, metrics_url: str | None
) -> tuple[bool, float | None]:
    """Whether the model server behind an agent is autotune's simulator, and its time
    scale, by its /metrics (`autotune_simulated 1`, the x-autotune-time-scale header); a
    --metrics-url that cannot be read stops the run here."""
    if metrics_url is None:
        return False, None
    try:
        async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=5.0)) as resp:
            status, text = resp.status, await resp.text(errors="replace")
            header = resp.headers.get("x-autotune-time-scale")
    except (aiohttp.ClientError, TimeoutError) as error:
        reason = str(error) or "no answer within 5 s"
        raise ServerUnreachable(
            f"cannot read --metrics-url {metrics_url} ({reason}); point it at the model "
            "server's /metrics (vLLM serves it beside /v1) or drop it."
        ) from None
    if status != 200:
        raise ServerUnreachable(
            f"--metrics-url {metrics_url} answered HTTP {status}; point it at the model "
            "server's /metrics (vLLM serves it beside /v1) or drop it."
        )
    simulated = parse_prometheus(text, names=("autotune_simulated",)).get("autotune_simulated")
    try:
        scale = float(header) if header is not None else None
    except ValueError:
        scale = None
    return simulated == 1, scale
