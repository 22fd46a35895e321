"""A loop study (`objective.metric: trained_samples_per_s`): trials run the RL loop's
trainer stand-in, the mode and its bounds are searched beside the server's knobs, a
staleness limit is a constraint, and the recommendation names the mode with its gain over
the others, validated, in each RL framework's names.

The trainer's step (1.2 s) is slower than a batch's generation (about 0.7 s here), where
the asynchronous mode one step ahead trains about 1.3× the samples/s of the synchronous
one (benchmarks/loop_modes.py), and two steps ahead trains samples two versions old.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.study import load_study
from autotune.results.trials import LoopRecommendation, SweepResult
from autotune.sweep.feasibility import prelaunch
from autotune.sweep.sweep_job import recommend
from tests.helpers import autotune, one_sentence_error
from tests.test_sweep_steps import run_enqueued


def study_file(tmp_path: Path, **overrides: Any) -> Path:
    study: dict[str, Any] = {
        "name": "loop",
        "target": {"kind": "sim", "args": ["--time-scale", "0.5"]},
        "workload": {
            "verifier": "synthetic",
            "num_repeats": 4,
            "synthetic": {"num_tasks": 64, "output_tokens": [200, 0]},
            "loop": {"batch_groups": 4, "steps": 4, "train_s": 1.2, "sync_s": 0.2},
        },
        "search_space": {
            "mode": {"choices": ["sync", "colocated", "async"]},
            "ahead_steps": {"choices": [1, 2]},
            "gpu_memory_utilization": {"choices": [0.45, 0.9]},
        },
        "objective": {"metric": "trained_samples_per_s", "staleness_limit": 1},
        "budget": {"trials": 4},
    }
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        study[section] = {**study.get(section, {}), field: value} if field else value
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.mark.slow
def test_a_loop_study_recommends_the_async_mode_and_validates_it(tmp_path: Path) -> None:
    knobs = [
        {"mode": "sync", "ahead_steps": 1, "gpu_memory_utilization": 0.9},
        {"mode": "colocated", "ahead_steps": 1, "gpu_memory_utilization": 0.45},
        {"mode": "async", "ahead_steps": 1, "gpu_memory_utilization": 0.9},
        {"mode": "async", "ahead_steps": 2, "gpu_memory_utilization": 0.9},
    ]
    # Four trials enqueued, then the search chooses until five are not copies.
    study = study_file(tmp_path, budget={"trials": 5})
    done, result, reports = run_enqueued(study, tmp_path, knobs)
    trials = {t.number: t for t in result.trials}
    assert [trials[n].loop.mode for n in range(4)] == ["sync", "colocated", "async", "async"]
    chosen = [t for t in result.trials[4:] if t.copied_from is None]
    assert len(chosen) == 1 and (chosen[0].loop is not None or chosen[0].infeasible_reason)
    two_ahead = trials[3]
    assert not two_ahead.feasible and "staleness_limit of 1" in (two_ahead.infeasible_reason or "")
    assert two_ahead.loop.staleness_max == 2  # measured, then refused
    rec = recommend(result)
    assert isinstance(rec, LoopRecommendation)
    assert (rec.mode, rec.max_ahead, rec.staleness_max) == ("async", 4, 1)
    assert rec.gain_over_modes["sync"] > 1.2 and rec.gain_over_modes["colocated"] > 1.2
    assert rec.validated is True and rec.validations and rec.validations[0].passed
    assert "--train.async_enable" in rec.snippets.openrlhf
    assert "grpo.async_grpo.max_trajectory_age_steps=1" in rec.snippets.nemo_rl
    assert "async_training.staleness_threshold=1" in rec.snippets.verl
    assert "autotune loop" in rec.snippets.autotune and "--mode async" in rec.snippets.autotune
    assert (reports / "recommendation.json").is_file()
    assert "the best of each other mode" in done.stdout
    page = (reports / "index.html").read_text()
    assert "Recommended: the async loop" in page and "NeMo RL" in page
    assert isinstance(result, SweepResult)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"workload__num_repeats": 1},
            "objective trained_samples_per_s trains on GRPO groups: set workload.num_repeats",
        ),
        (
            {"objective": {"metric": "rollouts_per_s"}},
            "search_space loop settings, workload.loop and objective.staleness_limit act on "
            "the RL loop: set objective.metric: trained_samples_per_s",
        ),
        (
            {"search_space__mode": {"choices": ["sync", "overlap"]}},
            "mode.choices must be some of sync, colocated, async, not ['sync', 'overlap']",
        ),
        (
            {"target": {"kind": "command", "template": "c {parallelism} {output}"}},
            "use kind: sim, server or a launched engine (vllm, sglang, trtllm), not command",
        ),
    ],
    ids=["no-groups", "wrong-metric", "mode-choice", "command"],
)
def test_a_loop_study_that_cannot_run_is_one_sentence(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    path = study_file(tmp_path, **overrides)
    error = one_sentence_error(autotune("sweep", str(path), "--studies-dir", str(tmp_path)))
    assert message in error


def test_a_colocated_trial_leaves_the_trainer_its_share_of_the_gpus(tmp_path: Path) -> None:
    """A colocated engine shares its GPUs with the trainer: above half their memory it is
    infeasible before launch, in one sentence; the other modes have the GPUs to
    themselves."""
    study = load_study(study_file(tmp_path))
    crowded = prelaunch(study, {"mode": "colocated", "gpu_memory_utilization": 0.9})
    assert crowded.problem == (
        "colocated, the engine shares its GPUs with the trainer: gpu_memory_utilization 0.9 "
        "leaves the trainer 10% of their memory, and a colocated engine takes at most 0.5 "
        "(OpenRLHF's hybrid engine gives vLLM half)"
    )
    assert prelaunch(study, {"mode": "colocated", "gpu_memory_utilization": 0.45}).problem is None
    assert prelaunch(study, {"mode": "sync", "gpu_memory_utilization": 0.9}).problem is None
    # Not searched: the target's own flag, else vLLM's default (0.9), is what it would take.
    fixed = load_study(study_file(tmp_path, search_space={"mode": {"choices": ["colocated"]}}))
    assert "gpu_memory_utilization 0.9 " in (prelaunch(fixed, {"mode": "colocated"}).problem or "")
