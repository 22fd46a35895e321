"""A study that spends a GPU budget (issue 13): how the GPUs split into engines × TP, the
prefix-caching switch, the replicas a configuration starts, the roofline share, and a
simulated GRPO study that recommends prefix caching on the gain it measured."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
from pathlib import Path
from typing import Any

import optuna
import orjson
import psutil
import pytest

from autotune.config.study import Study, load_study
from autotune.errors import UsageError
from autotune.hardware.profiles import GPUS, MODELS
from autotune.hardware.roofline import roofline
from autotune.probe import ProbeSettings
from autotune.probe.launchers import http_launcher
from autotune.probe.virtual import VirtualSimLauncher
from autotune.report.sweep_report import split_rows
from autotune.report.terminal import sweep_text
from autotune.results.probes import CurvePoint
from autotune.results.trials import SweepResult, TrialRecord
from autotune.sweep.feasibility import (
    knobs_of,
    parameters,
    prelaunch,
    roofline_share,
    seed_configuration,
    splits,
)
from autotune.sweep.objectives import objective_for
from autotune.sweep.recommend import recommendation
from autotune.sweep.search import check_space, suggest_knobs
from autotune.sweep.sweep_job import run_sweep, write_outputs
from autotune.verifiers import load_verifier
from tests.helpers import SIM_FAST, autotune

H100 = ["--gpu", "h100-80gb"]
PROMPT, OUTPUT = (1024, 128), (128, 32)


def budget(model: str = "llama-3.1-8b", gpus: int = 8, repeats: int = 8, **more: Any) -> Study:
    spec: dict[str, Any] = {
        "name": "budget",
        "target": {"kind": "sim", "args": [*H100, "--model", model]},
        "resources": {"gpus": gpus},
        "workload": {
            "num_repeats": repeats,
            "synthetic": {"prompt_tokens": list(PROMPT), "output_tokens": list(OUTPUT)},
        },
        "search_space": {
            "parallelism": {"low": 8, "high": 2048},
            "max_num_seqs": {"choices": [64, 256]},
            "enable_prefix_caching": {"choices": [True, False]},
        },
    }
    spec.update(more)
    return Study.model_validate(spec)


# -- the search space ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "gpus", "expected"),
    [
        ("llama-3.1-8b", 8, ["8x1", "4x2", "2x4", "1x8"]),
        ("llama-3.1-70b", 8, ["4x2", "2x4", "1x8"]),  # 141 GB of weights need TP 2 at least
        ("qwen2.5-7b", 8, ["8x1", "4x2", "2x4"]),  # 28 heads: no TP 8; 4 KV heads: no TP 7
        ("llama-3.1-8b", 6, ["6x1", "3x2", "1x4"]),  # 1 × TP 4 leaves 2 GPUs unused
    ],
)
def test_splits_spend_the_budget_on_sizes_the_model_can_be_sharded_over(
    model: str, gpus: int, expected: list[str]
) -> None:
    found = splits(budget(model, gpus))
    assert [split.name for split in found] == expected
    profile = MODELS[model]
    for split in found:
        assert split.engines * split.tp <= gpus
        assert profile.attention_heads % split.tp == 0
        assert profile.kv_heads % split.tp == 0 or split.tp % profile.kv_heads == 0


def test_the_sampler_draws_one_split_and_the_caching_switch() -> None:
    study = budget()
    space = parameters(study)
    assert list(space) == ["split", "max_num_seqs", "enable_prefix_caching"]
    assert space["enable_prefix_caching"].choices == [True, False]  # type: ignore[union-attr]
    drawn = optuna.trial.FixedTrial(
        {"split": "4x2", "max_num_seqs": 64, "enable_prefix_caching": False}
    )
    assert suggest_knobs(drawn, study, 0) == {
        "num_engines": 4,
        "tensor_parallel_size": 2,
        "max_num_seqs": 64,
        "enable_prefix_caching": False,
    }


def test_a_split_holds_every_engines_requests_and_the_first_trial_uses_the_most() -> None:
    study = budget()
    one = prelaunch(study, {"tensor_parallel_size": 2, "max_num_seqs": 64})
    four = prelaunch(study, knobs_of({"split": "4x2", "max_num_seqs": 64}))
    assert one.ceiling == 64 and four.ceiling == 4 * 64
    assert seed_configuration(study) == {
        "split": "8x1",
        "max_num_seqs": 256,
        "enable_prefix_caching": True,
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("resources: {gpus: 0}\n", "resources.gpus: must be a whole number of at least 1, not 0"),
        ("resources: {gpus: 8, replicas: dp}\n", "must be servers or data-parallel, not 'dp'"),
        (
            "resources: {gpus: 8}\nsearch_space: {tensor_parallel_size: {choices: [2, 16]}}\n",
            "choices holds 16, more than resources.gpus (8)",
        ),
        (
            "search_space: {enable_prefix_caching: {choices: [1, 0]}}\n",
            "enable_prefix_caching.choices must be [true, false] or one of them, not [1, 0]",
        ),
        ("workload: {num_repeats: 0}\n", "workload.num_repeats: must be a whole number"),
        ("resources: {gpus: 8, gpu: h200}\n", "the simulator takes its own as --gpu"),
        (
            "target: {kind: server, base_url: 'http://h:8000/v1'}\nresources: {gpus: 8}\n",
            "no GPUs can be split into engines",
        ),
    ],
)
def test_study_file_mistakes_are_one_sentence(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "study.yaml"
    target = "" if text.startswith("target") else "target: {kind: sim}\n"
    path.write_text(f"name: bad\n{target}{text}")
    with pytest.raises(UsageError) as caught:
        load_study(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"search_space": {"tensor_parallel_size": {"choices": [1, 3]}}},
            "search_space.tensor_parallel_size.choices holds 3, which cannot shard "
            "llama-3.1-8b (Total number of attention heads (32) must be divisible by tensor "
            "parallel size (3)); choose from 1, 2, 4, 8.",
        ),
        (
            {
                "target": {"kind": "vllm", "model": "m"},
                "resources": {"gpus": 8, "gpu": "h100-80gb", "model_profile": "llama-4"},
            },
            "resources.model_profile 'llama-4' is not a known profile; name one of "
            f"{', '.join(MODELS)}, or leave it out.",
        ),
        (
            {
                "target": {"kind": "vllm", "model": "m"},
                "resources": {"gpus": 1, "gpu": "l40s", "model_profile": "llama-3.1-70b"},
            },
            "no tensor-parallel size of resources.gpus (1) fits llama-3.1-70b (tried 1)",
        ),
    ],
)
def test_a_budget_the_model_cannot_use_is_refused_before_anything_starts(
    spec: dict[str, Any], message: str
) -> None:
    study = budget(**spec)
    with pytest.raises(UsageError) as caught:
        check_space(study, 0)
    assert message in str(caught.value)


# -- the replicas a configuration starts ------------------------------------------------------


def _sims(besides: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """This test process's simulated servers, but those in `besides` (servers other
    tests of the session keep running, such as a session-scoped fixture's)."""
    return [
        child
        for child in psutil.Process().children(recursive=True)
        if child.pid not in besides and "autotune.servers.sim" in " ".join(child.cmdline())
    ]


@pytest.mark.parametrize(("replicas", "servers"), [("servers", 2), ("data-parallel", 1)])
async def test_the_simulator_runs_every_engine_and_stops_them_all(
    replicas: str, servers: int
) -> None:
    study = Study.model_validate(
        {
            "name": "replicas",
            "target": {"kind": "sim", "args": list(SIM_FAST)},
            "resources": {"gpus": 2, "replicas": replicas},
            "workload": {"verifier": "none", "synthetic": {"output_tokens": [16, 4]}},
            "probe": {"warmup_s": 0.2, "min_s": 0.5, "max_s": 2.0},
        }
    )
    verifier = await load_verifier("none")
    launcher = http_launcher(study, verifier)
    knobs = {"num_engines": 2, "tensor_parallel_size": 1, "max_num_seqs": 16}
    before = frozenset(process.pid for process in _sims())
    try:
        async with launcher.running(knobs) as probe:
            running = _sims(before)
            assert len(running) == servers
            if servers == 1:
                assert "--data-parallel-size 2" in " ".join(running[0].cmdline())
            assert (await probe.measure(8)).completed > 0
    finally:
        await verifier.aclose()
    await asyncio.sleep(0)
    assert _sims(before) == [], "a replica outlived its configuration"


# -- the roofline share and a simulated GRPO study ------------------------------------------


def _roof(cached: float) -> float:
    """The roofline of 4 engines × TP 2 of the 8B model on H100s for the study's lengths."""
    model, gpu = MODELS["llama-3.1-8b"], GPUS["h100-80gb"]
    found = roofline(gpu, model, 2, 4, PROMPT[0], OUTPUT[0], cached_prompt_share=cached)
    return found.output_tokens_per_s


def test_the_roofline_reads_the_caches_share_from_the_server_else_from_the_groups() -> None:
    study = budget()
    knobs = {"num_engines": 4, "tensor_parallel_size": 2, "enable_prefix_caching": True}
    point = CurvePoint(256, 100.0, 12800.0, 0.0, 2.0, 10.0, "precision")
    # Groups of 8: all but the first rollout find the prompt's whole blocks cached.
    grouped = _roof(7 / 8 * (PROMPT[0] // 16 * 16) / PROMPT[0])
    assert roofline_share(study, knobs, [point]) == pytest.approx((grouped, 12800.0 / grouped))
    hits = dataclasses.replace(point, prefix_cache_hit_share=0.5)  # what the server counted
    assert roofline_share(study, knobs, [hits])[0] == pytest.approx(_roof(0.5))
    off = {**knobs, "enable_prefix_caching": False}
    assert roofline_share(study, off, [point])[0] == pytest.approx(_roof(0.0))
    # An accelerated simulator's probes run on the wall clock: so does its ceiling.
    faster = budget(target={"kind": "sim", "args": [*H100, "--time-scale", "0.05"]})
    assert roofline_share(faster, knobs, [point]) == pytest.approx(
        (20 * grouped, 12800.0 / grouped / 20)
    )
    from_file = budget(workload={"input": "tasks.jsonl"})  # its lengths are not known
    assert roofline_share(from_file, knobs, [point]) == (None, None)


async def test_grpo_groups_on_the_simulator_recommend_prefix_caching_on_the_measured_gain(
    tmp_path: Path,
) -> None:
    """Groups of 8 rollouts sharing each prompt, on 4 simulated H100s, in virtual time:
    the recommendation turns caching on, and the report shows what it bought (both
    curves measured in full at the recommended split) and the roofline share."""
    study = budget(
        gpus=4,
        search_space={
            "parallelism": {"low": 8, "high": 2048},
            "enable_prefix_caching": {"choices": [True, False]},
        },
        budget={"trials": 6, "validate_rollouts": 0},
    )
    args = [*H100, "--model", "llama-3.1-8b"]
    launcher = VirtualSimLauncher(args, ProbeSettings(1), PROMPT, OUTPUT, seed=0, num_repeats=8)
    result = await run_sweep(study, storage=f"sqlite:///{tmp_path / 's.db'}", launcher=launcher)
    rec = recommendation(result)
    assert rec is not None and rec.enable_prefix_caching is True
    gain = rec.prefix_caching
    assert gain is not None and gain.split == f"{rec.engines}x{rec.tensor_parallel_size}"
    assert gain.gain > 1.3, gain  # 7 of 8 prefills of a 1,024-token prompt are saved
    measured = [t for t in result.completed if t.points]
    assert measured and all(0 < (t.roofline_share or 0) <= 1 for t in measured)
    assert rec.roofline_share == result.best().roofline_share  # type: ignore[union-attr]

    write_outputs(result, tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert f"{rec.roofline_share:.0%} of the hardware" in page
    assert "GPU splits" in page and f"×{gain.gain:.2f}" in page
    with (tmp_path / "report" / "trials.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert all(row["roofline_pct"] for row in rows if row["state"] == "COMPLETE")
    text = sweep_text(result, rec, tmp_path / "report", objective_for(result.metric))
    assert f"{rec.roofline_share:.0%} of the hardware's roofline" in text
    assert f"prefix caching       on (measured at {gain.split}" in text
    assert "--vllm.enable_prefix_caching" in text and "--data-parallel-size" in text


async def test_engines_share_one_clock_and_a_groups_rollouts_mostly_share_an_engine() -> None:
    """Two engines at twice the parallelism make twice the rollouts of one (one virtual
    clock, calls balanced); with groups of 8, most of a group's rollouts land on the
    engine that cached its prompt (the router's affinity), and without caching none is
    found in a cache."""
    args = [*H100, "--model", "llama-3.1-8b"]
    single = VirtualSimLauncher(args, ProbeSettings(1), PROMPT, OUTPUT, seed=0)
    async with single.running({"max_num_seqs": 64}) as probe:
        one = await probe.measure(64)
    async with single.running({"num_engines": 2, "max_num_seqs": 64}) as probe:
        two = await probe.measure(128)
    assert two.rollouts_per_s == pytest.approx(2 * one.rollouts_per_s, rel=0.05)
    groups = dataclasses.replace(single, num_repeats=8)
    async with groups.running({"num_engines": 2, "max_num_seqs": 64}) as probe:
        cached = CurvePoint.of(await probe.measure(128)).prefix_cache_hit_share
    assert cached is not None and 0.6 < cached < 7 / 8
    off = {"num_engines": 2, "max_num_seqs": 64, "enable_prefix_caching": False}
    async with groups.running(off) as probe:
        assert CurvePoint.of(await probe.measure(128)).prefix_cache_hit_share is None


def test_the_split_table_ranks_whole_curves_and_marks_those_stopped_early() -> None:
    def trial(number: int, value: float, state: str = "COMPLETE", **knobs: Any) -> TrialRecord:
        return TrialRecord(number, state, value, True, knobs, roofline_share=value / 1000)

    result = SweepResult(
        "s", 0.0, 0.0, True, "sqlite://", 0, "rollouts_per_s", 0.05, None, {},
        [
            trial(0, 500.0, num_engines=8, tensor_parallel_size=1, enable_prefix_caching=True),
            trial(1, 300.0, num_engines=8, tensor_parallel_size=1, enable_prefix_caching=False),
            trial(2, 600.0, "PRUNED", num_engines=1, tensor_parallel_size=8),
            trial(3, 400.0, num_engines=4, tensor_parallel_size=2, enable_prefix_caching=True),
        ],
        {}, {},
    )  # fmt: skip
    rows = split_rows(result)
    assert [(r.split, r.value, r.whole) for r in rows] == [
        ("8x1", 500.0, True),
        ("4x2", 400.0, True),
        ("1x8", 600.0, False),  # the most it measured before it was stopped
    ]
    assert (rows[0].caching_on, rows[0].caching_off, rows[0].roofline_share) == (500, 300, 0.5)
    assert rows[1].caching_off is None


GRPO_STUDY = """
name: grpo
target:
  kind: sim
  args: [--gpu, h100-80gb, --model, llama-3.1-8b, --time-scale, "0.25"]
resources: {gpus: 2}
workload:
  synthetic: {num_tasks: 100, prompt_tokens: [1024, 128], output_tokens: [64, 16]}
search_space:
  parallelism: {low: 16, high: 512}
  max_num_seqs: {choices: [64]}
  enable_prefix_caching: {choices: [true, false]}
probe: {min_s: 1, max_s: 4}
budget: {trials: 4, validate_rollouts: 0}
"""


@pytest.mark.slow
def test_sweep_with_num_repeats_8_over_http_recommends_caching_on_its_measured_gain(
    tmp_path: Path,
) -> None:
    """`autotune sweep STUDY --num-repeats 8` against launched simulated replicas: a
    study of its own (NAME-x8), prefix caching recommended on, the gain measured."""
    study = tmp_path / "grpo.yaml"
    study.write_text(GRPO_STUDY)
    result = autotune(
        "sweep", str(study), "--num-repeats", "8", "--studies-dir", str(tmp_path / "studies"),
        "--output-dir", str(tmp_path / "report"), "--json", "--quiet", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rec = orjson.loads(result.stdout)
    assert (tmp_path / "studies" / "grpo-x8.db").exists()  # apart from grpo's own trials
    assert rec["enable_prefix_caching"] is True
    gain = rec["prefix_caching"]
    assert gain["split"] == f"{rec['engines']}x{rec['tensor_parallel_size']}"
    assert gain["on"] > 1.5 * gain["off"]  # 7 of 8 prefills of 1,024 tokens saved
    assert "--vllm.enable_prefix_caching" in rec["snippets"]["openrlhf"]
    page = (tmp_path / "report" / "index.html").read_text()
    assert "GPU splits" in page
