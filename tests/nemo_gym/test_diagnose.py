"""`autotune diagnose` against a real NeMo Gym stack: through an agent (`--agent-url`,
with the policy model's /metrics) and through NeMo Gym's own `ng_collect_rollouts`
(`--command`), on the same stack.

The workload is `probe_tasks` (mcqa's tasks, each with its own output length); the
simulator runs four times slower than real time (WIDE), so that at parallelism 20 the
stack's own Python (seven servers and Ray on this machine's cores) is far from being
the limit, or at real time with room for two sequences (CAPPED).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import autotune
from tests.nemo_gym.conftest import MCQA_AGENT, WIDE, NemoGymStack

pytestmark = [pytest.mark.nemo_gym, pytest.mark.slow]

CAPPED = ("--time-scale", "1", "--natural-output-tokens", "100000", "--max-num-seqs", "2")


def diagnose(*args: str, cwd: Path) -> dict[str, Any]:
    """`autotune diagnose ARGS` from `cwd` (ng_collect_rollouts, a Hydra app, writes its
    outputs/ folder there)."""
    done = autotune("diagnose", *args, "--max-s", "20", "--quiet", "--json", timeout=400, cwd=cwd)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = orjson.loads(done.stdout)
    return result


@pytest.mark.alone
def test_the_agent_and_ng_collect_rollouts_get_the_same_verdict(
    nemo_gym_stack: NemoGymStack, probe_tasks: Path, tmp_path: Path
) -> None:
    agent = nemo_gym_stack.url(MCQA_AGENT)
    with nemo_gym_stack.sim(*WIDE):
        through_agent = diagnose(
            "--agent-url",
            agent,
            "--metrics-url",
            nemo_gym_stack.metrics_url,
            "--input",
            str(probe_tasks),
            cwd=tmp_path,
        )
        template = nemo_gym_stack.collect_command(MCQA_AGENT, probe_tasks)
        # 50 rollouts at parallelism 5, 200 at 20
        through_command = diagnose("--command", template, cwd=tmp_path)
    assert through_agent["verdict"]["verdict"] == "parallelism-bound"
    assert through_command["verdict"]["verdict"] == through_agent["verdict"]["verdict"]
    assert through_agent["target"]["simulated"] is True
    waiting = [
        p["telemetry"]["server/vllm:num_requests_waiting"]["mean"] for p in through_agent["probes"]
    ]
    assert max(waiting) < 0.5  # the model server kept up: the agent's slots were the limit


def test_a_model_server_capped_at_two_sequences_is_model_bound(
    nemo_gym_stack: NemoGymStack, probe_tasks: Path, tmp_path: Path
) -> None:
    agent = nemo_gym_stack.url(MCQA_AGENT)
    with nemo_gym_stack.sim(*CAPPED):
        result = diagnose(
            "--agent-url",
            agent,
            "--metrics-url",
            nemo_gym_stack.metrics_url,
            "--input",
            str(probe_tasks),
            cwd=tmp_path,
        )
    verdict = result["verdict"]
    assert verdict["verdict"] == "model-bound"
    met = {evidence["name"] for evidence in verdict["evidence"] if evidence["met"]}
    assert "server requests waiting (mean)" in met
