"""A goodput study (`objective.metric: informative_groups_per_s`): trials run training
steps of GRPO groups, the batch settings are searched beside the server's knobs, a
step-time SLO is a constraint, and the recommendation speaks each RL framework's names.

The simulated policy has a long tail (`--output-length-sigma 1`) and 40% uninformative
groups, where over-sampling is known to pay (benchmarks/groups.py: ×2.8 at R = 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from autotune.config.study import load_study
from autotune.results.runs import BatchSummary
from autotune.results.saved import load_result
from autotune.results.stages import StageLatency
from autotune.results.trials import SweepResult
from autotune.sweep.feasibility import prelaunch, seed_configuration
from autotune.sweep.objectives.goodput import GoodputObjective, batch_spec
from autotune.sweep.search import open_study, storage_url
from tests.helpers import autotune, one_sentence_error

LONG_TAIL = [
    "--time-scale", "0.05", "--output-length-sigma", "1", "--uninformative-share", "0.4",
    "--natural-output-tokens", "128",
]  # fmt: skip


def study_file(tmp_path: Path, **overrides: Any) -> Path:
    study: dict[str, Any] = {
        "name": "goodput",
        "target": {"kind": "sim", "args": LONG_TAIL},
        "workload": {
            "synthetic": {"num_tasks": 64, "output_tokens": [4096, 0]},
            "num_repeats": 4,
            "batch": {"batch_groups": 4},
        },
        "search_space": {"over_sample": {"choices": [0, 1.0]}},
        "objective": {"metric": "informative_groups_per_s"},
        "probe": {"steps": 8},
        "budget": {"trials": 2},
    }
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        if field:
            study[section] = {**study.get(section, {}), field: value}
        else:
            study[section] = value
    path = tmp_path / "goodput.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def run_enqueued(
    path: Path, tmp_path: Path, knobs: list[dict[str, Any]], *args: str
) -> tuple[Any, SweepResult, Path]:
    """The study with its first trials set (TPE's random start may repeat a choice)."""
    spec = load_study(path)
    studies = tmp_path / "studies"
    optuna_study = open_study(spec, storage_url(spec, None, studies))
    for each in knobs:
        optuna_study.enqueue_trial(each)
    reports = tmp_path / "reports"
    done = autotune(
        "sweep", str(path), "--studies-dir", str(studies), "--output-dir", str(reports), *args,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = load_result(reports / "sweep.json")
    assert isinstance(result, SweepResult)
    return done, result, reports


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"workload__num_repeats": 1},
            "objective informative_groups_per_s counts groups whose rewards differ: set "
            "workload.num_repeats to the group size (2 or more)",
        ),
        (
            {"workload__batch": None},
            "objective informative_groups_per_s runs training steps: give "
            "workload.batch.batch_groups or search search_space.batch_groups",
        ),
        (
            {"target": {"kind": "command", "template": "c {parallelism} {output}"}},
            "use kind: sim, server or a launched engine (vllm, sglang, trtllm), not command",
        ),
        (
            {"objective": {"metric": "rollouts_per_s"}},
            "search_space batch settings and objective.max_step_s act on training steps: "
            "set objective.metric: informative_groups_per_s",
        ),
        (
            {"search_space__carry_over": {"choices": ["yes"]}},
            "carry_over.choices must be [true, false] or one of them, not ['yes']",
        ),
    ],
    ids=["no-groups", "no-batch", "command", "wrong-metric", "carry-over-choice"],
)
def test_a_goodput_study_that_cannot_run_is_one_sentence(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    path = study_file(tmp_path, **overrides)
    error = one_sentence_error(autotune("sweep", str(path), "--studies-dir", str(tmp_path)))
    assert message in error


def test_batch_settings_are_drawn_with_the_knobs_but_never_reach_the_server(
    tmp_path: Path,
) -> None:
    study = load_study(
        study_file(
            tmp_path,
            search_space={
                "max_num_seqs": {"choices": [8, 64]},
                "batch_groups": {"low": 2, "high": 8},
                "over_sample": {"low": 0.0, "high": 1.0},
                "carry_over": {"choices": [True, False]},
            },
        )
    )
    seed = seed_configuration(study)
    assert seed is not None
    assert set(seed) == {"max_num_seqs", "batch_groups", "over_sample", "carry_over"}
    known = prelaunch(study, seed)
    assert known.problem is None and known.ceiling == 64  # the simulator took max_num_seqs
    spec = batch_spec(study, {"max_num_seqs": 8, "batch_groups": 6, "carry_over": True})
    assert (spec.batch_groups, spec.over_sample, spec.carry_over) == (6, 0.0, True)


def summary(over_sample: float, carry_over: bool) -> BatchSummary:
    return BatchSummary(
        batch_groups=8, over_sample=over_sample, carry_over=carry_over, capacity=48,
        busy_source="server", steps=[], step_s=StageLatency(0, None, None, None),
        tail_share=None, busy_share=None, informative_groups_per_s=1.0,
        cancelled_samples=0, cancelled_tokens=None, staleness_mean=None, staleness_max=None,
    )  # fmt: skip


def test_the_snippets_name_each_frameworks_own_flags() -> None:
    both = GoodputObjective().snippets("m", {"max_num_seqs": 64}, 4, summary(0.5, True))
    assert both.openrlhf == (
        "--rollout.n_samples_per_prompt 4 --rollout.batch_size 8 "
        "--algo.dynamic_filtering_enable --train.async_enable --train.partial_rollout_enable"
    )
    assert both.verl == (
        "actor_rollout_ref.rollout.n=4 data.train_batch_size=8 "
        "algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc "
        "data.gen_batch_size=12 async_training.partial_rollout=True"
    )
    assert both.slime == (
        "--n-samples-per-prompt 4 --rollout-batch-size 8 --over-sampling-batch-size 12 "
        "--dynamic-sampling-filter-path "
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std "
        "--partial-rollout"
    )
    assert both.serve == "vllm serve m --max-num-seqs 64"
    assert both.autotune == (
        "autotune collect --num-repeats 4 --batch-groups 8 --over-sample 0.5 --carry-over"
    )
    plain = GoodputObjective().snippets(None, {}, 4, summary(0.0, False))
    assert plain.openrlhf == "--rollout.n_samples_per_prompt 4 --rollout.batch_size 8"
    assert plain.verl == "actor_rollout_ref.rollout.n=4 data.train_batch_size=8"
    assert plain.slime == "--n-samples-per-prompt 4 --rollout-batch-size 8"


@pytest.mark.slow
@pytest.mark.measures
def test_a_goodput_study_recommends_over_sampling_where_it_trains_more(tmp_path: Path) -> None:
    done, result, reports = run_enqueued(
        study_file(tmp_path), tmp_path, [{"over_sample": 0}, {"over_sample": 1.0}], "--json"
    )
    plain, over = sorted(result.completed, key=lambda t: t.knobs["over_sample"])
    assert plain.batch is not None and over.batch is not None
    assert (over.value or 0) >= 1.25 * (plain.value or 0), (plain.value, over.value)
    assert over.batch.cancelled_samples > 0 and plain.batch.cancelled_samples == 0
    assert len(plain.batch.steps) == 8 and plain.points == []
    recommended = orjson.loads(done.stdout)
    assert recommended["over_sample"] == 1.0 and recommended["batch_groups"] == 4
    assert recommended["informative_groups_per_s"] == over.value
    assert recommended["validated"] is True, recommended["validations"]
    assert "data.gen_batch_size=8" in recommended["snippets"]["verl"]
    saved = orjson.loads((reports / "recommendation.json").read_bytes())
    assert saved == recommended
    header = (reports / "trials.csv").read_text().splitlines()[0].split(",")
    assert {"over_sample", "step_p95_s", "busy_pct", "cancelled_tokens"} <= set(header)
    page = (reports / "index.html").read_text()
    assert "informative groups/s" in page and "algorithm.filter_groups.enable=True" in page


@pytest.mark.slow
@pytest.mark.measures
def test_a_step_time_slo_rules_out_the_batch_whose_stragglers_take_too_long(
    tmp_path: Path,
) -> None:
    """32 groups of 4 wait for the slowest of 128 long-tailed samples, 1 group for the
    slowest of 4: the bigger batch has several times the goodput and steps about three
    times longer (p95 1.1 s against 0.35 s here), so an SLO between them decides."""
    slo = 0.6
    path = study_file(
        tmp_path,
        workload={"synthetic": {"num_tasks": 64, "output_tokens": [4096, 0]}, "num_repeats": 4},
        search_space={"batch_groups": {"choices": [1, 32]}},
        objective={"metric": "informative_groups_per_s", "max_step_s": slo},
        budget={"trials": 2, "validate_rollouts": 0},
    )
    done, result, _ = run_enqueued(
        path, tmp_path, [{"batch_groups": 1}, {"batch_groups": 32}], "--json"
    )
    small, large = sorted(result.completed, key=lambda t: t.knobs["batch_groups"])
    assert small.batch is not None and large.batch is not None
    assert (large.value or 0) > (small.value or 0)
    for trial in (small, large):
        assert trial.batch is not None
        assert trial.feasible == ((trial.batch.step_s.p95 or 0) <= slo), trial.batch.step_s
    assert small.feasible and not large.feasible
    recommended = orjson.loads(done.stdout)
    assert recommended["batch_groups"] == 1 and recommended["max_step_s"] == slo
