"""Tool endpoints are servers too (autotune.rollout.tools, autotune.rollout.turns): a resources
server that answers errors or hangs, through collect and diagnose. Its errors are counted and
shown, fed back to the model or failing the rollout as --tool-errors says; a call that hangs
fails as `tool_timeout` after --tool-timeout, and one still hanging when a probe ends is counted
and makes the verdict `unstable`, pointing at the environment."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from autotune.collector.collect_job import collect
from autotune.config.collection import CollectConfig, TargetConfig
from autotune.diagnose.diagnose_job import DiagnoseConfig, diagnose
from autotune.results.runs import CollectSummary
from tests.helpers import ServeApp, SimProcess, autotune, read_rows

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TASK_ROW = {
    "responses_create_params": {
        "input": "what's it like in sf?",
        "tools": [WEATHER],
        "max_output_tokens": 16,
    },
    "expected_answer": "cold",
}
ERROR_BODY = {"detail": "the weather service is down"}


@dataclass
class ToolServer:
    """A resources server whose every `every`-th get_weather call answers HTTP 500
    (`fault="error"`) or never answers (`fault="hang"`, until the test ends)."""

    fault: str
    every: int
    call_s: float = 0.005
    calls: int = 0
    faults: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        async def seed(request: web.Request) -> web.Response:
            return web.json_response({})

        async def tool(request: web.Request) -> web.Response:
            self.calls += 1
            if self.calls % self.every == 0:
                self.faults += 1
                if self.fault == "error":
                    return web.json_response(ERROR_BODY, status=500)
                await self.released.wait()  # hangs: no answer until the test is over
            await asyncio.sleep(self.call_s)
            return web.json_response({"city": "sf", "weather_description": "cold"})

        app = web.Application()
        app.router.add_post("/seed_session", seed)
        app.router.add_post("/get_weather", tool)
        return app


StartToolServer = Callable[..., Awaitable[tuple[ToolServer, str]]]


@pytest.fixture
async def tool_server(serve_app: ServeApp) -> AsyncIterator[StartToolServer]:
    """`await tool_server(fault, every)`: (the ToolServer, its URL); hanging calls are
    released when the test ends, so the server stops at once."""
    servers: list[ToolServer] = []

    async def start(fault: str, every: int, call_s: float = 0.005) -> tuple[ToolServer, str]:
        server = ToolServer(fault, every, call_s)
        servers.append(server)
        return server, await serve_app(server.app())

    yield start
    for server in servers:
        server.released.set()


def _tasks(path: Path, count: int) -> Path:
    path.write_bytes(b"".join(orjson.dumps(TASK_ROW) + b"\n" for _ in range(count)))
    return path


def _config(sim_url: str | None, tasks: Path, tools: str, **run: object) -> CollectConfig:
    sim_args = () if sim_url else ("--tool-call-share=1",)
    return CollectConfig(
        target=TargetConfig(base_url=sim_url, sim_args=sim_args),
        input=tasks,
        tools=tools,
        max_turns=3,
        progress=False,
        **run,  # type: ignore[arg-type]
    )


async def test_tool_errors_are_fed_back_and_counted(
    tool_server: StartToolServer, sim_process: SimProcess, tmp_path: Path
) -> None:
    """Every 5th call answers HTTP 500: each rollout still completes (the error body is the
    model's next input, as NeMo Gym's agent has it), and every error is counted, in the
    summary and in its row."""
    server, url = await tool_server("error", 5)
    output = tmp_path / "out" / "rollouts.jsonl"
    async with sim_process("--tool-call-share", "1") as sim:
        summary = await collect(
            _config(sim.base_url, _tasks(tmp_path / "t.jsonl", 40), url, output=output)
        )
    assert (summary.completed, summary.failed) == (40, 0)
    assert summary.tool_calls == server.calls == 120  # three turns' calls a rollout
    assert summary.tool_errors == server.faults == 24
    assert summary.tool_errors_treatment == "feed"
    rows = read_rows(output)
    assert sum(row["_autotune"]["tool_errors"] for row in rows) == 24
    fed_back = [
        item
        for row in rows
        for item in row["response"]["output"]
        if item["type"] == "function_call_output" and orjson.loads(item["output"]) == ERROR_BODY
    ]
    assert len(fed_back) == 24


async def _collect(
    start: StartToolServer, sim_process: SimProcess, tmp_path: Path, fault: str, every: int,
    tasks: int, **run: object,
) -> tuple[ToolServer, CollectSummary]:  # fmt: skip
    """A collect of `tasks` multi-turn rollouts against a tool server with `fault`."""
    server, url = await start(fault, every)
    async with sim_process("--tool-call-share", "1") as sim:
        config = _config(sim.base_url, _tasks(tmp_path / "t.jsonl", tasks), url, **run)
        return server, await collect(config)


async def test_tool_errors_fail_their_rollouts_when_asked(
    tool_server: StartToolServer, sim_process: SimProcess, tmp_path: Path
) -> None:
    server, summary = await _collect(
        tool_server, sim_process, tmp_path, "error", 5, 40, tool_errors="fail"
    )
    # A rollout stops at its first error, so each error fails one rollout.
    assert summary.errors_by_class == {"tool_error": server.faults} and server.faults > 0
    assert summary.completed + summary.failed == 40 and summary.failed == server.faults
    assert summary.tool_errors == server.faults


async def test_a_hanging_tool_call_fails_as_a_tool_timeout(
    tool_server: StartToolServer, sim_process: SimProcess, tmp_path: Path
) -> None:
    """The model's --timeout is minutes; a tool's own is --tool-timeout."""
    server, summary = await _collect(
        tool_server, sim_process, tmp_path, "hang", 7, 30, tool_timeout_s=0.3
    )
    assert summary.errors_by_class == {"tool_timeout": server.faults} and server.faults > 0
    assert summary.completed + summary.failed == 30


@pytest.mark.slow
async def test_diagnose_shows_tool_errors_beside_its_verdict(
    tool_server: StartToolServer, sim_process: SimProcess, tmp_path: Path
) -> None:
    _, url = await tool_server("error", 5)
    async with sim_process("--tool-call-share", "1") as sim:
        config = _config(sim.base_url, _tasks(tmp_path / "t.jsonl", 100), url)
        result = await diagnose(DiagnoseConfig(config, low=2, high=8, min_s=1, max_s=3))
    verdict = result.verdict
    assert verdict.verdict != "unstable", verdict  # fed back, the rollouts went on
    for probe in result.probes:
        assert probe.tool_calls > 0 and probe.errors_by_class == {}
        # every 5th call, counted over the windows (a call in flight at an edge aside)
        assert abs(probe.tool_errors - probe.tool_calls / 5) <= probe.parallelism, probe
    notes = " ".join(verdict.notes)
    assert "tool calls answered an error status" in notes, notes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tool_timeout_s", "evidence"),
    [
        (1.0, "high probe error rate (rate limits aside)"),
        (30.0, "tool calls hanging when the high probe ended"),
    ],
    ids=["timed-out", "still-hanging"],
)
async def test_diagnose_says_unstable_when_tool_calls_hang(
    tool_server: StartToolServer,
    sim_process: SimProcess,
    tmp_path: Path,
    tool_timeout_s: float,
    evidence: str,
) -> None:
    """Every 10th call hangs. With a tool timeout shorter than a block, the calls fail as
    `tool_timeout` inside the windows; with one longer than the probe, they are still
    hanging when each block's drain gives up on them, and are counted there. Either way
    the verdict is `unstable` and points at the environment, not at parallelism."""
    server, url = await tool_server("hang", 10)
    async with sim_process("--tool-call-share", "1") as sim:
        config = _config(
            sim.base_url, _tasks(tmp_path / "t.jsonl", 200), url, tool_timeout_s=tool_timeout_s
        )
        result = await diagnose(DiagnoseConfig(config, low=2, high=8, min_s=1, max_s=6))
    verdict, high = result.verdict, result.probes[1]
    met = {e.name for e in verdict.evidence if e.met}
    assert verdict.verdict == "unstable" and evidence in met, verdict
    assert verdict.next_step.startswith("fix the environment first"), verdict.next_step
    if tool_timeout_s < 6:
        assert set(high.errors_by_class) == {"tool_timeout"}, high.errors_by_class
    else:
        assert high.stuck_tool_calls > 0 and server.faults >= high.stuck_tool_calls


@pytest.mark.slow
async def test_the_embedded_simulator_runs_in_real_time_beside_real_tools(
    tool_server: StartToolServer, tmp_path: Path
) -> None:
    """At its usual 20× the simulated model would seem 20× faster than the tools beside
    it, and the tool stage, converted to simulated time, 20× longer than it was."""
    _, url = await tool_server("error", 10**9, call_s=0.05)
    config = _config(None, _tasks(tmp_path / "t.jsonl", 100), url)
    result = await diagnose(DiagnoseConfig(config, low=1, high=2, min_s=1, max_s=3))
    assert result.target.time_scale == 1.0
    for probe in result.probes:
        tool = probe.latency_s["tool"]
        # three calls a rollout (--max-turns 3), 50 ms of real time each, plus their HTTP
        # round trips; in the simulator's time at 20× it would read 3 s
        assert tool.mean is not None and 0.15 <= tool.mean < 0.6, tool


def test_tools_beside_synthetic_tasks_say_they_are_never_called() -> None:
    """Synthetic tasks offer the model no tools: every rollout is one model call, and the
    run says so instead of passing for a multi-turn one."""
    result = autotune(
        "collect", "--synthetic", "5", "--output-tokens", "8,0", "--tools", "null",
        "--no-output", "--parallelism", "5",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "offer the model no tools" in line]
    assert len(warning) == 1 and "--input" in warning[0], result.stderr
    assert "tools " not in result.stdout  # no tool call was made


def test_tool_flags_refuse_bad_values_in_one_sentence() -> None:
    for flags, cause in (
        (("--tool-timeout", "0"), "--tool-timeout"),
        (("--tool-errors", "ignore"), "--tool-errors"),
    ):
        result = autotune("collect", "--synthetic", "5", "--no-output", *flags)
        assert result.returncode == 2 and cause in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
