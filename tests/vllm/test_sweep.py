"""`autotune sweep` with `kind: vllm`: the real server relaunched per configuration.

A small study over tensor_parallel_size, max_num_seqs and max_num_batched_tokens must
relaunch vLLM for each configuration, prune one that cannot reach the best, reject one
that cannot shard without a launch, validate its recommendation under load, write its
report, and leave no vLLM process and no shared-memory segment behind (one study shows
all of it: each vLLM start costs half a minute here); a configuration vLLM refuses must
be recorded as infeasible with vLLM's own error line.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.flags import server_flags
from autotune.config.study import load_study
from autotune.results.saved import load_result
from autotune.results.trials import SweepResult
from autotune.servers.vllm import API_SERVER_MODULE, shm_entries
from autotune.sweep.recommend import recommendation
from autotune.sweep.search import open_study, storage_url
from tests.helpers import autotune
from tests.vllm.conftest import WIDE_FLAGS, VllmInstall

pytestmark = pytest.mark.vllm

FIXED_ARGS = ["--served-model-name", "tiny-llama", "--max-model-len", "2048", "--enforce-eager"]


def sweep(
    install: VllmInstall,
    tmp_path: Path,
    search_space: dict[str, Any],
    env: dict[str, str],
    trials: int,
    args: list[str],
    enqueue: Sequence[dict[str, Any]] = (),
    wide: bool = False,
) -> tuple[Any, SweepResult | None, Path]:
    """Runs a study against real vLLM, its first trials the `enqueue`d knobs; returns the
    finished process, sweep.json (None if none was saved), reports. `wide` serves the
    wide model, whose batches are cheap, instead of the tiny one."""
    study = {
        "name": "vllm-cpu",
        "target": {
            "kind": "vllm",
            "command": ["nice", "-n", "10", install.python, "-m", API_SERVER_MODULE],
            "model": install.wide_model if wide else install.model,
            "args": [*args, *(server_flags(WIDE_FLAGS) if wide else [])],
            "env": env,
            "startup_timeout_s": 300,
        },
        "workload": {
            "synthetic": {"num_tasks": 200, "prompt_tokens": [64, 16], "output_tokens": [32, 0]},
            "verifier": "none",
            "stream": False,
            "extra_body": {"ignore_eos": True},
        },
        "search_space": search_space,
        "probe": {"min_s": 1.5, "max_s": 4},
        "budget": {"trials": trials, "validate_rollouts": 100},
        "seed": 0,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    if enqueue:
        spec = load_study(path)
        optuna_study = open_study(spec, storage_url(spec, None, tmp_path / "studies"))
        for knobs in enqueue:
            optuna_study.enqueue_trial(knobs)
    reports = tmp_path / "reports"
    result = autotune(
        "sweep",
        str(path),
        "--studies-dir",
        str(tmp_path / "studies"),
        "--output-dir",
        str(reports / "vllm-cpu"),
        "--quiet",
        timeout=900,
    )
    path = reports / "vllm-cpu" / "sweep.json"
    saved = load_result(path) if path.exists() else None
    assert saved is None or isinstance(saved, SweepResult)
    return result, saved, reports / "vllm-cpu"


def processes_marked(mark: str) -> list[int]:
    """PIDs whose environment carries `mark` (vLLM's workers rename themselves)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


BEST = {"tensor_parallel_size": 1, "max_num_seqs": 16, "max_num_batched_tokens": 4096}
# One at a time, in smaller steps: far out of the best's reach, and the other step size.
SLOW = {**BEST, "max_num_seqs": 1, "max_num_batched_tokens": 2048}
UNSHARDABLE = {**BEST, "tensor_parallel_size": 3}  # the model has 4 attention heads


@pytest.mark.alone  # its pruning compares throughput vLLM measures on both cores
def test_a_sweep_relaunches_prunes_rejects_validates_and_cleans_up(
    vllm_install: VllmInstall, tmp_path: Path
) -> None:
    """One study shows the whole life of a `kind: vllm` sweep: every configuration gets
    its own vLLM, one that cannot reach the best is pruned after its first rung, one that
    cannot shard is rejected without a launch, the recommendation is validated under
    load before it is written, and no process or shared-memory segment is left."""
    mark = f"AUTOTUNE_TEST_MARK={uuid.uuid4().hex}"
    shm_before = shm_entries()
    space = {
        "parallelism": {"low": 2, "high": 16},
        "tensor_parallel_size": {"choices": [1, 3]},
        "max_num_seqs": {"choices": [1, 16]},
        "max_num_batched_tokens": {"choices": [2048, 4096]},
    }
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", mark.split("=")[0]: mark.split("=")[1]}
    args = [*FIXED_ARGS, "--block-size", "32"]
    enqueue = [BEST, SLOW, UNSHARDABLE]
    # The wide model: on the tiny one a batch of 16 made as few rollouts a second as one
    # sequence did, within a short probe's interval (4.4 against 3.2), and nothing was pruned.
    result, saved, directory = sweep(
        vllm_install,
        tmp_path,
        space,
        env,
        trials=len(enqueue),
        args=args,
        enqueue=enqueue,
        wide=True,
    )
    assert result.returncode == 0, result.stderr
    assert saved is not None and saved.simulated is False
    measured = [t for t in saved.trials if t.probe_s]  # complete or pruned, each launched
    assert {t.knobs["max_num_seqs"] for t in measured} == {1, 16}
    assert {t.knobs["max_num_batched_tokens"] for t in measured} == {2048, 4096}
    (slow,) = saved.pruned  # stopped at its first rung
    assert slow.knobs == SLOW and slow.pruned_reason is not None and len(slow.points) == 1
    (rejected,) = [t for t in saved.completed if t.knobs == UNSHARDABLE]
    assert rejected.infeasible_reason is not None and rejected.probe_s == 0.0
    assert "must be divisible by tensor parallel size (3)" in rejected.infeasible_reason
    assert all(t.feasible and t.points for t in saved.completed if t is not rejected)
    assert recommendation(saved) is not None
    for name in ("index.html", "trials.csv", "recommendation.json", "recommendation.yaml"):
        assert (directory / name).exists(), name
    recommended = json.loads((directory / "recommendation.json").read_text())
    assert recommended["server"] == BEST
    assert recommended["validated"] is True, [
        (run["parallelism"], run["throughput"], run["predicted_interval"], run["problems"])
        for run in recommended["validations"]
    ]
    last = recommended["validations"][-1]
    assert last["parallelism"] == recommended["recommended"]["parallelism"]
    assert last["completed"] > 0 and last["error_rate"] == 0.0
    assert processes_marked(mark) == []
    leftovers = {n for n in shm_entries() - shm_before if n.startswith(("psm_", "sem.mp-"))}
    assert leftovers == set()


@pytest.mark.parametrize(
    ("space", "env", "error"),
    [
        (
            {"flags": {"block_size": {"choices": [16]}}},
            {"VLLM_CPU_KVCACHE_SPACE": "1"},
            "ValueError: No common block size for 16",
        ),
        (
            {"gpu_memory_utilization": {"choices": [0.01]}},
            {},  # the KV cache sized from --gpu-memory-utilization, a share of RAM
            "less than requested memory for kv",
        ),
    ],
    ids=["block-size", "kv-memory"],
)
def test_a_configuration_vllm_refuses_is_infeasible_with_its_error(
    vllm_install: VllmInstall,
    tmp_path: Path,
    space: dict[str, Any],
    env: dict[str, str],
    error: str,
) -> None:
    result, saved, _ = sweep(vllm_install, tmp_path, space, env, trials=1, args=FIXED_ARGS)
    assert result.returncode == 0, result.stderr
    assert saved is not None
    (trial,) = saved.completed
    assert not trial.feasible
    assert trial.infeasible_reason is not None
    assert error in trial.infeasible_reason, trial.infeasible_reason
    assert "root cause above" not in trial.infeasible_reason
