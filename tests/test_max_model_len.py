"""vLLM's max_model_len, one knob end to end: the simulator's flag, a study's search space,
a bench suite's server_args, the fit check before launch, and the recommendation's
`vllm serve` line. It was added by one ServerKnobs field and one SearchSpace field
(config.py) and the fit check (hardware/fit.py); everything else reads the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.bench.suite import load_suite
from autotune.config.knobs import KNOBS
from autotune.config.study import Study
from autotune.engines.known import VLLM
from autotune.errors import UsageError
from autotune.hardware.deployment import SimConfig, SimConfigError
from autotune.hardware.fit import batch_fit
from autotune.sweep.feasibility import parameters, prelaunch
from autotune.sweep.recommend import openrlhf_flags, serve_line
from autotune.sweep.search import open_study, optimise, trial_records
from tests.test_sweep_search import SeqsLauncher


def _study(prompt: int, output: int, **space: object) -> Study:
    return Study.model_validate(
        {
            "name": "context",
            "target": {"kind": "sim", "args": ["--model", "llama-3.1-8b"]},
            "workload": {"synthetic": {"prompt_tokens": [prompt, 0], "output_tokens": output}},
            "search_space": {"parallelism": {"low": 4, "high": 64}, **space},
            "budget": {"trials": 3},
        }
    )


def test_the_simulator_starts_with_the_tables_default_and_refuses_what_vllm_refuses() -> None:
    assert SimConfig.from_args([]).max_model_len == KNOBS.max_model_len == 8192
    assert SimConfig.from_args(["--max-model-len", "4096"]).max_model_len == 4096
    # llama-3.1-8b's context is 131,072 tokens: vLLM refuses a longer max_model_len.
    with pytest.raises(SimConfigError, match=r"max_model_len \(200000\) is outside"):
        SimConfig.from_args(["--max-model-len", "200000"])


def test_the_fit_check_bounds_each_sequence_by_max_model_len() -> None:
    lengths = ((1000, 100), (500, 100))  # longest rollout: 1000 + 300 + 500 + 300 = 2100
    too_short = batch_fit(lengths, {"max_num_seqs": 64, "max_model_len": 1400}, 128_000)
    assert too_short.problem is not None
    assert too_short.problem.startswith("a mean rollout (1000 prompt + 500 output tokens)")
    # 64 sequences of at most 2,000 tokens fill 128,000 exactly: the cache has room...
    bounded = batch_fit(lengths, {"max_num_seqs": 64, "max_model_len": 2000}, 128_000)
    assert bounded.problem is None and bounded.cache_to_spare
    # ... which 64 of 2,100 tokens (no bound below the longest rollout) would not have.
    unbounded = batch_fit(lengths, {"max_num_seqs": 64, "max_model_len": 4096}, 128_000)
    assert not unbounded.cache_to_spare
    # The batch: 128,000 ÷ (1000 + 500/2) = 102 sequences, capped by max_num_seqs.
    assert bounded.ceiling == unbounded.ceiling == 64
    assert batch_fit(lengths, {"max_num_seqs": 256}, 128_000).ceiling == 102


async def test_a_study_searches_it_and_a_configuration_too_short_is_never_launched(
    tmp_path: Path,
) -> None:
    spec = _study(
        1000, 256, max_model_len={"choices": [1024, 4096]}, max_num_seqs={"low": 8, "high": 64}
    )
    assert "max_model_len" in parameters(spec)
    refused = prelaunch(spec, {"max_model_len": 1024, "max_num_seqs": 64})
    assert refused.problem is not None and "longer than max_model_len (1024)" in refused.problem
    assert prelaunch(spec, {"max_model_len": 4096, "max_num_seqs": 64}).problem is None
    optuna_study = open_study(spec, f"sqlite:///{tmp_path / 's.db'}")
    optuna_study.enqueue_trial({"max_model_len": 4096, "max_num_seqs": 64})
    optuna_study.enqueue_trial({"max_model_len": 1024, "max_num_seqs": 64})
    launcher = SeqsLauncher()
    await optimise(spec, optuna_study, launcher)
    assert [knobs["max_model_len"] for knobs in launcher.started] == [4096]
    rejected = next(r for r in trial_records(optuna_study) if r.knobs["max_model_len"] == 1024)
    assert not rejected.feasible and rejected.infeasible_reason is not None
    assert "raise max_model_len" in rejected.infeasible_reason


def test_a_suite_sets_it_on_the_simulator_and_refuses_a_bad_value(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("cases: [{name: a, parallelism: 4, server_args: {max_model_len: 2048}}]\n")
    (case,) = load_suite(suite).cases
    flags = case.collect.target.sim_args  # type: ignore[attr-defined]
    assert flags[flags.index("--max-model-len") + 1] == "2048"
    suite.write_text("cases: [{name: a, parallelism: 4, server_args: {max_model_len: 0}}]\n")
    with pytest.raises(UsageError, match=r"server_args\.max_model_len must be a whole number"):
        load_suite(suite)


def test_the_recommendation_writes_it_for_vllm_and_not_for_openrlhf() -> None:
    knobs: dict[str, object] = {"max_model_len": 4096, "max_num_seqs": 64}
    assert serve_line(VLLM, "m", knobs) == "vllm serve m --max-model-len 4096 --max-num-seqs 64"
    # OpenRLHF sizes vLLM's context from its own prompt and generation lengths: no flag
    # of its names max_model_len, so its line leaves it out.
    assert openrlhf_flags(knobs) == ""
