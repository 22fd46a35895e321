"""The model server a job talks to: the configured one, or the embedded simulator.
Why: docs/design/rollout.md.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from autotune.config.collection import (
    SyntheticWorkload,
    TargetConfig,
    lengths_sampled,
    policy_given,
)
from autotune.config.fields import base_url_problem
from autotune.errors import ServerUnreachable, UsageError

log = logging.getLogger("autotune")

PREFLIGHT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Target:
    """A reachable server: its base URL, model name and whether it is the simulator
    (with the real seconds one of its simulated seconds takes, when it says)."""

    base_url: str
    model: str
    simulated: bool
    time_scale: float | None = None


class MeteredConnector(aiohttp.TCPConnector):
    """A pool that adds up how long calls take to get a connection: waiting for a free one
    while all `limit` are busy, or opening a new one (taking an idle one costs nothing).
    Only a metered collect uses it (autotune/live/): two clock reads a call."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.acquire_s = 0.0

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> Any:
        started = time.perf_counter()
        try:
            return await super().connect(req, traces, timeout)
        finally:
            self.acquire_s += time.perf_counter() - started


@asynccontextmanager
async def open_session(
    target: TargetConfig, metered: bool = False
) -> AsyncIterator[aiohttp.ClientSession]:
    """One client session for the run: pooled keep-alive connections, no cookie jar;
    `metered`: its connector is a MeteredConnector."""
    kind = MeteredConnector if metered else aiohttp.TCPConnector
    connector = kind(limit=target.pool_limit, limit_per_host=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), raise_for_status=False
    ) as session:
        yield session


@asynccontextmanager
async def embedded_server(
    target: TargetConfig, default_sim_args: Sequence[str] = ()
) -> AsyncIterator[str]:
    """Yields the base URL: the configured one, or a freshly started simulated server."""
    if target.base_url is not None:
        yield target.base_url
        return
    from autotune.servers.launcher import ServerSpec

    spec = ServerSpec.sim([*default_sim_args, *target.sim_args], startup_timeout_s=30.0)
    log.info("starting the embedded SIMULATED vLLM-like server at %s", spec.base_url)
    async with spec.process():
        yield spec.base_url or ""


async def resolve_target(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str | None,
    api_key: str | None,
    api_key_env: str | None = None,
) -> Target:
    """Checks the server answers (within 5 s) and picks the model it serves if none is named.

    `api_key_env` names the variable the key came from, for the error when it is refused.
    """
    problem = base_url_problem(base_url)
    if problem is not None:
        raise UsageError(f"the base URL {base_url} {problem}, e.g. http://host:8000/v1.")
    url = base_url.rstrip("/") + "/models"
    timeout = aiohttp.ClientTimeout(total=PREFLIGHT_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(url, timeout=timeout, headers=headers) as resp:
            if resp.status in (401, 403):
                raise _refused(base_url, resp.status, api_key, api_key_env)
            simulated = resp.headers.get("x-autotune-simulated") == "true"
            time_scale = _time_scale(resp.headers.get("x-autotune-time-scale"))
            payload: Any = await resp.json() if resp.status == 200 else {}
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        reason = str(error) or "no answer within 5 s"
        raise ServerUnreachable(
            f"cannot reach the model server at {base_url} ({reason}); start it or fix --base-url."
        ) from None
    except (aiohttp.ContentTypeError, aiohttp.ClientPayloadError, ValueError):
        payload = {}  # an answer of the wrong kind lists no model
    except aiohttp.ClientResponseError as error:  # a status line or header aiohttp refuses
        reason = error.message.splitlines()[0] if error.message else f"HTTP {error.status}"
        raise ServerUnreachable(
            f"the server at {base_url} does not answer in HTTP ({reason}); "
            "check that --base-url points at the model server."
        ) from None
    if model is None:
        models = _listed_models(payload)
        if not models:
            raise ServerUnreachable(
                f"the server at {base_url} lists no model at /models; pass --model NAME."
            )
        model = models[0]
    return Target(base_url, model, simulated or model.startswith("sim/"), time_scale)


def _time_scale(header: str | None) -> float | None:
    """The simulator's time scale from its header; None when absent or not a number ≥ 0."""
    try:
        scale = float(header) if header is not None else None
    except ValueError:
        return None
    return scale if scale is not None and math.isfinite(scale) and scale >= 0 else None


def _listed_models(payload: Any) -> list[str]:
    """The model ids in a `/models` answer (`{"data": [{"id": ...}, ...]}`); none from an
    answer of any other shape, which then counts as listing no model."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return []
    return [
        entry["id"]
        for entry in data
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]
    ]


def _refused(base_url: str, status: int, key: str | None, env: str | None) -> UsageError:
    """The sentence for a 401/403 from /models: names the key's variable, never the key."""
    variable = f"the environment variable {env}" if env else "the variable --api-key-env names"
    if key is None:
        return UsageError(
            f"the server at {base_url} needs an API key (HTTP {status}); set {variable}."
        )
    return UsageError(
        f"the server at {base_url} refused the API key (HTTP {status}); check {variable}."
    )


def api_key(target: TargetConfig) -> str | None:
    """The API key, from the environment only: it is never logged, printed or saved."""
    return os.environ.get(target.api_key_env) or None


# A grouped run on the embedded simulator samples like an RL policy unless its flags say
# how: each sample's length is its own (lognormal, median half the task's max_tokens, so
# about one in twelve is cut at it; p99/p50 ≈ 3.2) and a stated share of prompts is
# solved by every sample or by none (groups that teach nothing). Why: docs/groups.md.
GROUP_LENGTH_SIGMA = 0.5
GROUP_UNINFORMATIVE_SHARE = 0.4


def synthetic_defaults(
    target: TargetConfig, synthetic: SyntheticWorkload | None, num_repeats: int = 1
) -> TargetConfig:
    """On the embedded simulator with `synthetic` tasks: a grouped run gets the policy
    above; any other asks for `ignore_eos`, so each task sets its output length and the
    simulated model honours it. Anywhere else extra fields are sent only when the user
    asks (some servers reject unknown fields)."""
    if target.base_url is not None or synthetic is None or target.extra_body:
        return target
    if num_repeats > 1 and not policy_given(target.sim_args):
        policy = (
            f"--output-length-sigma={GROUP_LENGTH_SIGMA}",
            f"--uninformative-share={GROUP_UNINFORMATIVE_SHARE}",
            f"--natural-output-tokens={max(1, synthetic.output_tokens_mean // 2)}",
        )
        log.info(
            "the embedded simulator samples each group like an RL policy: %.0f%% of prompts "
            "solved by every sample or by none, lengths spread within a group (--sim-arg="
            "--uninformative-share=U and --sim-arg=--output-length-sigma=S change it)",
            100 * GROUP_UNINFORMATIVE_SHARE,
        )
        return replace(target, sim_args=(*policy, *target.sim_args))
    if lengths_sampled(target.sim_args):
        return target
    return replace(target, extra_body={"ignore_eos": True})


@asynccontextmanager
async def connect(
    target: TargetConfig, default_sim_args: Sequence[str] = (), metered: bool = False
) -> AsyncIterator[tuple[aiohttp.ClientSession, Target]]:
    """A session and a checked target; the embedded simulator lives as long as this."""
    async with (
        embedded_server(target, default_sim_args) as base_url,
        open_session(target, metered) as session,
    ):
        key, env = api_key(target), target.api_key_env
        resolved = await resolve_target(session, base_url, target.model, key, env)
        for replica in target.replica_urls[1:]:  # each must answer before the run starts
            await resolve_target(session, replica, resolved.model, key, env)
        yield session, resolved
