"""The sweep-methods benchmark (benchmarks/sweep_methods.py): one scoring function for
every method, on any table in InferenceX's format (here one written by the test, whose
best point is known by construction)."""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import random
from pathlib import Path

import pytest

import benchmarks.sweep_methods as methods
from autotune.hardware.measured import KEY_COLUMNS, SurfaceError, load_surface, parse_key
from autotune.sweep.curve import SCREEN_LATENCIES

CONCURRENCY = (4, 8, 16, 32, 64)


def per_gpu(tp: int, conc: int) -> float:
    """Output tokens/s a GPU: TP 2 scales best per GPU; every TP grows with concurrency."""
    return {1: 40.0, 2: 60.0, 4: 45.0}[tp] * conc**0.8


def write_table(
    path: Path, images: tuple[str, ...] = ("vllm:v1",), model: str = "org/model-y"
) -> Path:
    columns = [*KEY_COLUMNS, "conc", "median_tpot", "median_ttft", "is_multinode", "disagg",
               "spec_decoding", "output_tput_per_gpu", "median_e2el", "p99_e2el"]  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for image, tp, conc in itertools.product(images, (1, 2, 4), CONCURRENCY):
            median = 10.0 + conc  # seconds a rollout
            writer.writerow(
                    {
                        "hw": "gpu-x", "model": model, "framework": "vllm",
                        "precision": "fp8", "image": image, "isl": 512, "osl": 256,
                        "tp": tp, "ep": 1, "conc": conc, "median_tpot": 0.02 + conc / 1000,
                        "median_ttft": 0.1, "is_multinode": "False", "disagg": "False",
                        "spec_decoding": "none", "output_tput_per_gpu": per_gpu(tp, conc),
                        "median_e2el": median, "p99_e2el": 2 * median,
                    }
                )  # fmt: skip
    return path


def ground(tmp_path: Path, slo: float | None = None, percentile: int = 95) -> methods.Ground:
    args = argparse.Namespace(table=write_table(tmp_path / "runs.csv"), gpus=4, launch_s=100.0)
    bound = methods.Slo(percentile, slo) if slo else None
    return methods.ground_of("test", "hw=gpu-x,model=model-y", bound, args)


def test_the_best_feasible_point_is_the_tables_best_within_the_slo(tmp_path: Path) -> None:
    free = ground(tmp_path)
    knobs, parallelism, best = free.best()
    # TP 2 is the best per GPU; two engines of it at the measured top, 64 each.
    assert knobs == {"num_engines": 2, "tensor_parallel_size": 2} and parallelism == 128
    assert best == pytest.approx(4 * per_gpu(2, 64) / 256)
    # p95 = median · 2^(z95/z99) with p99 = 2·median: a 40 s SLO holds medians ≤ ~24.6 s.
    bound = ground(tmp_path, slo=40.0)
    knobs, parallelism, _ = bound.best()
    assert bound.truth(knobs, parallelism).p95_latency_s <= 40.0
    assert bound.truth(knobs, parallelism + 2).p95_latency_s > 40.0
    # A p99 SLO reads the table's p99 as measured (2·median): a 40 s SLO holds medians ≤ 20 s.
    tail = ground(tmp_path, slo=40.0, percentile=99)
    knobs, parallelism, _ = tail.best()
    assert tail.truth(knobs, parallelism).p99_latency_s <= 40.0
    assert tail.truth(knobs, parallelism + 2).p99_latency_s > 40.0
    assert parallelism < bound.best()[1]


def test_the_truth_is_the_replays_model_of_the_table(tmp_path: Path) -> None:
    """Ground.truth reads the table as the replay target does (MeasuredBlock.at and the
    replay's surface share one interpolation): linear between measured concurrencies, and
    below the lowest every sequence as fast as there."""
    free = ground(tmp_path)
    one = {"num_engines": 1, "tensor_parallel_size": 2}
    between = free.truth(one, 12)  # halfway from 8 to 16: medians 18 s and 26 s
    assert between.median_latency_s == pytest.approx(22.0)
    assert between.rollouts_per_s == pytest.approx(2 * (per_gpu(2, 8) + per_gpu(2, 16)) / 2 / 256)
    below = free.truth(one, 2)  # half the lowest concurrency: latency held, rate halved
    assert below.median_latency_s == pytest.approx(14.0)
    assert below.rollouts_per_s == pytest.approx(2 * per_gpu(2, 4) / 2 / 256)
    surface = load_surface(free.table, parse_key(free.block_key), tp=2)
    for running in (2, 12, 40, 100):
        assert free.block.at(2, running).median_tpot_s == pytest.approx(surface.tpot_at(running))


async def test_every_probe_window_is_the_studys_rule(tmp_path: Path) -> None:
    """A rival's probe (no settings of its own) measures over the study's rung window:
    SCREEN_LATENCIES mean rollout latencies, the mean of the table's log-normal."""
    free = ground(tmp_path)
    knobs = {"num_engines": 2, "tensor_parallel_size": 2}
    probe = methods.Probe(free, knobs, random.Random(0))
    point = await probe.measure(32)
    truth = free.truth(knobs, 32)
    sigma = math.log(truth.p95_latency_s / truth.median_latency_s) / methods.Z95
    mean = truth.median_latency_s * math.exp(sigma**2 / 2)
    assert point.measured_s == pytest.approx(SCREEN_LATENCIES * mean)
    assert probe.spent_s == pytest.approx(truth.median_latency_s + point.measured_s)


def scored(
    figures: dict[str, tuple[float, float, int]],
) -> dict[str, list[tuple[methods.Answer, methods.Score]]]:
    """Each method's one seed from its (share, probe-seconds, launches)."""
    return {
        name: [
            (
                methods.Answer(name, {}, 1, probe_s, launches, 1),
                methods.Score(share, True, probe_s + launches, share),
            )
        ]
        for name, (share, probe_s, launches) in figures.items()
    }


def test_a_guess_as_good_as_the_study_is_its_rival(capsys: pytest.CaptureFixture[str]) -> None:
    guess = "ladder (most engines)"
    rows = scored({"study": (1.0, 1000.0, 4), guess: (1.0, 100.0, 1), "random": (0.5, 50.0, 1)})
    targets = methods.verdict(rows, "study", "b", 100.0)
    # (1,000 + 4 × 100) against the guess's (100 + 1 × 100); random is not as good.
    assert targets[2].measured == pytest.approx(7.0) and not targets[2].passed
    printed = capsys.readouterr().out
    assert "4; the cheapest rival as good: ladder (most engines), 200 s, launches 1" in printed


def test_no_rival_matched_is_not_a_pass(capsys: pytest.CaptureFixture[str]) -> None:
    rows = scored({"study": (1.0, 1000.0, 4), "random": (0.9, 50.0, 1)})
    median, worst, cost = methods.verdict(rows, "study", "b", 100.0)
    assert median.passed and worst.passed
    assert cost.measured is None and not cost.passed and methods.NO_RIVAL in cost.name
    assert "the cheapest rival as good: no rival matched" in capsys.readouterr().out


def test_the_start_up_is_the_blocks_and_the_cost_is_recomputed_for_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big, small = methods.start_up_s("openai/gpt-oss-120b"), methods.start_up_s("Qwen/Qwen2.5-7B")
    assert 120 < big < 600 and 10 < small < 60  # minutes; tens of seconds
    table = write_table(tmp_path / "runs.csv", model="openai/gpt-oss-120b")
    args = argparse.Namespace(table=table, gpus=4, launch_s=None)
    assert methods.ground_of("t", "hw=gpu-x,model=gpt-oss-120b", None, args).launch_s == big
    args = argparse.Namespace(table=write_table(tmp_path / "other.csv"), gpus=4, launch_s=None)
    why = "no profile of model 'org/model-y' to size its start-up by: give --launch-s"
    with pytest.raises(SurfaceError, match=why):
        methods.ground_of("t", "hw=gpu-x,model=model-y", None, args)
    rows = scored({"study": (1.0, 1000.0, 4), "random": (1.0, 500.0, 2)})
    for launch_s in methods.LAUNCH_TIMES:
        cost = methods.verdict(rows, "study", "b", launch_s)[2]
        assert cost.measured == pytest.approx((1000 + 4 * launch_s) / (500 + 2 * launch_s))
    printed = capsys.readouterr().out
    assert all(f"study, start-up {t:g} s: " in printed for t in methods.LAUNCH_TIMES)


def test_score_is_the_truth_at_the_answer_and_the_cost_counts_launches(tmp_path: Path) -> None:
    bound = ground(tmp_path, slo=40.0)
    knobs, parallelism, _ = bound.best()
    exact = methods.score(methods.Answer("m", knobs, parallelism, 50.0, 2, 3), bound)
    assert exact.share == pytest.approx(1.0) and exact.feasible
    assert exact.cost_s == 50.0 + 2 * 100.0
    over = methods.score(methods.Answer("m", knobs, 2 * parallelism, 0.0, 1, 1), bound)
    assert not over.feasible and over.share == 0.0  # a missed SLO scores nothing
    assert over.configuration_share == pytest.approx(1.0)  # though its configuration is best


async def test_every_method_is_scored_by_the_one_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scored: list[str] = []
    real = methods.score

    def spy(answer: methods.Answer, on: methods.Ground) -> methods.Score:
        scored.append(answer.method)
        return real(answer, on)

    monkeypatch.setattr(methods, "score", spy)
    await methods.run_block(ground(tmp_path, slo=40.0), seeds=2)
    answers = {a.method: a for a in await methods.every_method(ground(tmp_path, 40.0), 0, None)}
    names = list(answers)
    # The random search has the study's budget: as many probes as it ran.
    assert answers["random"].measures == answers["study, no seed"].measures > 0
    assert sorted(scored) == sorted(names * 2)  # each method, each seed, through score()
    assert {"study", "study, no seed", "random", "ladder (every TP)", "bisection (most engines)",
            "auto_tune (every TP)"} <= set(names)  # fmt: skip
    printed = capsys.readouterr().out
    assert all(name in printed for name in names)
    # The bar's verdict at the block's start-up, then at each of LAUNCH_TIMES.
    for launch_s in (100.0, *methods.LAUNCH_TIMES):
        assert f"study, no seed, start-up {launch_s:g} s: median" in printed


def test_a_block_the_table_lacks_is_one_sentence(tmp_path: Path) -> None:
    args = argparse.Namespace(table=write_table(tmp_path / "runs.csv"), gpus=4, launch_s=1.0)
    with pytest.raises(SurfaceError, match="with the rest of the key it has hw gpu-x"):
        methods.ground_of("test", "hw=gpu-z,model=model-y", None, args)


async def test_a_block_whose_prior_cannot_be_calibrated_scores_every_other_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sibling block to calibrate on, on a GPU and a model autotune has no profile of:
    one line says why there is no prior row, and every other method is scored."""
    table = write_table(tmp_path / "runs.csv", images=("vllm:v1", "vllm:v2"))
    args = argparse.Namespace(table=table, gpus=4, launch_s=100.0)
    on = methods.ground_of("test", "hw=gpu-x,model=model-y,image=vllm:v2", None, args)
    await methods.run_block(on, seeds=1)
    printed = capsys.readouterr().out
    why = next(line for line in printed.splitlines() if line.startswith("prior:"))
    assert "cannot calibrate one (the table's hw 'gpu-x' names no one GPU profile" in why
    assert why.endswith("no prior row, every other method scored")
    assert "study, no seed" in printed and "bisection (most engines)" in printed
