"""autotune's own multi-turn engine against NeMo Gym's real single-tool-call resources
server (`--tools`, `--verifier .../verify`), beside NeMo Gym's own agent on the same
tasks and the same simulated policy model."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import helpers
from tests.helpers import autotune
from tests.nemo_gym.conftest import TOOL_AGENT, NemoGymStack, read_rows

pytestmark = [pytest.mark.nemo_gym, pytest.mark.slow]

RESOURCES = "example_single_tool_call"
# NeMo Gym's own check of a finished rollout: the model its resources servers answer
# /verify with (the task's request, a Responses-API response, a float reward).
VALIDATE = """
import sys
from nemo_gym.base_resources_server import BaseVerifyResponse
for line in open(sys.argv[1]):
    BaseVerifyResponse.model_validate_json(line)
"""
EXAMPLE_ROLLOUTS = """
import importlib.util, sys
spec = importlib.util.find_spec("resources_servers.example_single_tool_call")
print(spec.submodule_search_locations[0] + "/data/example_rollouts.jsonl")
"""


def item_shapes(rows: list[Any]) -> dict[str, dict[str, str]]:
    """Each output item type's keys and their JSON types, over every row."""
    shapes: dict[str, dict[str, str]] = {}
    for row in rows:
        for item in row["response"]["output"]:
            shape = shapes.setdefault(item["type"], {})
            shape.update({key: type(value).__name__ for key, value in item.items()})
    return shapes


def test_multi_turn_rollouts_are_rollouts_nemo_gym_makes_and_reads(
    nemo_gym_stack: NemoGymStack, nemo_gym_data: Path, tmp_path: Path
) -> None:
    tasks = nemo_gym_data / "example_single_tool_call.example.jsonl"
    resources = nemo_gym_stack.url(RESOURCES)
    done = autotune(
        "collect", "--base-url", nemo_gym_stack.sim_base_url, "--input", str(tasks),
        "--tools", resources, "--verifier", f"{resources}/verify",
        "--output-dir", str(tmp_path / "ours"), "--parallelism", "5", "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours = read_rows(tmp_path / "ours" / "rollouts.jsonl")
    theirs = nemo_gym_stack.collect(TOOL_AGENT, tasks, tmp_path / "ng.jsonl", parallelism=5)

    # The same loop: per task, the same turns (item types in order) and the same reward.
    def trace(row: Any) -> tuple[list[str], float]:
        return [item["type"] for item in row["response"]["output"]], row["reward"]

    assert [trace(row) for row in ours] == [trace(row) for row in theirs]
    assert any("function_call_output" in trace(row)[0] for row in ours)
    for row in ours:
        turns = row["_autotune"]["turns"]
        calls = sum(item["type"] == "function_call" for item in row["response"]["output"])
        assert sum(len(turn["tools"]) for turn in turns) == calls
        assert row["_autotune"]["timings"]["tool"] > 0

    # NeMo Gym's own validation of rollouts takes every row.
    python = nemo_gym_stack.install.python
    path = tmp_path / "ours" / "rollouts.jsonl"
    checked = subprocess.run([python, "-c", VALIDATE, str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr[-2000:]

    # Item by item, the keys and types of NeMo Gym's example rollouts.
    located = subprocess.run([python, "-c", EXAMPLE_ROLLOUTS], capture_output=True, text=True)
    examples = item_shapes(helpers.read_rows(Path(located.stdout.strip())))
    mine = item_shapes(ours)
    assert set(mine) == set(examples) == {"message", "function_call", "function_call_output"}
    for kind, shape in examples.items():
        assert {key: mine[kind].get(key) for key in shape} == shape, kind
