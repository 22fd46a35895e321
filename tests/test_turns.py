"""Multi-turn rollouts in autotune's own engine (autotune.rollout.turns, autotune.rollout.tools):
the tool loop NeMo Gym's simple agent runs, its rows, its timings, and the verdict when the
tools are what saturates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from autotune.bench.overhead import NullServer
from autotune.collector.collect_job import run_collect
from autotune.config.collection import CollectConfig, TargetConfig
from autotune.diagnose.diagnose_job import DiagnoseConfig, diagnose
from autotune.results.stages import stage_durations
from autotune.rollout.backends import CallCounters, Generation, ModelCallError
from autotune.rollout.engine import Engine
from autotune.rollout.store import RolloutSink
from autotune.rollout.tools import NULL_OUTPUT, ResourcesServerTools, ToolOutput
from autotune.rollout.turns import MultiTurnBackend
from autotune.rollout.workload import WorkItem, task_from_row
from autotune.verifiers import NoneVerifier
from tests.helpers import SIM_FAST, ServeApp, SimProcess, read_rows

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TASK_ROW = {
    "responses_create_params": {"input": "what's it like in sf?", "tools": [WEATHER]},
    "expected_answer": "cold",
}


class Scripted:
    """A model that calls get_weather `calls` times, then answers; keeps what it was sent."""

    model = "scripted"

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.counters = CallCounters()
        self.sent: list[list[dict[str, Any]]] = []

    async def generate(self, task: Any) -> Generation:
        self.sent.append(task.messages)
        turn = len(self.sent)
        now = asyncio.get_running_loop().time()
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "sf"}'},
        }
        calling = turn <= self.calls
        return Generation(
            text="" if calling else "cold",
            tool_calls=[call] if calling else [],
            input_tokens=10,
            output_tokens=3,
            finish_reason="tool_calls" if calling else "stop",
            response_id=f"r{turn}",
            model_start=now,
            first_token=None,
            model_end=now,
        )


class Recorded:
    """Tools that answer at once and keep every call."""

    name = "recorded"

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], str, str]] = []

    async def open(self, row: dict[str, Any]) -> dict[str, str]:
        return {"session": "1"}

    async def call(self, state: dict[str, str], name: str, arguments: str) -> ToolOutput:
        self.calls.append((dict(state), name, arguments))
        await asyncio.sleep(0.01)
        return ToolOutput('{"weather": "cold"}')


async def test_tool_outputs_go_back_into_the_conversation_until_an_answer() -> None:
    model, tools = Scripted(calls=2), Recorded()
    backend = MultiTurnBackend(model, tools, max_turns=10)
    generation = await backend.generate(task_from_row(0, TASK_ROW))

    assert (
        len(model.sent) == 3
        and tools.calls == [({"session": "1"}, "get_weather", '{"city": "sf"}')] * 2
    )
    third = model.sent[2]
    assert [m["role"] for m in third] == ["user", "assistant", "tool", "assistant", "tool"]
    assert third[1]["tool_calls"][0]["id"] == "call_1" and third[2]["tool_call_id"] == "call_1"
    assert third[2]["content"] == '{"weather": "cold"}'
    kinds = [item["type"] for item in generation.output or []]
    assert kinds == ["function_call", "function_call_output"] * 2 + ["message"]
    assert (generation.input_tokens, generation.output_tokens, generation.text) == (30, 9, "cold")
    assert generation.turns is not None and [len(t["tools"]) for t in generation.turns] == [1, 1, 0]
    assert 0.02 <= generation.tool_s < generation.model_end - generation.model_start


async def test_max_turns_ends_a_rollout_that_keeps_calling_after_its_tools_ran() -> None:
    model, tools = Scripted(calls=100), Recorded()
    generation = await MultiTurnBackend(model, tools, max_turns=3).generate(
        task_from_row(0, TASK_ROW)
    )
    assert len(model.sent) == 3 and len(tools.calls) == 3  # NeMo Gym's max_steps, too
    assert [item["type"] for item in generation.output or []][-1] == "function_call_output"


async def test_rows_carry_turns_and_a_tool_stage(tmp_path: Path) -> None:
    sink = RolloutSink(tmp_path / "rows.jsonl", resume=False)
    backend = MultiTurnBackend(Scripted(calls=1), Recorded(), max_turns=5)
    engine = Engine(backend, NoneVerifier(), sink, parallelism=2)
    stats = await engine.run(iter([WorkItem(task_from_row(0, TASK_ROW), 0)]))
    sink.close()
    assert stats.completed == 1
    (row,) = read_rows(tmp_path / "rows.jsonl")
    assert [t["type"] for t in row["response"]["output"]] == [
        "function_call", "function_call_output", "message",
    ]  # fmt: skip
    assert row["expected_answer"] == "cold" and len(row["_autotune"]["turns"]) == 2
    stages = dict(stage_durations(row["_autotune"]["timings"]))
    assert stages["tool"] == pytest.approx(row["_autotune"]["timings"]["tool"])
    assert stages["tool"] >= 0.01 and stages["model"] >= 0


async def test_a_resources_server_gets_the_session_cookie_and_its_errors_are_outputs(
    serve_app: ServeApp, session: Any
) -> None:
    seen: list[tuple[str, str | None, bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Cookie"), await request.read()))
        if request.path == "/seed_session":
            response = web.json_response({})
            response.set_cookie("session", "abc")
            return response
        return web.json_response({"detail": "no such city"}, status=422)

    app = web.Application()
    app.router.add_post("/{name}", handle)
    tools = ResourcesServerTools(session, await serve_app(app), timeout_s=5)
    state = await tools.open(TASK_ROW)
    output = await tools.call(state, "get_weather", '{"city": "sf"}')
    assert output.text == '{"detail": "no such city"}'  # what the model reads, as in NeMo Gym
    assert output.error == "HTTP 422"  # and counted as the environment's error
    bad = await tools.call(state, "get_weather", "{not json")
    assert "Invalid tool call arguments" in orjson.loads(bad.text)["error"]
    assert bad.error is None  # the model's mistake, not the environment's
    assert seen[0][0] == "/seed_session" and orjson.loads(seen[0][2]) == TASK_ROW
    assert seen[1] == ("/get_weather", "session=abc", b'{"city": "sf"}')
    assert len(seen) == 2  # the bad arguments never reached the server


async def test_a_resources_server_that_cannot_start_a_session_fails_the_rollout(
    serve_app: ServeApp, session: Any
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/seed_session", refuse)
    tools = ResourcesServerTools(session, await serve_app(app), timeout_s=5)
    backend = MultiTurnBackend(Scripted(calls=1), tools, max_turns=3)
    with pytest.raises(ModelCallError) as failed:
        await backend.generate(task_from_row(0, TASK_ROW))
    assert failed.value.failure_class == "tool_error"
    assert "seed_session answered HTTP 500" in str(failed.value)


def test_the_simulator_calls_the_tools_it_is_offered(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(TASK_ROW) + b"\n" for _ in range(4)))
    with sim_process("--tool-call-share", "1") as sim:
        summary = run_collect(
            CollectConfig(
                target=TargetConfig(base_url=sim.base_url),
                input=tasks,
                tools="null",
                max_turns=3,
                output=tmp_path / "out" / "rollouts.jsonl",
                progress=False,
            )
        )
    assert summary.completed == 4
    for row in read_rows(tmp_path / "out" / "rollouts.jsonl"):
        output = row["response"]["output"]
        assert [item["type"] for item in output] == ["function_call", "function_call_output"] * 3
        assert orjson.loads(output[0]["arguments"]) == {"city": "sim"}
        assert output[1]["output"] == NULL_OUTPUT and output[1]["call_id"] == output[0]["call_id"]


@pytest.mark.slow
async def test_a_slow_tool_endpoint_is_environment_bound(
    serve_app: ServeApp, sim_process: SimProcess, tmp_path: Path
) -> None:
    """Two tool calls at a time, 40 ms each, three a rollout: past two rollouts in flight
    they queue at the tools while the (fast) model server idles."""
    slots = asyncio.Semaphore(2)

    async def tool(request: web.Request) -> web.Response:
        async with slots:
            await asyncio.sleep(0.04)
        return web.json_response({"city": "sim", "weather_description": "cold"})

    async def seed(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/seed_session", seed)
    app.router.add_post("/get_weather", tool)
    tools_url = await serve_app(app)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(TASK_ROW) + b"\n" for _ in range(50)))
    async with sim_process(*SIM_FAST, "--tool-call-share", "1") as sim:
        collect = CollectConfig(
            target=TargetConfig(base_url=sim.base_url), input=tasks, tools=tools_url, max_turns=3
        )
        result = await diagnose(DiagnoseConfig(collect, low=2, high=8, min_s=1.5, max_s=8))
    verdict = result.verdict
    assert verdict.verdict == "environment-bound", verdict
    met = {e.name for e in verdict.evidence if e.met}
    assert "tool latency growth ÷ Little's-law prediction" in met
    assert "resources server" in verdict.next_step


@pytest.mark.parametrize("stream", [True, False])
def test_the_null_server_calls_a_tool_until_a_rollouts_last_turn(
    tmp_path: Path, stream: bool
) -> None:
    """What benchmarks/multiturn_overhead.py measures: 3 model calls a rollout."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(TASK_ROW) + b"\n" for _ in range(5)))
    output = tmp_path / "out" / "rollouts.jsonl"
    with NullServer(tool_turns=3) as server:
        summary = run_collect(
            CollectConfig(
                target=TargetConfig(base_url=server.base_url, model="null", stream=stream),
                input=tasks,
                tools="null",
                output=output,
                progress=False,
            )
        )
    assert summary.completed == 5
    for row in read_rows(output):
        kinds = [item["type"] for item in row["response"]["output"]]
        assert kinds == ["function_call", "function_call_output"] * 2 + ["message"]
        assert len(row["_autotune"]["turns"]) == 3
