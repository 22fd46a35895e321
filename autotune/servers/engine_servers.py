"""SGLang and TensorRT-LLM as launched servers: each configuration's launch line from the
engine's description, TensorRT-LLM's options file written beside it, one server per engine
of a GPU budget (or SGLang's --dp-size)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from autotune.engines import Engine
from autotune.servers.launcher import (
    LOCALHOST,
    ServerGroup,
    ServerProcess,
    ServerSpec,
    replica_group,
)

PLACEHOLDER = "OPTIONS_FILE"  # where the options file's path goes, once written
DEFAULT_STARTUP_TIMEOUT_S = 900.0  # a large model's load, and SGLang's CUDA-graph capture


class EngineServer(ServerProcess):
    """`engine` serving `model` with `knobs` on `port`; its options file (TensorRT-LLM's
    extra LLM API options) lives while it runs."""

    def __init__(
        self,
        engine: Engine,
        model: str,
        knobs: Mapping[str, object],
        *,
        command: Sequence[str],
        port: int,
        host: str = LOCALHOST,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> None:
        options = engine.options(knobs)
        written = options and engine.options_flag is not None
        argv = engine.launch_line(  # checked before the file is written
            tuple(command), model, knobs, port=port, host=host,
            options_file=PLACEHOLDER if written else None,
        )  # fmt: skip
        self.options_file: Path | None = None
        if written:
            handle, name = tempfile.mkstemp(prefix=f"autotune-{engine.name}-", suffix=".yaml")
            with os.fdopen(handle, "w") as out:
                yaml.safe_dump(options, out, sort_keys=True)
            self.options_file = Path(name)
            argv[argv.index(PLACEHOLDER)] = name
        spec = ServerSpec.local(
            argv, port, host=host, env=dict(env or {}), startup_timeout_s=startup_timeout_s
        )
        super().__init__(spec)

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:  # also where it never started (stop returns at once then)
            self._remove_options()

    def stop_sync(self) -> None:
        try:
            super().stop_sync()
        finally:
            self._remove_options()

    def _remove_options(self) -> None:
        if self.options_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.options_file.unlink()


def engine_replicas(
    engine: Engine,
    model: str,
    knobs: Mapping[str, object],
    engines: int,
    *,
    data_parallel: bool = False,
    command: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    host: str = LOCALHOST,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
) -> ServerGroup:
    """`engines` replicas of `model`: one server each on disjoint GPUs and ports, or with
    `data_parallel` (SGLang) one server with its data-parallel size set to `engines`."""
    launch = tuple(command) or engine.command

    def make(flags: Mapping[str, object], port: int, env: Mapping[str, str]) -> EngineServer:
        return EngineServer(
            engine, model, flags, command=launch, port=port, host=host, env=env,
            startup_timeout_s=startup_timeout_s,
        )  # fmt: skip

    return replica_group(make, knobs, engines, data_parallel=data_parallel, env=dict(env or {}))
