"""Sweep 2.0 against real vLLM (its CPU build): a configuration that cannot reach the
best is pruned after its first rung, one that cannot shard is rejected without a launch,
and the recommendation is validated under load before it is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vllm.conftest import VllmInstall
from tests.vllm.test_sweep import FIXED_ARGS, sweep

pytestmark = pytest.mark.vllm

BEST = {"tensor_parallel_size": 1, "max_num_seqs": 16}
SLOW = {"tensor_parallel_size": 1, "max_num_seqs": 2}  # at most 2 at once: out of reach
UNSHARDABLE = {"tensor_parallel_size": 3, "max_num_seqs": 16}  # the model has 4 heads


def test_a_pruned_sweep_ends_with_a_validated_recommendation(
    vllm_install: VllmInstall, tmp_path: Path
) -> None:
    space = {
        "parallelism": {"low": 2, "high": 16},
        "tensor_parallel_size": {"choices": [1, 3]},
        "max_num_seqs": {"choices": [2, 16]},
    }
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    args = [*FIXED_ARGS, "--block-size", "32"]
    result, saved, directory = sweep(
        vllm_install, tmp_path, space, env, trials=3, args=args, enqueue=[BEST, SLOW, UNSHARDABLE]
    )
    assert result.returncode == 0, result.stderr
    assert saved is not None
    (pruned,) = saved.pruned
    assert pruned.knobs == SLOW and pruned.pruned_reason is not None
    assert len(pruned.points) == 1  # stopped at its first rung
    (rejected,) = [t for t in saved.completed if t.knobs == UNSHARDABLE]
    assert rejected.infeasible_reason is not None and rejected.probe_s == 0.0
    assert "must be divisible by tensor parallel size (3)" in rejected.infeasible_reason
    recommendation = json.loads((directory / "recommendation.json").read_text())
    assert recommendation["server"] == BEST
    assert recommendation["validated"] is True, recommendation["validations"]
    last = recommendation["validations"][-1]
    assert last["parallelism"] == recommendation["recommended"]["parallelism"]
    assert last["completed"] > 0 and last["error_rate"] == 0.0
