"""`autotune doctor`: real RL runs' logs read figure for figure (../shared/data/rlruns),
metrics files and exports of longer runs, the steady state and the bound, the verl
one-step-off table predicted from its synchronous rows, and bad logs refused in one
sentence."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from autotune.doctor.anatomy import dissect
from autotune.doctor.doctor_job import doctor
from autotune.doctor.formats import read_run, read_runs
from autotune.doctor.remedies import Setup
from autotune.results.doctor import DoctorResult
from autotune.results.saved import load_result
from tests.browser import render
from tests.helpers import autotune, one_sentence_error

# Each file's own figures, as its text prints them (the rows its framework logged).
EXPECTED: dict[str, tuple[str, list[dict[str, float]]]] = {
    "verl_pyinfsched_gsm8k.log": ("verl console log", [{
        "timing_s/step": 93.52434759191237, "timing_s/gen": 24.533394969068468,
        "timing_s/reward": 3.863382153213024e-05, "timing_s/old_log_prob": 13.635552056133747,
        "timing_s/ref": 12.547897297888994, "timing_s/adv": 0.17872913694009185,
        "timing_s/update_actor": 35.83383133285679, "timing_s/update_weights": 5.458046867046505,
        "response_length/mean": 424.5494384765625, "response_length/max": 1024.0,
        "response_length/clip_ratio": 0.07373046875,
        "timing_s/agent_loop/slowest/generate_sequences": 20.618110499111935,
        "timing_s/agent_loop/generate_sequences/mean": 8.733964191658202,
    }]),
    "verl_gh200_sglang_qwen0.5b_issue1208.log": ("verl console log", [{
        "timing_s/gen": 74.020, "timing_s/old_log_prob": 3.566, "timing_s/ref": 3.420,
        "timing_s/adv": 1.167, "timing_s/update_actor": 14.302, "timing_s/step": 96.551,
        "response_length/mean": 324.958, "response_length/max": 1024.0,
        "response_length/clip_ratio": 0.004,
    }]),
    "verl_issue2009_v030_vs_v040_avg.log": ("verl console log", [
        {"timing_s/gen": 81.85025, "timing_s/old_log_prob": 56.87424999999999,
         "timing_s/ref": 54.18241666666666, "timing_s/update_actor": 151.79700000000003,
         "timing_s/step": 348.087},
        {"timing_s/gen": 70.84241666666667, "timing_s/old_log_prob": 74.38166666666667,
         "timing_s/ref": 71.17658333333333, "timing_s/update_actor": 167.71325000000002,
         "timing_s/step": 387.78775},
    ]),
    "verl_ascend910b_qwen0.5b_issue6747.log": (
        "verl console log", [{"timing_s/step": 43.64, "timing_s/gen": 31.27}]
    ),
    "slime_qwen3-0.6b_gsm8k_issue385.log": ("slime console log", [{
        "perf/rollout_time": 245.61117100715637, "perf/total_train_time": 287.2645092010498,
    }]),
    "nemorl_async_grpo_pr1052.log": ("nemo_rl console log", [{
        "Total step time": 66.55, "exposed_generation": 32.52, "policy_training": 25.05,
        "policy_and_reference_logprobs": 4.78, "buffer_sampling": 1.38,
        "logprob_inference_prep": 1.34, "training_prep": 1.06, "data_processing": 0.23,
        "weight_sync": 0.13,
    }]),
    "trl_openr1_grpo_8xa100_issue161.log": ("trl console log", [{
        "train_runtime_per_step": 281.24, "completion_length": 827.9754867553711,
    }]),
}  # fmt: skip
TABLE = "table_verl_one_step_off.md"
TABLE_ROWS = [  # step, gen, wait_prev_gen, generate_sequences, old_log_prob, update_actor
    (749, 321, None, 247, 88, 286),
    (520, None, 45, 458, 108, 337),
    (699, 207, None, 162, 119, 344),
    (566, None, 59, 501, 120, 347),
]


def test_every_shared_run_is_read_figure_for_figure(rl_runs: Path) -> None:
    assert {path.name for path in rl_runs.iterdir()} == {*EXPECTED, TABLE, "README.md"}
    for name, (kind, steps) in EXPECTED.items():
        run = read_run(rl_runs / name)
        assert run.format == kind, name
        for step, expected in zip(run.steps, steps, strict=True):
            for metric, value in expected.items():
                assert step.values[metric] == value, (name, metric)
    slime = read_run(rl_runs / "slime_qwen3-0.6b_gsm8k_issue385.log")
    assert "verl" in slime.notes[0]  # the verl run the issue quotes is not this run's step
    names = ("step", "gen", "wait_prev_gen", "generate_sequences", "old_log_prob", "update_actor")
    runs = read_runs(rl_runs / TABLE)
    assert len(runs) == len(TABLE_ROWS)
    for run, row in zip(runs, TABLE_ROWS, strict=True):
        pairs = zip(names, row, strict=True)
        expected = {f"timing_s/{name}": float(v) for name, v in pairs if v is not None}
        assert run.steps[0].values == expected
    assert "colocate sync, VLLM+FSDP2" in runs[0].source


def test_each_phase_of_a_shared_run_adds_up_to_its_step(rl_runs: Path) -> None:
    anatomy = dissect(read_run(rl_runs / "verl_pyinfsched_gsm8k.log"))
    phases = {figure.phase: figure.mean_s for figure in anatomy.phases}
    assert phases["generation"] == pytest.approx(24.533394969068468)
    assert phases["logprobs"] == pytest.approx(13.635552056133747 + 12.547897297888994)
    assert phases["training"] == pytest.approx(35.83383133285679)
    assert phases["weight_sync"] == pytest.approx(5.458046867046505)
    assert sum(phases.values()) == pytest.approx(93.52434759191237)
    assert anatomy.tail.slowest_over_mean == pytest.approx(20.618110499111935 / 8.733964191658202)
    assert anatomy.verdict == "training-bound" and anatomy.confidence == "leaning, one step"
    nemo = dissect(read_run(rl_runs / "nemorl_async_grpo_pr1052.log"))
    assert nemo.verdict == "generation-bound"  # exposed generation, 48.9% ...
    assert {f.phase: round(f.share, 3) for f in nemo.phases}["generation"] == 0.489
    trl = dissect(read_run(rl_runs / "trl_openr1_grpo_8xa100_issue161.log"))
    assert trl.step.mean_s == 281.24 and trl.verdict == "inconclusive"  # nothing but a step


@pytest.mark.parametrize(("sync_row", "async_row"), [(0, 1), (2, 3)])
def test_the_verl_one_step_off_table_is_predicted_from_its_synchronous_run(
    rl_runs: Path, sync_row: int, async_row: int
) -> None:
    """16 GPUs colocated and synchronous, then 4 generating and 12 training one step off:
    with generation's time measured on 4 GPUs the predicted step holds the measured one
    and its midpoint is within 15%; without it, the interval still holds it."""
    runs = read_runs(rl_runs / TABLE)
    measured = runs[async_row].steps[0].values
    step, on_four = measured["timing_s/step"], measured["timing_s/generate_sequences"]
    for generation_s, close in (({4: on_four}, True), ({}, False)):
        setup = Setup(gpus=16, split=(4, 12), generation_s=generation_s)
        result = doctor(runs[sync_row], setup)
        [remedy] = [r for r in result.remedies if r.name.startswith("asynchronous")]
        assert remedy.low_s <= step <= remedy.high_s, (remedy, step)
        if close:
            assert abs(remedy.step_s - step) <= 0.15 * step, (remedy.step_s, step)
            assert "measured on 4 GPUs" in remedy.basis
        else:
            assert "between no change and linear scaling from 16 to 4 GPUs" in remedy.basis
        assert "rollout.n_gpus_per_node=4 trainer.n_gpus_per_node=12" in remedy.lines["verl"]


def _steps(count: int, slow_first: bool = True) -> list[dict[str, float]]:
    """A run whose generation dominates: 60 ± 3 s of a ~100 s step; its first step slow."""
    rows = []
    for i in range(1, count + 1):
        gen = 60.0 + (i % 5) - 2.0
        train = 30.0 + (i % 3)
        step = gen + train + 5.0 + (120.0 if slow_first and i == 1 else 0.0)
        rows.append({"training/global_step": i, "timing_s/gen": gen,
                     "timing_s/update_actor": train, "timing_s/step": step})  # fmt: skip
    return rows


def test_a_metrics_file_and_a_wandb_export_read_alike_and_leave_warm_up_out(
    tmp_path: Path,
) -> None:
    rows = _steps(20)
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_bytes(b"\n".join(orjson.dumps(row) for row in rows) + b"\n")
    exported = tmp_path / "history.csv"
    with exported.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["_step", *(f"run - {k}" for k in rows[0])])
        writer.writeheader()
        for row in rows:
            writer.writerow({"_step": row["training/global_step"],
                             **{f"run - {k}": v for k, v in row.items()}})  # fmt: skip
    results = [doctor(read_run(path), Setup()) for path in (jsonl, exported)]
    assert results[0].format == "verl JSONL metrics"
    assert results[1].format == "verl W&B history export (CSV)"
    for result in results:
        assert [s.index for s in result.steps if not s.steady] == [1]
        assert result.step.mean_s == pytest.approx(sum(r["timing_s/step"] for r in rows[1:]) / 19)
        generation = next(f for f in result.phases if f.phase == "generation")
        assert generation.low_s is not None and generation.high_s is not None
        assert generation.low_s < generation.mean_s < generation.high_s
        assert result.verdict == "generation-bound" and result.confidence == "sure"
    assert results[0].phases == results[1].phases


def test_a_tensorboard_folder_is_read_without_tensorflow(tmp_path: Path) -> None:
    tensorboard_x = pytest.importorskip("tensorboardX")
    rows = _steps(12)
    with tensorboard_x.SummaryWriter(str(tmp_path / "tb")) as writer:
        for row in rows:
            step = int(row["training/global_step"])
            for name, value in row.items():
                if name != "training/global_step":
                    writer.add_scalar(name, value, step)
    run = read_run(tmp_path / "tb")
    assert run.format == "verl TensorBoard event files"
    assert [step.index for step in run.steps] == list(range(1, 13))
    assert run.steps[4].values["timing_s/gen"] == pytest.approx(rows[4]["timing_s/gen"])


@pytest.mark.parametrize(
    ("content", "name", "says"),
    [
        ("hello\nnothing to see here\n", "notes.log", "holds no step time or phase"),
        ('{"step": 1, "timing_s/step": 3.0}\n{"step": 2, "timing_s/st', "m.jsonl",
         "its last line is cut short"),
        ("_step,timing_s/step\n1,3.0\n2\n", "h.csv", "row 3 has 1 fields"),
        (b"\x00\x01\xff\xfe binary", "blob.bin", "is not text"),
        ("[1, 2", "history.json", "is not whole JSON"),
    ],
)  # fmt: skip
def test_a_bad_truncated_or_unknown_log_is_one_sentence_and_writes_nothing(
    tmp_path: Path, content: str | bytes, name: str, says: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out"
    done = autotune("doctor", str(path), "--output-dir", str(out))
    assert done.returncode == 2 and done.stdout == ""
    assert says in one_sentence_error(done)
    assert not out.exists()


def test_the_command_writes_its_result_and_a_page_a_person_reads(tmp_path: Path) -> None:
    log = tmp_path / "verl.log"
    log.write_text(
        "\n".join(
            f"(TaskRunner pid=1) step:{row['training/global_step']:.0f} - "
            + " - ".join(f"{k}:{v}" for k, v in row.items() if k != "training/global_step")
            for row in _steps(30)
        )
    )
    out = tmp_path / "report"
    done = autotune("doctor", str(log), "--gpus", "16", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr
    assert "verdict    generation-bound (sure)" in done.stdout
    assert "asynchronous training, one step off" in done.stdout
    result = load_result(out)
    assert isinstance(result, DoctorResult) and len(result.steps) == 30
    as_json = autotune("doctor", str(log), "--gpus", "16", "--json")
    assert orjson.loads(as_json.stdout)["verdict"] == "generation-bound"
    shot = render(
        out / "index.html", tmp_path / "doctor.png",
        checks={"bars": "document.querySelectorAll('figure img').length",
                "remedies": "document.querySelectorAll('table').length"},
    )  # fmt: skip
    assert shot.console_errors == [] and shot.failed_or_external_requests == []
    assert "generation-bound (sure)" in shot.text and "asynchronous training" in shot.text
    assert shot.checks == {"bars": 1, "remedies": 3}
    assert shot.screenshot.stat().st_size > 20_000
    (out / "index.html").unlink()
    again = autotune("report", str(out))
    assert again.returncode == 0 and "generation-bound" in (out / "index.html").read_text()


def test_follow_prints_a_line_a_step_as_the_log_grows(tmp_path: Path) -> None:
    log = tmp_path / "growing.log"
    log.write_text("")
    follower = subprocess.Popen(
        [sys.executable, "-m", "autotune", "doctor", str(log), "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
        # As from a terminal: a process started with SIGINT ignored (a test runner's worker
        # may be) keeps ignoring it, and Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert follower.stdout is not None
    try:
        for i in range(1, 4):
            with log.open("a") as handle:
                handle.write(f"step:{i} - timing_s/gen:{50 + i} - timing_s/step:{90 + i}\n")
            if i > 1:  # a step is told once the next one begins
                line = follower.stdout.readline()
                assert line.startswith(f"step {i - 1}: timing_s/gen {50 + i - 1}"), line
    finally:
        follower.send_signal(signal.SIGINT)
        try:
            out, err = follower.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # where it hangs: faulthandler's stacks on SIGABRT
            follower.send_signal(signal.SIGABRT)
            out, err = follower.communicate()
            pytest.fail(f"doctor --follow went on 30 s after Ctrl-C; its stacks: {err[-4000:]}")
    assert follower.returncode == 0, err
    assert "read as    verl console log, 3 step(s)" in out


@pytest.mark.slow
@pytest.mark.measures
def test_the_loop_replays_a_parsed_run_and_its_what_if_agrees_with_the_doctor(
    rl_runs: Path,
) -> None:
    """verl's synchronous FSDP2 run (749 s a step) replayed by the loop on the simulator,
    then one step off on 4 + 12 GPUs at both ends of the doctor's interval."""
    done = autotune(
        "loop", "--replay", str(rl_runs / TABLE), "--run", "1", "--gpus", "16",
        "--split", "4:12", "--generation-s", "4=458", "--json", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = orjson.loads(done.stdout)
    assert figures["logged_step_s"] == 749
    assert abs(figures["replayed_step_s"] / 749 - 1) <= 0.05, figures
    what_if = figures["what_if"]
    assert what_if["split"] == [4, 12]
    for predicted, replayed in zip(what_if["predicted_s"], what_if["replayed_s"], strict=True):
        assert abs(replayed / predicted - 1) <= 0.05, what_if
    asynchronous = autotune("loop", "--replay", str(rl_runs / TABLE), "--run", "2")
    assert "is an asynchronous run" in one_sentence_error(asynchronous)
