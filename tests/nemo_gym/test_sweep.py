"""`autotune sweep` of a real NeMo Gym agent (`kind: nemo-gym-agent`): only parallelism
is searched, and the recommendation is what to pass NeMo Gym's collector."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from tests.helpers import autotune
from tests.nemo_gym.conftest import MCQA_AGENT, WIDE, NemoGymStack

pytestmark = [pytest.mark.nemo_gym, pytest.mark.slow]


def test_a_sweep_of_the_agent_recommends_num_samples_in_parallel(
    nemo_gym_stack: NemoGymStack, probe_tasks: Path, tmp_path: Path
) -> None:
    study = {
        "name": "nemo-gym-agent",
        "target": {
            "kind": "nemo-gym-agent",
            "agent_url": nemo_gym_stack.url(MCQA_AGENT),
            "metrics_url": nemo_gym_stack.metrics_url,
        },
        "workload": {"input": str(probe_tasks)},
        "search_space": {"parallelism": {"low": 2, "high": 16}},
        "budget": {"trials": 1, "validate_rollouts": 60},
        "probe": {"min_s": 2.0, "max_s": 8.0, "target_halfwidth": 0.15},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    with nemo_gym_stack.sim(*WIDE):
        done = autotune(
            "sweep", str(path), "--studies-dir", str(tmp_path / "studies"),
            "--output-dir", str(tmp_path / "out"), "--quiet", timeout=400,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recommended = orjson.loads((tmp_path / "out" / "recommendation.json").read_bytes())
    parallelism = recommended["recommended"]["parallelism"]
    assert 2 <= parallelism <= 16
    assert recommended["server"] == {}
    assert recommended["snippets"]["nemo_gym"] == f"+num_samples_in_parallel={parallelism}"
    assert f"+num_samples_in_parallel={parallelism}" in done.stdout
