"""The vLLM command line, environment and leftover cleanup, without vLLM itself."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.servers import vllm
from autotune.servers.launcher import last_error_line
from autotune.servers.vllm import (
    VllmServer,
    cleanup_vllm_leftovers,
    cpu_thread_binding,
    remove_stale_rpc_dirs,
    vllm_command,
    vllm_env,
)

BASE = ("python", "-m", "vllm.entrypoints.openai.api_server")


def test_knob_names_become_vllm_flags_in_order() -> None:
    flags = {
        "max_num_seqs": 64,
        "gpu_memory_utilization": 0.9,
        "max-num-batched-tokens": 4096.0,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "served_model_name": None,
    }
    assert vllm_command(BASE, "/models/tiny", 8123, flags) == [
        *BASE,
        "--model",
        "/models/tiny",
        "--port",
        "8123",
        "--max-num-seqs",
        "64",
        "--gpu-memory-utilization",
        "0.9",
        "--max-num-batched-tokens",
        "4096",
        "--enforce-eager",
        "--no-enable-prefix-caching",
    ]


@pytest.mark.parametrize("name", ["port", "model", "--port"])
def test_flags_autotune_sets_itself_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="set by autotune"):
        vllm_command(BASE, "m", 1, {name: 1})


def test_thread_binding_gives_each_rank_its_own_cores() -> None:
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [0, 1, 2, 3, 4, 5, 6, 7]) == "0-3|4-7"
    assert cpu_thread_binding(3, [4, 5, 6, 7]) == "4-5|6|7"
    with pytest.raises(ValueError, match="at least as many CPUs"):
        cpu_thread_binding(4, [0, 1])


def test_env_unsets_an_empty_kv_cache_space_and_keeps_a_set_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "")
    env = vllm_env("org/remote-model", {})
    assert "VLLM_CPU_KVCACHE_SPACE" in env and env["VLLM_CPU_KVCACHE_SPACE"] is None
    assert "HF_HUB_OFFLINE" not in env  # a hub model may need the hub
    assert vllm_env("m", {}, {"VLLM_CPU_KVCACHE_SPACE": "4"})["VLLM_CPU_KVCACHE_SPACE"] == "4"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_env("m", {})  # inherited as set
    assert vllm_env(str(tmp_path), {})["HF_HUB_OFFLINE"] == "1"  # a local model directory


def test_env_binds_threads_for_tensor_parallelism_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert vllm_env("m", {"tensor_parallel_size": 2})["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_env("m", {"tensor_parallel_size": 1})
    given = vllm_env("m", {"tensor_parallel_size": 2}, {"VLLM_CPU_OMP_THREADS_BIND": "0|3"})
    assert given["VLLM_CPU_OMP_THREADS_BIND"] == "0|3"


def test_server_unsets_the_empty_variable_in_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "")
    server = VllmServer("m", {"max_num_seqs": 2}, command=BASE, port=8124)
    assert "VLLM_CPU_KVCACHE_SPACE" not in server._environment()
    assert server.cmd[-2:] == ["--max-num-seqs", "2"]
    assert server.health_url == "http://127.0.0.1:8124/health"
    assert server.base_url == "http://127.0.0.1:8124/v1"


def test_cleanup_removes_new_unmapped_segments_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(vllm, "SHM_DIR", shm)
    (shm / "psm_old").touch()  # there before the server started: not ours
    before = vllm.shm_entries()
    for name in ("psm_new", "sem.mp-new", "psm_inuse", "other_new"):
        (shm / name).touch()
    holder = (shm / "psm_inuse").open("rb")  # a live process (this one) holds it open
    rpc = tmp_path / "autotune-vllm-x"
    rpc.mkdir()
    (rpc / "socket").touch()
    try:
        removed = cleanup_vllm_leftovers(before, rpc)
    finally:
        holder.close()
    assert sorted(p.name for p in shm.iterdir()) == ["other_new", "psm_inuse", "psm_old"]
    assert sorted(Path(p).name for p in removed) == ["autotune-vllm-x", "psm_new", "sem.mp-new"]
    assert not rpc.exists()


def test_error_line_skips_vllm_wrappers_for_the_root_cause() -> None:
    log = "\n".join(
        [
            "(Worker pid=1) ERROR [multiproc_executor.py:1063] ValueError: No common block "
            "size for 16 (CPU_ATTN: [MultipleOf(32)]).",
            "(EngineCore pid=2) ERROR [core.py:1510] RuntimeError: Worker failed with error "
            "'No common block size for 16', please check the stack trace above for the root cause",
            "    raise RuntimeError(",
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
        ]
    )
    assert last_error_line(log) == (
        "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    )


def test_stale_socket_dirs_of_dead_owners_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = tmp_path / f"{vllm.RPC_PREFIX}{dead.stdout.strip()}-abc"
    live = tmp_path / f"{vllm.RPC_PREFIX}{os.getpid()}-def"
    for path in (stale, live):
        path.mkdir()
        (path / "socket").touch()
    assert remove_stale_rpc_dirs(tmp_path) == [stale]
    assert live.exists() and not stale.exists()


def test_cleanup_keeps_a_live_named_semaphore() -> None:
    """glibc maps a semaphore under a temporary name: only its inode shows it is in use."""
    before = vllm.shm_entries()
    lock = multiprocessing.get_context("spawn").Lock()  # /dev/shm/sem.mp-...
    name = "sem." + lock._semlock.name.lstrip("/")  # type: ignore[attr-defined]
    assert name in vllm.shm_entries() - before
    assert str(vllm.SHM_DIR / name) not in cleanup_vllm_leftovers(before)
    assert name in vllm.shm_entries()
    del lock


def test_a_server_never_started_removes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(vllm, "SHM_DIR", tmp_path)
    (tmp_path / "psm_someone_elses").touch()
    VllmServer("m", command=BASE).stop_sync()
    assert (tmp_path / "psm_someone_elses").exists()
