"""A sweep's objectives are one protocol (sweep/objectives): the job, the search and the
report ask the objective, so a new one is a module and one line of OBJECTIVES."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.config.study import Study
from autotune.errors import UsageError
from autotune.probe import ProbeSettings
from autotune.probe.virtual import VirtualSimLauncher
from autotune.report.terminal import sweep_text, trial_line
from autotune.sweep.objectives import OBJECTIVES, objective_for
from autotune.sweep.search import open_study
from autotune.sweep.sweep_job import recommend, run_sweep, write_outputs
from tests.objectives.first_rung import FirstRungObjective

ARGS = ["--gpu", "h100-80gb", "--model", "llama-3.1-8b"]


def test_an_unknown_metric_is_one_sentence_naming_the_objectives() -> None:
    with pytest.raises(UsageError, match="names no objective; use one of rollouts_per_s") as info:
        objective_for("rollout_per_s")
    assert "trained_samples_per_s" in str(info.value)


async def test_a_fourth_objective_is_one_module_and_one_registry_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(OBJECTIVES, "first_rung_tokens_per_s", FirstRungObjective())
    study = Study.model_validate(
        {
            "name": "first-rung",
            "target": {"kind": "sim", "args": ARGS},
            "search_space": {
                "parallelism": {"low": 8, "high": 64},
                "max_num_seqs": {"choices": [1, 64]},
            },
            "objective": {"metric": "first_rung_tokens_per_s"},
            "budget": {"trials": 2},
        }
    )
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    for seqs in (1, 64):  # both configurations, whatever the sampler would draw
        open_study(study, storage).enqueue_trial({"max_num_seqs": seqs})
    launcher = VirtualSimLauncher(ARGS, ProbeSettings(1), (256, 64), (128, 32), seed=0)
    lines: list[str] = []
    objective = objective_for("first_rung_tokens_per_s")
    result = await run_sweep(
        study,
        storage=storage,
        launcher=launcher,
        on_trial=lambda number, outcome: lines.append(trial_line(number, outcome, objective)),
    )
    values = {t.knobs["max_num_seqs"]: t.value for t in result.completed}
    assert set(values) == {1, 64}
    assert values[64] > 4 * values[1]  # eight clients on one slot against on 64
    assert all("output tokens/s on the first rung" in line for line in lines)

    written = write_outputs(result, tmp_path / "report")
    saved = json.loads((tmp_path / "report" / "recommendation.json").read_text())
    assert saved["server"] == {"max_num_seqs": 64}
    assert saved["parallelism"] == 8
    assert saved["output_tokens_per_s"] == pytest.approx(values[64])
    page = (tmp_path / "report" / "index.html").read_text()
    assert "First rung" in page and "Best first rung:" in page
    assert "Throughput versus parallelism" not in page  # the curve objective's, not this one's
    assert tmp_path / "report" / "index.html" in written
    summary = sweep_text(result, recommend(result), tmp_path / "report", objective)
    assert "first rung           " in summary
