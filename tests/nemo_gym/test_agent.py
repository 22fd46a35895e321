"""autotune against a real NeMo Gym stack through its agent servers (`--agent-url`).

The stack's policy model is autotune's simulator, which calls the single-tool-call
example's tool in half the turns offered it; that environment rewards a rollout that
called it, so rewards differ from task to task and the comparison with NeMo Gym's own
collector means something. mcqa, a verifier-only environment, rewards the simulator's
"tok tok" answers 0.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.helpers import autotune
from tests.nemo_gym.conftest import MCQA_AGENT, TOOL_AGENT, NemoGymStack, read_rows

pytestmark = [pytest.mark.nemo_gym, pytest.mark.slow]

ENVIRONMENTS = [
    (TOOL_AGENT, "example_single_tool_call.example.jsonl"),
    (MCQA_AGENT, "mcqa.example.jsonl"),
]
# Keys NeMo Gym's collector adds beside the agent's answer (which agent, which environment
# server, the result type); autotune names itself in agent_ref.
COLLECTOR_KEYS = {"agent_ref", "_ng_environment_server", "_ng_result_type"}


@pytest.mark.parametrize(("agent", "data"), ENVIRONMENTS)
def test_collect_through_the_agent_gives_the_rewards_nemo_gym_gives(
    nemo_gym_stack: NemoGymStack, nemo_gym_data: Path, tmp_path: Path, agent: str, data: str
) -> None:
    tasks = nemo_gym_data / data
    theirs = nemo_gym_stack.collect(agent, tasks, tmp_path / "ng.jsonl", parallelism=5)
    output = tmp_path / "autotune" / "rollouts.jsonl"
    done = autotune(
        "collect", "--agent-url", nemo_gym_stack.url(agent), "--input", str(tasks),
        "--metrics-url", nemo_gym_stack.metrics_url, "--output-dir", str(output.parent),
        "--parallelism", "5", "--quiet", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours = read_rows(output)
    assert [row["_ng_task_index"] for row in ours] == list(range(5))
    assert [row["reward"] for row in ours] == [row["reward"] for row in theirs]
    for mine, nemo in zip(ours, theirs, strict=True):
        assert set(nemo) - COLLECTOR_KEYS <= set(mine)
        timings = mine["_autotune"]["timings"]
        assert timings["model_end"] > timings["model_start"] >= timings["queued"]
        assert mine["_autotune"]["simulated"] is True
    summary = orjson.loads(done.stdout)
    assert summary["completed"] == 5 and summary["failed"] == 0
    if agent == TOOL_AGENT:  # the tool ran in some rollouts and not in others
        assert 0 < sum(row["reward"] for row in ours) < 5
        called = [
            any(i["type"] == "function_call" for i in row["response"]["output"]) for row in ours
        ]
        assert called == [row["reward"] == 1.0 for row in ours]
