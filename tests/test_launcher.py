"""ServerSpec/ServerProcess: start, health-check and stop real server processes."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import psutil
import pytest

from autotune.errors import ServerStartupError
from autotune.servers.launcher import (
    ServerGroup,
    ServerProcess,
    ServerSpec,
    free_port,
    free_ports,
    last_error_line,
    sim_command,
)
from autotune.servers.vllm import VllmServer, vllm_replicas

FAST = ["--time-scale", "0.01"]


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def _wait_dead(proc: ServerProcess, timeout_s: float = 5.0) -> None:
    """Wait for a process that is expected to exit on its own."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while proc.is_alive() and loop.time() < deadline:
        await asyncio.sleep(0.02)


def test_sim_command_and_free_port() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert sim_command(["--max-num-seqs", "8"], port) == [
        sys.executable,
        "-m",
        "autotune.servers.sim",
        "--max-num-seqs",
        "8",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


async def test_sim_subprocess_serves_and_stops_with_its_group(tmp_path: Path) -> None:
    log = tmp_path / "sim.log"
    async with (
        ServerSpec.sim(FAST, log_path=log).process() as proc,
        aiohttp.ClientSession() as session,
    ):
        assert proc.is_alive() and proc.pid is not None
        pgid = os.getpgid(proc.pid)
        assert pgid == proc.pid != os.getpgid(0)  # its own session and process group
        payload = {"prompt": "hello", "max_tokens": 3, "ignore_eos": True}
        async with session.post(f"{proc.base_url}/completions", json=payload) as resp:
            assert resp.status == 200
            assert (await resp.json())["usage"]["completion_tokens"] == 3
        assert "SIMULATED" in proc.log_tail(5) and "listening on" in proc.log_tail(5)
    assert not proc.is_alive()
    assert proc.returncode == 0  # SIGTERM is a clean shutdown for the simulator
    assert not _group_exists(pgid)
    assert proc.log_path == log and "listening on" in log.read_text()
    proc.stop_sync()  # idempotent
    await proc.stop()


async def test_bad_config_raises_with_the_servers_own_error_line(tmp_path: Path) -> None:
    flags = ["--model", "llama-3.1-70b", "--gpu", "h100-80gb"]
    proc = ServerSpec.sim(flags, log_path=tmp_path / "sim.log").process()
    with pytest.raises(ServerStartupError) as info:
        await proc.start()
    error = info.value
    assert error.reason.startswith("ValueError: No available memory for the cache blocks")
    assert "131.4 GiB" in error.reason
    assert "exited with status 1" in str(error) and str(proc.log_path) in str(error)
    assert not proc.is_alive()


async def test_die_after_requests_kills_the_server(tmp_path: Path) -> None:
    flags = [*FAST, "--die-after-requests", "1"]
    async with ServerSpec.sim(flags, log_path=tmp_path / "sim.log").process() as proc:
        payload = {"prompt": "hello", "max_tokens": 3}
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.post(f"{proc.base_url}/completions", json=payload) as resp:
                    await resp.read()
        await _wait_dead(proc)
        assert not proc.is_alive()
        assert proc.returncode == 1
        assert "simulated crash" in proc.log_tail(3)


async def test_never_healthy_times_out_and_is_stopped(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    url = f"http://127.0.0.1:{free_port()}/health"
    proc = ServerSpec(cmd, url, startup_timeout_s=0.5, log_path=tmp_path / "x.log").process()
    with pytest.raises(ServerStartupError, match="did not answer"):
        await proc.start()
    assert proc.pid is not None and not _group_exists(proc.pid)


async def test_cancelled_start_leaves_nothing_behind(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    url = f"http://127.0.0.1:{free_port()}/health"
    proc = ServerSpec(cmd, url, startup_timeout_s=60, log_path=tmp_path / "x.log").process()
    task = asyncio.create_task(proc.start())
    while proc.pid is None:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _group_exists(proc.pid)


async def test_a_temporary_log_is_removed_only_after_a_clean_stop() -> None:
    async with ServerSpec.sim(FAST).process() as proc:
        log = proc.log_path
        assert log is not None and log.exists()
    assert not log.exists()
    failing = ServerSpec.sim(["--gpu", "nope"]).process()
    with pytest.raises(ServerStartupError, match="Known profiles"):
        await failing.start()
    assert failing.log_path is not None and failing.log_path.exists()
    failing.log_path.unlink()


HEALTHY_BUT_STUBBORN = """
import http.server, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


async def test_stop_kills_a_server_ignoring_sigterm_after_one_grace(tmp_path: Path) -> None:
    port = free_port()
    grace = 1.5
    proc = ServerSpec(
        [sys.executable, "-c", HEALTHY_BUT_STUBBORN, str(port)],
        f"http://127.0.0.1:{port}/health",
        startup_timeout_s=20,
        stop_grace_s=grace,
        log_path=tmp_path / "x.log",
    ).process()
    await proc.start()
    pgid = proc.pid
    assert pgid is not None
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.1)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    await proc.stop()
    elapsed = time.monotonic() - started
    ticker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ticker
    assert grace <= elapsed < grace + 1.0
    assert ticks >= grace / 0.1 * 0.5  # the event loop kept running throughout
    assert proc.returncode == -9
    deadline = time.monotonic() + 2  # the sleeping grandchild is reaped by init
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the server's process group outlived stop()")


def test_specs_name_the_command_and_where_it_answers() -> None:
    launched = ServerSpec.launch(["serve", "--port", "{port}"], port=8124, startup_timeout_s=9)
    assert launched.command == ("serve", "--port", "8124")
    assert launched.health_url == "http://127.0.0.1:8124/health"
    assert launched.base_url == "http://127.0.0.1:8124/v1"
    assert launched.startup_timeout_s == 9
    sim = ServerSpec.sim(["--max-num-seqs", "8"], port=8125)
    assert list(sim.command) == sim_command(["--max-num-seqs", "8"], 8125)
    null = ServerSpec.null(core=1, port=8126)
    assert null.command[-6:] == ("--host", "127.0.0.1", "--port", "8126", "--cpu", "1")
    assert null.base_url == "http://127.0.0.1:8126/v1"


def test_the_null_server_runs_and_stops_from_synchronous_code() -> None:
    with (
        ServerSpec.null().process() as proc,
        urllib.request.urlopen(f"{proc.base_url}/models", timeout=5) as resp,
    ):
        assert resp.status == 200 and b'"null"' in resp.read()
        pgid = proc.pid
        assert pgid is not None and proc.is_alive()
    assert not proc.is_alive() and proc.returncode == 0
    assert not _group_exists(pgid)


def test_last_error_line_prefers_the_exception_line() -> None:
    log = "INFO starting\nERROR 11-26 [core.py:1] ValueError: bad things. Fix it.\nbye\n"
    assert last_error_line(log) == "ValueError: bad things. Fix it."
    assert last_error_line("just\nnoise\n") == "noise"
    assert last_error_line("") == ""


def _listening_on(pid: int) -> set[str]:
    """The addresses a process accepts TCP connections on."""
    connections = psutil.Process(pid).net_connections(kind="tcp")
    return {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN}


@pytest.mark.parametrize(("host", "listening"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
async def test_a_launched_server_listens_on_loopback_unless_told(
    host: str | None, listening: str
) -> None:
    spec = ServerSpec.sim(FAST) if host is None else ServerSpec.sim(FAST, host=host)
    async with spec.process() as proc:
        assert proc.pid is not None and _listening_on(proc.pid) == {listening}
        assert proc.base_url is not None and proc.base_url.startswith("http://127.0.0.1:")


def test_vllm_is_told_its_host() -> None:
    base = ("python", "-m", "vllm.entrypoints.openai.api_server")
    default = VllmServer("m", {"max_num_seqs": 2}, command=base, port=8127)
    assert default.cmd[len(base) + 4 : len(base) + 6] == ["--host", "127.0.0.1"]
    everywhere = VllmServer("m", command=base, port=8127, host="0.0.0.0")
    assert everywhere.cmd[-2:] == ["--host", "0.0.0.0"]
    assert everywhere.base_url == "http://127.0.0.1:8127/v1"
    ipv6 = VllmServer("m", command=base, port=8127, host="::1")
    assert ipv6.health_url == "http://[::1]:8127/health"


# -- several replicas of one model (a GPU budget split into engines) -----------------------


async def _healthy(url: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status == 200


async def test_a_group_starts_every_replica_and_stops_them_all() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    group = ServerGroup([ServerSpec.sim(FAST, port=port).process() for port in ports])
    async with group:
        assert [url.split(":")[-1] for url in group.base_urls] == [f"{p}/v1" for p in ports]
        assert all([await _healthy(p.health_url) for p in group.processes])
        pgids = [os.getpgid(p.pid or 0) for p in group.processes]
    assert not any(p.is_alive() for p in group.processes)
    assert not any(_group_exists(pgid) for pgid in pgids)


async def test_a_replica_that_cannot_start_stops_the_others_and_names_its_error() -> None:
    good = [ServerSpec.sim(FAST).process() for _ in range(2)]
    refused = ServerSpec.sim([*FAST, "--gpu-memory-utilization", "0.1"]).process()
    group = ServerGroup([*good, refused])
    with pytest.raises(ServerStartupError) as info:
        async with group:
            pytest.fail("a group with a refused replica yielded")
    assert info.value.reason.startswith("ValueError: No available memory for the cache blocks")
    assert not any(p.is_alive() for p in group.processes)
    assert {c.pid for c in psutil.Process().children(recursive=True)}.isdisjoint(
        {p.pid for p in group.processes}
    )


async def test_a_cancelled_group_start_leaves_nothing_behind() -> None:
    group = ServerGroup([ServerSpec.sim(FAST).process() for _ in range(2)])
    task = asyncio.create_task(group.start())
    await asyncio.sleep(0.3)  # spawned, not yet healthy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not any(p.is_alive() for p in group.processes)


def test_vllm_replicas_get_disjoint_gpus_and_ports() -> None:
    base = ("python", "-m", "vllm.entrypoints.openai.api_server")
    flags = {"tensor_parallel_size": 2, "max_num_seqs": 64}
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1"}
    group = vllm_replicas("m", flags, 3, command=base, env=env)
    servers = group.processes
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["4,5", "6,7", "0,1"]
    assert group.gpus == ((4, 5), (6, 7), (0, 1))
    assert len({s.base_url for s in servers}) == 3
    assert all("--data-parallel-size" not in s.cmd for s in servers)
    with pytest.raises(ServerStartupError, match="need 8 GPUs, but CUDA_VISIBLE_DEVICES names 6"):
        vllm_replicas("m", flags, 4, command=base, env=env)


def test_data_parallel_vllm_is_one_server_running_every_engine() -> None:
    base = ("python", "-m", "vllm.entrypoints.openai.api_server")
    flags = {"tensor_parallel_size": 2}
    (server,) = vllm_replicas("m", flags, 4, data_parallel=True, command=base).processes
    assert server.cmd[server.cmd.index("--data-parallel-size") + 1] == "4"
    assert server.cmd[server.cmd.index("--tensor-parallel-size") + 1] == "2"
