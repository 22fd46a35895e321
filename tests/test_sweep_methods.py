"""The sweep-methods benchmark (benchmarks/sweep_methods.py): one scoring function for
every method, on any table in InferenceX's format (here one written by the test, whose
best point is known by construction)."""

from __future__ import annotations

import argparse
import csv
import itertools
from pathlib import Path

import pytest

import benchmarks.sweep_methods as methods
from autotune.hardware.measured import KEY_COLUMNS, SurfaceError

CONCURRENCY = (4, 8, 16, 32, 64)


def per_gpu(tp: int, conc: int) -> float:
    """Output tokens/s a GPU: TP 2 scales best per GPU; every TP grows with concurrency."""
    return {1: 40.0, 2: 60.0, 4: 45.0}[tp] * conc**0.8


def write_table(path: Path, images: tuple[str, ...] = ("vllm:v1",)) -> Path:
    columns = [*KEY_COLUMNS, "conc", "median_tpot", "median_ttft", "is_multinode", "disagg",
               "spec_decoding", "output_tput_per_gpu", "median_e2el", "p99_e2el"]  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for image, tp, conc in itertools.product(images, (1, 2, 4), CONCURRENCY):
            median = 10.0 + conc  # seconds a rollout
            writer.writerow(
                    {
                        "hw": "gpu-x", "model": "org/model-y", "framework": "vllm",
                        "precision": "fp8", "image": image, "isl": 512, "osl": 256,
                        "tp": tp, "ep": 1, "conc": conc, "median_tpot": 0.02,
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
