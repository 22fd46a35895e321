"""A NeMo Gym agent server as the target (`--agent-url`), against an in-process stand-in
for one: what `POST /run` is sent, what the rows become, how its failures are counted.
The real thing is in tests/nemo_gym/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from autotune.collector.collect_job import collect
from autotune.config.collection import CollectConfig, TargetConfig
from tests.helpers import ServeApp, read_rows

TASKS = [
    {"responses_create_params": {"input": f"question {i}"}, "expected_answer": str(i % 2)}
    for i in range(6)
]


def agent_app(answers: list[int], received: list[dict[str, Any]]) -> web.Application:
    """An agent whose /run answers with the HTTP statuses in `answers`, then 200s: the task
    echoed, a response with usage, reward 1.0 when the expected answer is "1"."""

    async def run(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        status = answers.pop(0) if answers else 200
        if status != 200:
            return web.json_response({"detail": "no"}, status=status)
        usage = {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}
        response = {"id": "resp_1", "output": [], "usage": usage, "model": "policy"}
        reward = float(body["expected_answer"] == "1")
        return web.json_response({**body, "response": response, "reward": reward})

    async def routes(request: web.Request) -> web.Response:
        return web.json_response({"paths": {"/run": {}}})

    app = web.Application()
    app.router.add_post("/run", run)
    app.router.add_get("/openapi.json", routes)
    return app


def tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"".join(orjson.dumps(task) + b"\n" for task in TASKS))
    return path


async def test_each_rollout_is_one_run_and_its_answer_is_the_row(
    serve_app: ServeApp, tmp_path: Path
) -> None:
    received: list[dict[str, Any]] = []
    url = await serve_app(agent_app([], received))
    output = tmp_path / "out" / "rollouts.jsonl"
    config = CollectConfig(
        target=TargetConfig(agent_url=url), input=tasks_file(tmp_path), output=output,
        verifier="nemo-gym-agent", parallelism=3, progress=False, num_repeats=2,
    )  # fmt: skip
    summary = await collect(config)
    assert (summary.completed, summary.failed) == (12, 0)
    assert sorted(received, key=lambda row: row["responses_create_params"]["input"]) == sorted(
        TASKS * 2, key=lambda row: row["responses_create_params"]["input"]
    )
    assert summary.mean_reward == 0.5 and summary.output_tokens == 60
    for row in read_rows(output):
        task = TASKS[row["_ng_task_index"]]
        assert row["expected_answer"] == task["expected_answer"]
        assert row["reward"] == float(task["expected_answer"] == "1")
        assert row["response"]["usage"]["output_tokens"] == 5
        assert row["_ng_rollout_index"] in (0, 1)
        timings = row["_autotune"]["timings"]
        assert timings["model_end"] >= timings["model_start"]


async def test_an_agent_refusing_a_task_fails_it_and_a_busy_one_is_retried(
    serve_app: ServeApp, tmp_path: Path
) -> None:
    received: list[dict[str, Any]] = []
    url = await serve_app(agent_app([422, 503], received))
    config = CollectConfig(
        target=TargetConfig(agent_url=url, retry_base_s=0.01),
        input=tasks_file(tmp_path),
        limit=2,
        verifier="nemo-gym-agent",
        parallelism=1,
        progress=False,
    )
    summary = await collect(config)
    # The 422 is the agent's answer for that task (NeMo Gym's collector does not retry
    # it either); the 503 is a busy server, and the task's second try succeeds.
    assert (summary.completed, summary.failed) == (1, 1)
    assert summary.errors_by_class == {"http_4xx": 1}
    assert summary.retries_by_class == {"http_5xx": 1}
    assert len(received) == 3


async def test_an_answer_that_is_no_rollout_fails_as_a_bad_response(
    serve_app: ServeApp, tmp_path: Path
) -> None:
    async def run(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/run", run)
    url = await serve_app(app)
    config = CollectConfig(
        target=TargetConfig(agent_url=url), input=tasks_file(tmp_path), limit=1,
        verifier="nemo-gym-agent", progress=False,
    )  # fmt: skip
    summary = await collect(config)
    assert summary.errors_by_class == {"bad_response": 1}
