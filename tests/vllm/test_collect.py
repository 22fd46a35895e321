"""`autotune collect` against real vLLM: token counts and NeMo Gym rows.

Every finished request's `usage` must add up to exactly what vLLM counted itself in
/metrics, for streaming and non-streaming calls to both APIs; every NeMo Gym example
must run and come back as rows with the reference rollouts' keys and types.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.servers.vllm import VllmServer
from tests.helpers import autotune, read_rows
from tests.vllm.conftest import server_counters

pytestmark = pytest.mark.vllm

TASKS = 24
VERIFIER_FOR = {
    "string_match": "boxed",
    "mcqa": "mcqa",
    "code_gen": "code",
    "math_with_judge": "boxed",
    "example_single_tool_call": "none",
}
CORE_KEYS = {"responses_create_params", "response", "reward", "_ng_task_index", "_ng_rollout_index"}
JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def settled_counters(server: VllmServer) -> dict[str, float]:
    """The counters once two reads in a row agree (vLLM records a request as it ends)."""
    last = server_counters(server)
    for _ in range(20):
        time.sleep(0.25)
        now = server_counters(server)
        if now == last:
            return now
        last = now
    return last


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_usage_token_counts_match_the_servers_counters(
    vllm_server: VllmServer, api: str, stream: bool, tmp_path: Path
) -> None:
    out = tmp_path / "rollouts.jsonl"
    before = settled_counters(vllm_server)
    result = autotune(
        "collect",
        "--base-url",
        vllm_server.base_url or "",
        "--api",
        api,
        *([] if stream else ["--no-stream"]),
        "--synthetic",
        str(TASKS),
        "--prompt-tokens",
        "96,32",
        "--output-tokens",
        "48,16",
        "--parallelism",
        "8",
        "--output-dir",
        str(tmp_path),
        "--json",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr + vllm_server.log_tail()
    after = settled_counters(vllm_server)
    summary = json.loads(result.stdout)
    assert summary["completed"] == TASKS and summary["failed"] == 0
    assert summary["model"] == "tiny-llama" and summary["simulated"] is False
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    prompted = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert summary["output_tokens"] == generated > 0
    assert summary["input_tokens"] == prompted > 0
    rows = read_rows(out)
    assert sum(row["response"]["usage"]["output_tokens"] for row in rows) == generated


def json_type(value: Any) -> str:
    return (
        "number"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else (JSON_TYPES[type(value)])
    )


def reference_types(rows: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each key of the reference rows with the JSON types its values take."""
    types: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row.items():
            types.setdefault(key, set()).add(json_type(value))
    return types


@pytest.mark.parametrize("name", sorted(VERIFIER_FOR))
def test_nemo_gym_examples_run_and_rows_match_the_reference(
    vllm_server: VllmServer, nemo_gym_data: Path, name: str, tmp_path: Path
) -> None:
    out = tmp_path / "rollouts.jsonl"
    result = autotune(
        "collect",
        "--input",
        str(nemo_gym_data / f"{name}.example.jsonl"),
        "--base-url",
        vllm_server.base_url or "",
        "--verifier",
        VERIFIER_FOR[name],
        "--num-repeats",
        "2",
        # The examples set no output limit; the random model would write to max_model_len.
        "--extra-body",
        '{"max_tokens": 48}',
        "--output-dir",
        str(tmp_path),
        "--json",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr + vllm_server.log_tail()
    summary = json.loads(result.stdout)
    assert (summary["completed"], summary["failed"]) == (10, 0)
    rows = read_rows(out)
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [
        (t, r) for t in range(5) for r in range(2)
    ]
    for row in rows:
        response = row["response"]
        assert response["object"] == "response" and response["model"] == "tiny-llama"
        assert response["output"] and response["usage"]["output_tokens"] > 0
        assert "simulated" not in row["_autotune"]
        if VERIFIER_FOR[name] != "none":
            assert row["reward"] in (0.0, 1.0)
    reference = nemo_gym_data / f"{name}.example_rollouts.jsonl"
    if not reference.exists():
        return
    expected = reference_types(read_rows(reference))
    response_types = reference_types([r["response"] for r in read_rows(reference)])
    for row in rows:
        for key, types in expected.items():
            assert key in row, f"{key} missing from the row"
            # A random model's text holds nothing to check: NeMo Gym's verifiers write
            # null into their own fields then too.
            allowed = types if key in CORE_KEYS else types | {"null"}
            assert json_type(row[key]) in allowed, (key, row[key], types)
        for key, types in response_types.items():
            if key in row["response"] and types != {"null"}:  # null there: an optional field
                assert json_type(row["response"][key]) in types | {"null"}, (key, types)
