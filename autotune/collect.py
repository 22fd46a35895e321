"""`autotune collect`: tasks → model server → verifier → rewarded rollouts on disk.

With no base URL the target is the embedded simulated vLLM-like server, started as a
subprocess (so it runs on the other core, not on the client's event loop).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import aiohttp

from autotune.backends.openai import OpenAIBackend
from autotune.config import CollectConfig, TargetConfig
from autotune.engine import Engine, RunStats
from autotune.errors import CollectionError, ServerUnreachable
from autotune.results import CollectSummary
from autotune.store import RolloutSink
from autotune.verifiers import VerifierOptions, load_verifier
from autotune.workload import Workload, rollout_key, work_items

log = logging.getLogger("autotune")

PREFLIGHT_TIMEOUT_S = 5.0
SIM_DEFAULT_ARGS = ("--time-scale", "1.0")


@dataclass(frozen=True, slots=True)
class Target:
    """A reachable server: its base URL, model name and whether it is the simulator."""

    base_url: str
    model: str
    simulated: bool


@asynccontextmanager
async def open_session(target: TargetConfig) -> AsyncIterator[aiohttp.ClientSession]:
    """One client session for the run: pooled keep-alive connections, no cookie jar."""
    connector = aiohttp.TCPConnector(limit=target.pool_limit, limit_per_host=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), raise_for_status=False
    ) as session:
        yield session


@asynccontextmanager
async def embedded_server(target: TargetConfig) -> AsyncIterator[str | None]:
    """Yields the base URL: the configured one, or a freshly started simulated server."""
    if target.base_url is not None:
        yield target.base_url
        return
    from autotune.servers.launcher import ServerProcess, free_port, sim_command

    port = free_port()
    command = sim_command([*SIM_DEFAULT_ARGS, *target.sim_args], port)
    log.info("starting the embedded SIMULATED vLLM-like server on port %d", port)
    async with ServerProcess(
        command, health_url=f"http://127.0.0.1:{port}/health", startup_timeout_s=30.0
    ):
        yield f"http://127.0.0.1:{port}/v1"


async def resolve_target(
    session: aiohttp.ClientSession, base_url: str, model: str | None, api_key: str | None
) -> Target:
    """Checks the server answers (within 5 s) and picks the model it serves if none is named."""
    url = base_url.rstrip("/") + "/models"
    timeout = aiohttp.ClientTimeout(total=PREFLIGHT_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(url, timeout=timeout, headers=headers) as resp:
            simulated = resp.headers.get("x-autotune-simulated") == "true"
            payload: dict[str, Any] = await resp.json() if resp.status == 200 else {}
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        reason = str(error) or "no answer within 5 s"
        raise ServerUnreachable(
            f"cannot reach the model server at {base_url} ({reason}); start it or fix --base-url."
        ) from None
    except (aiohttp.ContentTypeError, ValueError):
        payload = {}
    if model is None:
        models = [entry.get("id") for entry in payload.get("data") or () if entry.get("id")]
        if not models:
            raise ServerUnreachable(
                f"the server at {base_url} lists no model at /models; pass --model NAME."
            )
        model = str(models[0])
    return Target(base_url, model, simulated or model.startswith("sim/"))


def _api_key(target: TargetConfig) -> str | None:
    """The API key, from the environment only: it is never logged, printed or saved."""
    return os.environ.get(target.api_key_env) or None


class Progress(Protocol):
    """What the engine reports progress to (the CLI's progress bar)."""

    def set_total(self, total: int) -> None: ...

    def tick(self) -> None: ...


async def collect(config: CollectConfig, progress: Progress | None = None) -> CollectSummary:
    """Runs one collection to the end (or until the server dies) and summarises it."""
    workload = Workload(
        config.input, config.synthetic, config.limit, config.num_repeats, config.shard
    )
    workload.validate()
    start, stop = workload.task_range()
    sink = RolloutSink(config.output, config.resume)
    repeats = config.num_repeats
    skipped = (
        sum(
            1
            for task_index in range(start, stop)
            for rollout_index in range(repeats)
            if rollout_key(task_index, rollout_index) in sink.done
        )
        if sink.done
        else 0
    )
    target_config = config.target
    if target_config.base_url is None and config.input is None and not target_config.extra_body:
        # The synthetic workload sets each output length; the simulated model honours it.
        target_config = replace(target_config, extra_body={"ignore_eos": True})
    parallelism = config.parallelism
    if parallelism is None:
        parallelism = target_config.pool_limit
        log.warning(
            "no --parallelism: unlimited, as in NeMo Gym (bounded only by the %d-connection pool)",
            parallelism,
        )
    todo = (stop - start) * repeats - skipped
    if progress is not None:
        progress.set_total(todo)
    try:
        async with (
            embedded_server(target_config) as base_url,
            open_session(target_config) as session,
        ):
            assert base_url is not None
            api_key = _api_key(target_config)
            target = await resolve_target(session, base_url, target_config.model, api_key)
            backend = OpenAIBackend(
                session, replace(target_config, base_url=target.base_url), target.model, api_key
            )
            verifier = await load_verifier(
                config.verifier,
                VerifierOptions(workers=config.verifier_workers, cost_ms=config.verifier_cost_ms),
                session,
            )
            engine = Engine(
                backend,
                verifier,
                sink,
                parallelism=max(1, min(parallelism, todo)),
                on_finished=progress.tick if progress is not None else None,
                extra_row_fields={"simulated": True} if target.simulated else None,
            )
            try:
                stats = await engine.run(work_items(workload, start, stop, sink.done))
            finally:
                await verifier.aclose()
    finally:
        sink.close()
    summary = _summarise(stats, backend, target, config, skipped)
    if stats.stopped_early:
        where = f"; {stats.completed} rollouts are kept in {config.output}" if config.output else ""
        raise CollectionError(
            f"collection stopped: {stats.stopped_early}{where}; "
            "restart the server and rerun with --resume."
        )
    return summary


def _summarise(
    stats: RunStats,
    backend: OpenAIBackend,
    target: Target,
    config: CollectConfig,
    skipped: int,
) -> CollectSummary:
    elapsed = stats.elapsed_s
    return CollectSummary(
        completed=stats.completed,
        failed=stats.failed,
        skipped=skipped,
        elapsed_s=elapsed,
        rollouts_per_s=stats.completed / elapsed,
        output_tokens_per_s=stats.output_tokens / elapsed,
        input_tokens=stats.input_tokens,
        output_tokens=stats.output_tokens,
        mean_reward=stats.reward_sum / stats.reward_count if stats.reward_count else None,
        latency_s=stats.samples.summarise(),
        errors_by_class=dict(stats.errors_by_class),
        retries_by_class=dict(backend.counters.retries),
        parallelism=config.parallelism,
        model=target.model,
        base_url=target.base_url,
        simulated=target.simulated,
        output=str(config.output) if config.output else None,
    )


def run_async(coro: Any) -> Any:
    """Runs a coroutine on uvloop where available (a faster loop for the client)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_collect(config: CollectConfig, progress: Progress | None = None) -> CollectSummary:
    """Synchronous entry point (benchmarks, tests, the CLI)."""
    return run_async(collect(config, progress))
