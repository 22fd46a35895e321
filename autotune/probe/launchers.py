"""What starts one server configuration of a study and hands back a probe of it: real
vLLM, the simulated server over HTTP, a running server, a user's collector command or a
running NeMo Gym agent server. Why: docs/design/probes.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from autotune.config.collection import SyntheticWorkload, TargetConfig
from autotune.config.flags import server_flags
from autotune.config.knobs import NUM_ENGINES
from autotune.config.study import Study, study_target_config
from autotune.probe import Launcher, ProbeSettings
from autotune.probe.command_probe import CommandProbe
from autotune.probe.realtime import EngineProbe
from autotune.rollout.backends.nemo_gym_agent import AgentBackend, AgentRewardVerifier, check_agent
from autotune.rollout.backends.openai import OpenAIBackend
from autotune.rollout.target import api_key, open_session, resolve_target
from autotune.rollout.workload import Task, Workload
from autotune.servers.engine_servers import engine_replicas
from autotune.servers.launcher import LOCALHOST, ServerGroup, ServerSpec, free_ports
from autotune.verifiers import Verifier, VerifierOptions, load_verifier


@dataclass(slots=True)
class HttpLauncher:
    """Launches the servers of each configuration (the sim or vLLM: one, or one per engine
    of a GPU budget), or uses a running one.

    `server(knobs)` makes the (unstarted) servers for a configuration; None means the
    server at `target.base_url` is used as it is (no knobs can change). With several, the
    probe's backend spreads its calls over them (autotune.rollout.replicas).
    """

    target: TargetConfig
    verifier: Verifier
    tasks: Sequence[Task]
    settings: ProbeSettings
    server: Callable[[Mapping[str, Any]], ServerGroup] | None = None

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[EngineProbe]:
        if self.server is None:
            urls = self.target.base_urls or ("",)
            async with self._probe(urls, self.target.total_max_num_seqs) as probe:
                yield probe
            return
        group = self.server(knobs)  # launched with the trial's max_num_seqs, if it sets one
        seqs = knobs.get("max_num_seqs")
        total = seqs * len(group.base_urls) if seqs else None
        async with group, self._probe(group.base_urls, total, group.gpus) as probe:
            yield probe

    @asynccontextmanager
    async def _probe(
        self,
        urls: Sequence[str],
        max_num_seqs: int | None,
        gpus: tuple[tuple[int, ...], ...] = (),
    ) -> AsyncIterator[EngineProbe]:
        """`max_num_seqs`: the servers' batch limit over all of them, where known."""
        async with open_session(self.target) as session:
            key = api_key(self.target)
            target = await resolve_target(
                session, urls[0], self.target.model, key, self.target.api_key_env
            )
            several = tuple(urls) if len(urls) > 1 else ()
            config = replace(
                self.target, base_url=target.base_url, replica_urls=several, replica_gpus=gpus
            )
            backend = OpenAIBackend(session, config, target.model, key)
            yield EngineProbe(
                session,
                backend,
                self.verifier,
                self.tasks,
                target.base_url,
                self.settings,
                max_num_seqs=max_num_seqs,
            )


@dataclass(slots=True)
class CommandLauncher:
    """No server to start: the command is the whole collection stack, run per point."""

    template: str
    limit: int | None  # rollouts a run; None: the probe's default for each parallelism
    workdir: Path

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[CommandProbe]:
        yield CommandProbe(self.template, self.limit, self.workdir, tolerate_failures=True)


@dataclass(slots=True)
class AgentLauncher:
    """No server to start: a running NeMo Gym agent makes and verifies every rollout."""

    target: TargetConfig  # agent_url set; metrics_url: the model server's /metrics, if given
    tasks: Sequence[Task]
    settings: ProbeSettings

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[EngineProbe]:
        agent_url = self.target.agent_url or ""  # validated: the kind always names it
        async with open_session(self.target) as session:
            await check_agent(session, agent_url)
            backend = AgentBackend(session, self.target, agent_url)
            yield EngineProbe(
                session,
                backend,
                AgentRewardVerifier(),
                self.tasks,
                agent_url,
                self.settings,
                metrics=self.target.metrics_url,
            )


def agent_launcher(study: Study) -> AgentLauncher:
    """Probes of a NeMo Gym agent with the study's tasks (only parallelism changes)."""
    target = TargetConfig(agent_url=study.target.agent_url, metrics_url=study.target.metrics_url)
    return AgentLauncher(target, _tasks(study), ProbeSettings.of(study.probe, parallelism=1))


def command_launcher(study: Study, studies_dir: Path) -> CommandLauncher:
    return CommandLauncher(
        study.target.template or "",
        study.workload.limit,
        studies_dir / "runs" / study.name,
    )


def http_launcher(study: Study, verifier: Verifier) -> HttpLauncher:
    """Probes of autotune's engine with the study's tasks, per configuration."""
    settings = ProbeSettings.of(study.probe, parallelism=1)
    target = study_target_config(study)
    return HttpLauncher(target, verifier, _tasks(study), settings, _server(study))


def _tasks(study: Study) -> list[Task]:
    """The probes' tasks in the order they are sent: with `num_repeats`, each task's
    rollouts one after another (a GRPO group sharing its prompt), as collect makes them."""
    workload = study.workload
    synthetic = SyntheticWorkload.of(workload.synthetic)
    run = Workload(workload.input, synthetic, workload.limit, num_repeats=workload.num_repeats)
    return run.probe_tasks()


def _server(study: Study) -> Callable[[Mapping[str, Any]], ServerGroup] | None:
    """What starts one configuration: the simulator, real vLLM, SGLang or TensorRT-LLM
    (one server per engine, or one with its data-parallel size), or nothing (kind: server)."""
    target = study.target
    host = target.host or LOCALHOST
    data_parallel = study.resources is not None and study.resources.replicas == "data-parallel"
    if target.kind == "sim":

        def sim(knobs: Mapping[str, Any]) -> ServerGroup:
            engines, flags = _engines(knobs)
            servers = 1 if data_parallel else engines
            if data_parallel and engines > 1:
                flags["data_parallel_size"] = engines
            args = [*target.args, *server_flags(flags)]
            timeout = target.startup_timeout_s
            return ServerGroup(
                [
                    ServerSpec.sim(args, port=port, host=host, startup_timeout_s=timeout).process()
                    for port in free_ports(servers)
                ]
            )

        return sim
    if (engine := target.engine) is not None:

        def launched(knobs: Mapping[str, Any]) -> ServerGroup:
            from autotune.servers.vllm import vllm_replicas

            engines, flags = _engines(knobs)
            replicas = vllm_replicas if engine.name == "vllm" else partial(engine_replicas, engine)
            return replicas(
                target.model or "",  # validated: a launched engine always names its model
                flags,
                engines,
                data_parallel=data_parallel,
                command=[*(target.command or engine.command), *target.args],
                env=target.env,
                host=host,
                startup_timeout_s=target.startup_timeout_s,
            )

        return launched
    return None


def _engines(knobs: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """(the engines a configuration runs, its server flags)."""
    flags = {name: value for name, value in knobs.items() if name != NUM_ENGINES}
    return int(knobs.get(NUM_ENGINES, 1)), flags


@asynccontextmanager
async def study_launcher(study: Study, studies_dir: Path) -> AsyncIterator[Launcher]:
    """What starts each configuration of `study`'s target (a verifier it needs is loaded
    for the whole study and closed after it)."""
    if study.target.kind == "command":
        yield command_launcher(study, studies_dir)
        return
    if study.target.kind == "nemo-gym-agent":
        yield agent_launcher(study)
        return
    verifier = await load_verifier(
        study.workload.verifier_for(study.workload.input),
        VerifierOptions(
            workers=study.workload.verifier_workers, cost_ms=study.workload.verifier_cost_ms
        ),
    )
    try:
        yield http_launcher(study, verifier)
    finally:
        await verifier.aclose()
