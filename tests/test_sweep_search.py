"""The search around the curves (sweep/search.py, sweep/fit.py): a configuration that
cannot reach the best is PRUNED, one that cannot start is rejected without a launch, and
neither is ever launched again; what is known before launch (fit checks, the ceiling)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.config.study import Study
from autotune.hardware.memory import kv_capacity_tokens
from autotune.hardware.profiles import GPUS, MODELS, GiB
from autotune.sweep.feasibility import prelaunch
from autotune.sweep.search import open_study, optimise, trial_records
from tests.test_sweep_curve import FakeProbe


@dataclass
class SeqsLauncher:
    """A server whose throughput grows with parallelism up to its max_num_seqs."""

    started: list[dict[str, Any]] = field(default_factory=list)

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[FakeProbe]:
        self.started.append(dict(knobs))
        seqs = int(knobs["max_num_seqs"])
        yield FakeProbe(throughput=lambda n: 0.5 * min(n, seqs))


def study(tmp_path: Path, trials: int = 4, **space: Any) -> Study:
    return Study.model_validate(
        {
            "name": "search",
            "target": {"kind": "sim", "args": ["--model", "llama-3.1-8b"]},
            "search_space": {"parallelism": {"low": 4, "high": 256}, **space},
            "budget": {"trials": trials},
        }
    )


async def test_pruned_and_rejected_trials_are_recorded_and_never_launched_again(
    tmp_path: Path,
) -> None:
    spec = study(
        tmp_path,
        tensor_parallel_size={"choices": [1, 3]},
        max_num_seqs={"choices": [8, 64]},
    )
    optuna_study = open_study(spec, f"sqlite:///{tmp_path / 's.db'}")
    for knobs in (
        {"tensor_parallel_size": 1, "max_num_seqs": 64},  # the best: 32/s at 64
        {"tensor_parallel_size": 1, "max_num_seqs": 8},  # 4/s at its ceiling: pruned
        {"tensor_parallel_size": 1, "max_num_seqs": 8},  # again: reused, not launched
        {"tensor_parallel_size": 3, "max_num_seqs": 64},  # 32 heads do not split in 3
    ):
        optuna_study.enqueue_trial(knobs)
    launcher = SeqsLauncher()
    await optimise(spec, optuna_study, launcher)
    assert launcher.started == [
        {"tensor_parallel_size": 1, "max_num_seqs": 64},
        {"tensor_parallel_size": 1, "max_num_seqs": 8},
    ]
    states = [t.state.name for t in optuna_study.get_trials()]
    assert states[:4] == ["COMPLETE", "PRUNED", "PRUNED", "COMPLETE"]
    pruned = optuna_study.get_trials()[1]
    assert pruned.intermediate_values == {0: 4.0}  # each rung reported to Optuna
    records = trial_records(optuna_study)
    assert records[1].state == "PRUNED" and records[1].value == 4.0
    assert (
        records[1].pruned_reason is not None and "below the best so far" in records[1].pruned_reason
    )
    assert records[2].copied_from == 1 and records[2].value == 4.0  # the copy keeps its value
    rejected = records[3]
    assert not rejected.feasible and rejected.probe_s == 0.0 and rejected.points == []
    assert rejected.infeasible_reason is not None
    # The copy is not a trial of the budget (4): the search went on until every
    # configuration was tried (the one left has TP 3: rejected too), then stopped.
    tried = {(r.knobs["tensor_parallel_size"], r.knobs["max_num_seqs"]) for r in records}
    assert tried == {(1, 8), (1, 64), (3, 8), (3, 64)}
    assert len([r for r in records if r.copied_from is None]) == 4
    assert rejected.infeasible_reason.startswith("Total number of attention heads (32)")
    assert rejected.infeasible_reason.endswith("(known before launch: not started)")


def test_the_simulators_start_up_checks_answer_before_launch() -> None:
    spec = Study.model_validate(
        {"name": "fit", "target": {"kind": "sim", "args": ["--model", "llama-3.1-70b"]}}
    )
    oom = prelaunch(spec, {"tensor_parallel_size": 1})
    assert oom.problem is not None and oom.problem.startswith("No available memory")
    fits = prelaunch(spec, {"tensor_parallel_size": 4, "max_num_seqs": 64})
    assert fits.problem is None and fits.ceiling == 64


def test_the_ceiling_is_what_the_kv_cache_holds_when_that_is_fewer_than_max_num_seqs() -> None:
    spec = Study.model_validate(
        {
            "name": "fit",
            "target": {"kind": "sim", "args": ["--model", "llama-3.1-70b"]},
            "workload": {"synthetic": {"prompt_tokens": 1024, "output_tokens": 512}},
        }
    )
    # TP 2 at 0.9 of an H100: 72 GiB less 65.7 GiB of weights and 2 GiB of reserve
    # leave ~4.3 GiB, 160 KiB a token: ~28k tokens, 21 rollouts of 1024 + 512/2 tokens.
    found = prelaunch(spec, {"tensor_parallel_size": 2, "max_num_seqs": 256})
    capacity = kv_capacity_tokens(GPUS["h100-80gb"], MODELS["llama-3.1-70b"], 2, 0.9, 16)
    assert found.problem is None
    assert found.ceiling == capacity // (1024 + 256) == 21


def _model_dir(tmp_path: Path, heads: int, weights_bytes: int) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    config = {
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "num_hidden_layers": 4,
        "hidden_size": 64 * heads,
        "max_position_embeddings": 4096,
        "dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    with (directory / "model.safetensors").open("wb") as handle:
        handle.truncate(weights_bytes)  # sparse: only its size is read
    return directory


def test_a_vllm_model_directory_gives_the_heads_and_the_weights(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, heads=4, weights_bytes=30 * GiB)
    spec = Study.model_validate(
        {
            "name": "fit",
            "target": {"kind": "vllm", "model": str(model), "args": ["--max-model-len", "2048"]},
        }
    )
    assert prelaunch(spec, {"tensor_parallel_size": 3}, lambda: None).problem == (
        "Total number of attention heads (4) must be divisible by tensor parallel size (3)."
    )
    # Without a GPU to read, memory is not checked: vLLM's own refusal decides.
    assert prelaunch(spec, {"tensor_parallel_size": 1}, lambda: None).problem is None
    small = prelaunch(spec, {"tensor_parallel_size": 1}, lambda: 24 * GiB).problem
    assert small is not None and small.startswith("No available memory for the cache blocks")
    assert prelaunch(spec, {"tensor_parallel_size": 2}, lambda: 24 * GiB).problem is None


async def test_memory_utilisation_alone_is_not_measured_twice_when_the_cache_has_room(
    tmp_path: Path,
) -> None:
    spec = study(
        tmp_path,
        trials=2,
        gpu_memory_utilization={"choices": [0.85, 0.9]},
        max_num_seqs={"choices": [64]},
    )
    optuna_study = open_study(spec, f"sqlite:///{tmp_path / 's.db'}")
    for utilisation in (0.85, 0.9):
        optuna_study.enqueue_trial({"gpu_memory_utilization": utilisation, "max_num_seqs": 64})
    launcher = SeqsLauncher()
    await optimise(spec, optuna_study, launcher)
    # 8B on one H100 holds ~400k tokens of KV cache at either: 64 rollouts need ~60k.
    assert launcher.started == [{"gpu_memory_utilization": 0.85, "max_num_seqs": 64}]
    first, second = trial_records(optuna_study)
    assert second.knobs == {"gpu_memory_utilization": 0.9, "max_num_seqs": 64}
    assert second.probe_s == 0.0 and second.points == first.points
