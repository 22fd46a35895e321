"""Real vLLM as a launched server: its command line, its environment, and the sockets and
shared memory it leaves behind, removed when it stops; `vllm_replicas` starts a GPU budget
split into engines. Why: docs/design/servers.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from autotune.engines.known import VLLM
from autotune.servers.launcher import (
    LOCALHOST,
    ServerGroup,
    ServerProcess,
    ServerSpec,
    free_port,
    replica_group,
)

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_COMMAND = (sys.executable, "-m", API_SERVER_MODULE)
DEFAULT_STARTUP_TIMEOUT_S = 600.0  # model load and warm-up; the CPU build takes 30–80 s
SHM_DIR = Path("/dev/shm")
RPC_PREFIX = "autotune-vllm-"  # then the owning autotune process's PID
# Python's multiprocessing shared memory and semaphores, which vLLM's processes use.
_VLLM_SHM = re.compile(r"^(psm_|sem\.mp-)")


def vllm_command(
    base_command: Sequence[str],
    model: str,
    port: int,
    flags: Mapping[str, object],
    host: str | None = None,
) -> list[str]:
    """The server's command line: the knobs spelled as vLLM's description spells them; with
    no `host`, vLLM listens on every interface (VllmServer always gives one)."""
    return VLLM.launch_line(base_command, model, flags, port=port, host=host)


def cpu_thread_binding(tensor_parallel_size: int, cpus: Sequence[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for the CPU build: one CPU range per rank, `0-3|4-7`.

    With tensor parallelism its default binding puts every rank on the same cores.
    """
    cpus = sorted(cpus)
    if tensor_parallel_size > len(cpus):
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} needs at least as many CPUs "
            f"as ranks; this machine gives {len(cpus)}"
        )
    size, extra = divmod(len(cpus), tensor_parallel_size)
    ranges, start = [], 0
    for rank in range(tensor_parallel_size):
        chunk = cpus[start : start + size + (1 if rank < extra else 0)]
        start += len(chunk)
        ranges.append(str(chunk[0]) if len(chunk) == 1 else f"{chunk[0]}-{chunk[-1]}")
    return "|".join(ranges)


def vllm_env(
    model: str, flags: Mapping[str, object], env: Mapping[str, str] | None = None
) -> dict[str, str | None]:
    """The variables the server gets beyond autotune's own (None unsets one).

    - VLLM_CPU_KVCACHE_SPACE must be unset, not empty, for the CPU build to size its
      KV cache from --gpu-memory-utilization; an empty value is removed.
    - A local model directory needs no hub: HF_HUB_OFFLINE=1 saves start-up time.
    - Tensor parallelism on the CPU build needs one core range per rank.
    """
    merged: dict[str, str | None] = dict(env or {})
    if not (merged.get("VLLM_CPU_KVCACHE_SPACE") or os.environ.get("VLLM_CPU_KVCACHE_SPACE")):
        merged["VLLM_CPU_KVCACHE_SPACE"] = None
    if Path(model).is_dir():
        merged.setdefault("HF_HUB_OFFLINE", "1")
    tensor_parallel_size = int(str(flags.get("tensor_parallel_size") or 1))
    if tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in merged:
        merged["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(
            tensor_parallel_size, sorted(os.sched_getaffinity(0))
        )
    return merged


def shm_entries() -> set[str]:
    """Names in /dev/shm now: take this before a server starts (see cleanup)."""
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def _shm_inodes_in_use() -> set[int]:
    """Inodes of /dev/shm files that some live process maps or holds open.

    By inode, not name: a POSIX semaphore is mapped under a temporary name that
    glibc then renames, so /proc/PID/maps never shows `sem.mp-...` itself.
    """
    inodes: set[int] = set()
    prefix = str(SHM_DIR) + "/"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    inodes.add(int(fields[4]))
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                        inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    return inodes


def cleanup_vllm_leftovers(before: set[str], rpc_dir: Path | None = None) -> list[str]:
    """Remove the /dev/shm segments vLLM made since `before` and left unmapped, and
    its private socket directory; returns what was removed."""
    removed = []
    candidates = sorted(n for n in shm_entries() - before if _VLLM_SHM.match(n))
    in_use = _shm_inodes_in_use() if candidates else set()
    for name in candidates:
        with contextlib.suppress(FileNotFoundError):
            if (SHM_DIR / name).stat().st_ino not in in_use:
                (SHM_DIR / name).unlink()
                removed.append(str(SHM_DIR / name))
    if rpc_dir is not None and rpc_dir.exists():
        shutil.rmtree(rpc_dir, ignore_errors=True)
        removed.append(str(rpc_dir))
    return removed


def remove_stale_rpc_dirs(directory: Path | None = None) -> list[Path]:
    """Socket directories left by autotune processes that died (a kill -9 skips cleanup)."""
    removed = []
    for path in Path(directory or tempfile.gettempdir()).glob(f"{RPC_PREFIX}*"):
        owner = path.name.removeprefix(RPC_PREFIX).split("-")[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class VllmServer(ServerProcess):
    """vLLM serving `model` with `flags` on a free port (or `port`) of `host`: 127.0.0.1
    unless a study says otherwise, since vLLM's API has no authentication of its own.

    `async with VllmServer(model, {"max_num_seqs": 64}) as server:` → `server.base_url`.
    """

    def __init__(
        self,
        model: str,
        flags: Mapping[str, object] | None = None,
        *,
        command: Sequence[str] = DEFAULT_COMMAND,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        host: str = LOCALHOST,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        log_path: str | Path | None = None,
    ) -> None:
        flags = dict(flags or {})
        self.port = port or free_port()
        self.model = model
        self.rpc_dir: Path | None = None
        self._shm_before: set[str] = set()
        super().__init__(
            ServerSpec.local(
                vllm_command(command, model, self.port, flags, host),
                self.port,
                host=host,
                env=vllm_env(model, flags, env),
                log_path=log_path,
                startup_timeout_s=startup_timeout_s,
            )
        )

    async def start(self) -> None:
        remove_stale_rpc_dirs()
        self._shm_before = shm_entries()
        self.rpc_dir = Path(tempfile.mkdtemp(prefix=f"{RPC_PREFIX}{os.getpid()}-"))
        rpc = {"VLLM_RPC_BASE_PATH": str(self.rpc_dir)}
        self.spec = replace(self.spec, env={**self.spec.env, **rpc})
        await super().start()

    def stop_sync(self) -> None:
        super().stop_sync()
        if self.rpc_dir is not None:  # started: what appeared since then may be its own
            cleanup_vllm_leftovers(self._shm_before, self.rpc_dir)


def vllm_replicas(
    model: str,
    flags: Mapping[str, object],
    engines: int,
    *,
    data_parallel: bool = False,
    command: Sequence[str] = DEFAULT_COMMAND,
    env: Mapping[str, str] | None = None,
    host: str = LOCALHOST,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
) -> ServerGroup:
    """`engines` replicas of `model` with `flags` (tensor_parallel_size among them):
    one server each on disjoint GPUs and ports, or with `data_parallel` one server with
    `--data-parallel-size engines`."""

    def make(knobs: Mapping[str, object], port: int, env: Mapping[str, str]) -> VllmServer:
        return VllmServer(
            model, knobs, command=command, env=env, port=port, host=host,
            startup_timeout_s=startup_timeout_s,
        )  # fmt: skip

    return replica_group(make, flags, engines, data_parallel=data_parallel, env=dict(env or {}))
