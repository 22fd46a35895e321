"""`autotune sweep` on the simulated engine: outputs, resume after kill -9 with no
server left behind, infeasible configurations, and study-file validation."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from autotune.config.study import Study, load_study
from autotune.errors import UsageError
from autotune.probe.launchers import http_launcher, study_launcher
from autotune.processes.event_loop import run_async
from autotune.report.terminal import trial_line
from autotune.results.codec import machine_identity
from autotune.results.probes import CurvePoint
from autotune.results.saved import load_result
from autotune.results.trials import SweepResult
from autotune.sweep.objectives import objective_for
from autotune.sweep.search import open_study, storage_url
from autotune.sweep.sweep_job import run_sweep, write_outputs, write_trials_csv
from autotune.verifiers import NoneVerifier
from tests.browser import render
from tests.helpers import REPO, autotune, one_sentence_error, sweep
from tests.test_recommend import sweep as sweep_result
from tests.test_recommend import trial, usl_curve
from tests.test_sweep_search import SeqsLauncher


def write_study(tmp_path: Path, name: str, marker: str, **overrides: object) -> Path:
    study = {
        "name": name,
        "target": {
            "kind": "sim",
            "args": ["--time-scale", "0.02", "--served-model-name", marker],
        },
        "workload": {"synthetic": {"num_tasks": 200, "output_tokens": [64, 8]}},
        "search_space": {
            "parallelism": {"low": 4, "high": 64},
            "max_num_seqs": {"choices": [8, 32]},
            "max_num_batched_tokens": {"choices": [2048, 8192]},
        },
        "probe": {"min_s": 0.8, "max_s": 3},
        "budget": {"trials": 3},
        **overrides,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def servers_alive(marker: str) -> list[int]:
    alive = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(marker in part for part in cmdline) and "autotune.servers.sim" in cmdline:
            alive.append(process.info["pid"])
    return alive


@pytest.mark.slow
def test_sweep_writes_report_and_recommendation(tmp_path: Path) -> None:
    marker = f"sim/outputs-{uuid.uuid4().hex[:8]}"
    study = write_study(tmp_path, "outputs", marker)
    result = sweep(study, tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "reports" / "outputs"
    recommendation = json.loads((out / "recommendation.json").read_text())
    assert recommendation["snippets"]["nemo_gym"] == (
        f"+num_samples_in_parallel={recommendation['recommended']['parallelism']}"
    )
    assert "--max-num-seqs" in recommendation["snippets"]["serve"]
    assert yaml.safe_load((out / "recommendation.yaml").read_text()) == recommendation
    rows = list(csv.DictReader((out / "trials.csv").read_text().splitlines()))
    assert len([row for row in rows if not row["copy_of"]]) == 3  # copies are not trials
    saved = load_result(out / "sweep.json")
    assert isinstance(saved, SweepResult)
    finished = [*saved.completed, *saved.pruned]
    assert len([t for t in finished if t.copied_from is None]) == 3 and saved.simulated
    page = render(out / "index.html", tmp_path / "sweep.png")
    assert page.console_errors == [] and page.failed_or_external_requests == []
    assert "Recommended: parallelism" in page.text and "SIMULATED" in page.text
    assert servers_alive(marker) == []


@pytest.mark.slow
def test_killed_sweep_resumes_and_leaves_no_server(tmp_path: Path) -> None:
    marker = f"sim/kill-{uuid.uuid4().hex[:8]}"
    study = write_study(tmp_path, "killed", marker, budget={"trials": 4})
    args = [
        sys.executable,
        "-m",
        "autotune",
        "sweep",
        str(study),
        "--studies-dir",
        str(tmp_path / "studies"),
        "--output-dir",
        str(tmp_path / "reports" / "killed"),
    ]
    log = (tmp_path / "sweep.log").open("w")
    process = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    # Kill once a trial has finished and the next one has its server running.
    while time.monotonic() < deadline:
        text = (tmp_path / "sweep.log").read_text()
        if "trial 0:" in text and servers_alive(marker):
            break
        assert process.poll() is None, text
        time.sleep(0.1)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    log.close()
    deadline = time.monotonic() + 10
    while servers_alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert servers_alive(marker) == [], "a simulated server outlived the killed sweep"

    resumed = sweep(study, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    saved = load_result(tmp_path / "reports" / "killed" / "sweep.json")
    assert isinstance(saved, SweepResult)
    assert saved.trials_reused >= 1
    finished = [*saved.completed, *saved.pruned]
    assert len([t for t in finished if t.copied_from is None]) == 4
    assert servers_alive(marker) == []


@pytest.mark.slow
def test_weights_that_do_not_fit_are_infeasible_with_the_servers_message(tmp_path: Path) -> None:
    marker = f"sim/oom-{uuid.uuid4().hex[:8]}"
    path = write_study(
        tmp_path,
        "oom",
        marker,
        target={
            "kind": "sim",
            "args": [
                "--model",
                "llama-3.1-70b",
                "--time-scale",
                "0.02",
                "--served-model-name",
                marker,
            ],
        },
        search_space={
            "parallelism": {"low": 4, "high": 32},
            "tensor_parallel_size": {"choices": [1, 4]},
        },
    )
    study = load_study(path)
    url = storage_url(study, None, tmp_path / "studies")
    open_study(study, url).enqueue_trial({"tensor_parallel_size": 1})
    open_study(study, url).enqueue_trial({"tensor_parallel_size": 4})

    async def sweep() -> SweepResult:
        async with study_launcher(study, tmp_path / "studies") as launcher:
            return await run_sweep(study, launcher, storage=url)

    result = run_async(sweep())
    # The study went on after the refusal, and stopped once both choices were tried.
    assert len(result.completed) == 2
    refused = [t for t in result.completed if t.knobs == {"tensor_parallel_size": 1}]
    assert refused and not refused[0].feasible
    assert refused[0].infeasible_reason is not None  # known before launch: never started
    assert refused[0].infeasible_reason.startswith("No available memory for the cache blocks")
    assert refused[0].infeasible_reason.endswith("(known before launch: not started)")
    best = result.best()
    assert best is not None and best.knobs == {"tensor_parallel_size": 4}
    write_outputs(result, tmp_path / "report")
    assert "No available memory" in (tmp_path / "report" / "index.html").read_text()
    assert servers_alive(marker) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\ntarget: {kind: sim}\nbudget: {trials: 0}\n", "budget.trials"),
        ("name: x\ntarget: {kind: sim}\nsurprise: 1\n", "surprise"),
        ("name: x\ntarget: {kind: server}\n", "base_url"),
        (
            "name: x\ntarget: {kind: sim}\nsearch_space: {max_num_seqs: {low: 64, high: 8}}\n",
            "must not exceed",
        ),
        (
            "name: x\ntarget: {kind: server, base_url: 'http://h/v1'}\n"
            "search_space: {max_num_seqs: {choices: [8]}}\n",
            "starts no server",
        ),
        ("name: [unclosed\n", "not valid YAML at line"),
        ("name: x\ntarget: {kind: sglang}\n", "kind: sglang needs model"),
        (
            "name: x\ntarget: {kind: trtllm, model: m}\n"
            "search_space: {gpu_memory_utilization: {choices: [0.9]}}\n",
            "TensorRT-LLM has none: it sizes its KV cache by the share",
        ),
        (
            "name: x\ntarget: {kind: trtllm, model: m}\n"
            "resources: {gpus: 4, replicas: data-parallel}\n",
            "one trtllm-serve per engine",
        ),
        (
            "name: x\ntarget: {kind: sglang, model: m, args: [--model-path, x]}\n",
            "sets --model-path",
        ),
        (
            "name: x\ntarget: {kind: sglang, model: m}\n"
            "search_space: {flags: {dp_size: {choices: [2]}}}\n",
            "sets dp_size, which resources.gpus decides",
        ),
        (
            "name: x\ntarget: {kind: sglang, model: m}\n"
            "search_space: {flags: {--model-path: {choices: [a]}}}\n",
            "sets --model-path, which autotune sets itself",
        ),
    ],
)
def test_study_file_errors_are_one_sentence(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match="study file") as caught:
        load_study(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("target", "listens", "answers"),
    [
        ({"kind": "sim"}, "127.0.0.1", "http://127.0.0.1:"),
        ({"kind": "sim", "host": "0.0.0.0"}, "0.0.0.0", "http://127.0.0.1:"),
        ({"kind": "vllm", "model": "m"}, "127.0.0.1", "http://127.0.0.1:"),
        ({"kind": "vllm", "model": "m", "host": "10.1.2.3"}, "10.1.2.3", "http://10.1.2.3:"),
    ],
)
def test_a_study_launches_its_servers_on_loopback_unless_it_says(
    target: dict[str, str], listens: str, answers: str
) -> None:
    study = Study.model_validate({"name": "host", "target": target})
    launcher = http_launcher(study, NoneVerifier())
    assert launcher.server is not None
    (server,) = launcher.server({"max_num_seqs": 8}).processes
    assert server.cmd[server.cmd.index("--host") + 1] == listens
    assert server.base_url is not None and server.base_url.startswith(answers)


def test_example_studies_validate() -> None:
    for path in sorted((REPO / "studies").glob("*.yaml")):
        load_study(path)


def test_storage_without_its_driver_is_one_sentence(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, "nodriver", "sim/x"))
    with pytest.raises(UsageError, match="needs a database driver that is not installed"):
        open_study(study, "mysql+pymysql://user@127.0.0.1:9/db")  # pymysql is not installed


def test_secret_flags_never_reach_saved_results() -> None:
    from autotune.sweep.sweep_job import redacted

    args = ["--model", "m", "--api-key", "sk-1", "--hf-token=hf_2", "--max-num-batched-tokens"]
    assert redacted([*args, "8"]) == [
        "--model", "m", "--api-key", "***", "--hf-token=***", "--max-num-batched-tokens", "8",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://user:pass@host:8000/v1", "http://***@host:8000/v1"),
        ("run --api-key sk-1 --api-key=sk-2 -p 4", "run --api-key *** --api-key=*** -p 4"),
        ("API_KEY=sk-3 HF_TOKEN='a b' ng_run", "API_KEY=*** HF_TOKEN=*** ng_run"),
        ("curl -H 'Authorization: Bearer sk-4' x", "curl -H 'Authorization: Bearer ***' x"),
        ("http://h/v1?api_key=sk-5&n=1", "http://h/v1?api_key=***&n=1"),
        (
            "--api-key-env OPENAI_API_KEY --max-tokens 8",
            "--api-key-env OPENAI_API_KEY --max-tokens 8",
        ),
    ],
)
def test_secrets_in_urls_and_command_lines_are_hidden(text: str, shown: str) -> None:
    from autotune.sweep.sweep_job import redact_text

    assert redact_text(text) == shown


def test_no_output_of_a_sweep_holds_a_secret(tmp_path: Path) -> None:
    """sweep.json, trials.csv, the HTML report and the recommendation, from studies whose
    base URL, command template, request body, storage and a server's error line hold
    secrets."""
    template = (
        "OPENAI_API_KEY=sk-env collect --api-key sk-flag --api-key=sk-equals "
        "-H 'Authorization: Bearer sk-bearer' {parallelism} {output}"
    )
    studies = [
        {"kind": "command", "template": template},
        {"kind": "server", "base_url": "http://me:sk-url@h:1/v1"},
        {"kind": "vllm", "model": "m", "args": ["--api-key", "sk-arg", "--hf-token=sk-tok"]},
    ]
    for number, target in enumerate(studies):
        spec = Study.model_validate(
            {"name": "s", "target": target, "workload": {"extra_body": {"api_key": "sk-body"}}}
        )
        points = [CurvePoint(n, n / 2, 50.0 * n, 0.0, 1.0, 1.0, "converged") for n in (4, 8)]
        measured = dataclasses.replace(trial(0, 10.0, {}, curve=usl_curve(1.0)), points=points)
        result = dataclasses.replace(
            sweep_result(measured, trial(1, 0.0, {}, feasible=False)),
            storage="postgresql://u:sk-db@db/x",
            spec=spec.model_dump(mode="json"),
            machine=machine_identity(),
        )
        failed = dataclasses.replace(result.trials[1], infeasible_reason="E: http://u:sk-e@h")
        result = dataclasses.replace(result, trials=[result.trials[0], failed])
        directory = tmp_path / str(number)
        written = write_outputs(result, directory)
        assert {path.name for path in written} == {
            "sweep.json", "trials.csv", "index.html", "recommendation.json", "recommendation.yaml",
        }  # fmt: skip
        for path in written:
            assert "sk-" not in path.read_text(), path
        assert "***" in (directory / "sweep.json").read_text()


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("bogus", "--storage bogus is not a storage URL; for a file pass sqlite:///bogus"),
        ("foo@bar", "--storage foo@bar is not a storage URL"),
        ("redis://x", "--storage redis://x names a storage autotune cannot open (redis)"),
        ("postgres://u:pw@h/db", "--storage postgres://***@h/db names a storage autotune"),
        ("sqlite:///no/such/dir/x.db", "cannot open the study storage sqlite:///no/such/dir"),
    ],
)
def test_bogus_storage_url_is_one_sentence(tmp_path: Path, storage: str, message: str) -> None:
    study = write_study(tmp_path, "bogus", "sim/x")
    result = autotune("sweep", str(study), "--storage", storage, "--quiet", cwd=tmp_path)
    assert result.returncode == 2
    assert message in one_sentence_error(result) and "pw" not in result.stderr


@pytest.mark.slow
def test_sweep_of_a_users_own_collector_command(tmp_path: Path) -> None:
    collector = f"{sys.executable} {REPO / 'tests' / 'fixtures' / 'fake_collector.py'}"
    study = tmp_path / "own.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "own",
                "target": {
                    "kind": "command",
                    "template": f"{collector} --parallelism {{parallelism}} --limit {{limit}} "
                    "--output {output}",
                },
                "workload": {"limit": 60},
                "search_space": {"parallelism": {"low": 2, "high": 16}},
                "budget": {"trials": 2},
            }
        )
    )
    result = sweep(study, tmp_path)
    assert result.returncode == 0, result.stderr
    saved = load_result(tmp_path / "reports" / "own" / "sweep.json")
    assert isinstance(saved, SweepResult)
    best = saved.best()
    assert best is not None
    points = best.points
    assert [p.parallelism for p in points][:2] == [2, 4]
    assert points[1].rollouts_per_s > 1.5 * points[0].rollouts_per_s  # it scales
    recommendation = json.loads((tmp_path / "reports" / "own" / "recommendation.json").read_text())
    assert recommendation["snippets"]["nemo_gym"].startswith("+num_samples_in_parallel=")


async def test_a_configuration_proposed_again_is_copied_marked_and_counted_as_reused(
    tmp_path: Path,
) -> None:
    """A configuration the sampler proposes again is copied from the study, not launched:
    it is marked as a copy (the trial line, trials.csv), carries its original's value (a
    pruned one's too), and `trials_reused` counts it with the trials a resume finds."""

    def spec(trials: int) -> Study:
        return Study.model_validate(
            {
                "name": "reuse",
                "target": {"kind": "sim", "args": ["--model", "llama-3.1-8b"]},
                "search_space": {
                    "parallelism": {"low": 4, "high": 256},
                    "max_num_seqs": {"choices": [8, 64, 128, 256]},
                },
                "budget": {"trials": trials, "validate_rollouts": 0},
            }
        )

    url = f"sqlite:///{tmp_path / 'reuse.db'}"
    for seqs in (64, 8, 64, 128):  # the third again: copied from the first
        open_study(spec(3), url).enqueue_trial({"max_num_seqs": seqs})
    launcher = SeqsLauncher()
    lines: list[str] = []
    first = await run_sweep(
        spec(3),
        storage=url,
        launcher=launcher,
        on_trial=lambda n, o: lines.append(trial_line(n, o, objective_for("rollouts_per_s"))),
    )
    assert [knobs["max_num_seqs"] for knobs in launcher.started] == [64, 8, 128]
    assert [t.state for t in first.trials][:3] == ["COMPLETE", "PRUNED", "COMPLETE"]
    assert [t.copied_from for t in first.trials] == [None, None, 0, None]
    assert first.trials[2].value == first.trials[0].value
    assert first.trials_reused == 1
    assert lines[2].endswith("(a copy of trial 0)") and "(0.0 s)" not in lines[2]
    table = write_trials_csv(first, tmp_path / "trials.csv").read_text()
    csv_rows = list(csv.DictReader(table.splitlines()))
    assert [row["copy_of"] for row in csv_rows] == ["", "", "0", ""]
    assert csv_rows[2]["value"] == csv_rows[0]["value"] != ""

    open_study(spec(4), url).enqueue_trial({"max_num_seqs": 8})  # copied from the pruned one
    resumed = await run_sweep(spec(4), storage=url, launcher=launcher)
    # Nothing launched again: only the choice not tried yet, for the fourth trial.
    assert [knobs["max_num_seqs"] for knobs in launcher.started[3:]] == [256]
    copy = resumed.trials[4]
    assert copy.state == "PRUNED" and copy.copied_from == 1
    assert copy.value is not None and copy.value == resumed.trials[1].value
    copied_now = [t for t in resumed.trials[4:] if t.copied_from is not None]
    assert resumed.trials_reused == 4 + len(copied_now)  # four finished before, and copies


async def test_a_copy_counts_towards_neither_the_budget_nor_patience(tmp_path: Path) -> None:
    """A copy costs nothing and is not a trial: a budget of two measures two
    configurations however many copies the sampler proposes between them, and a space
    whose every configuration was tried stops the study."""
    study = Study.model_validate(
        {
            "name": "copies",
            "target": {"kind": "sim", "args": ["--model", "llama-3.1-8b"]},
            "search_space": {
                "parallelism": {"low": 4, "high": 256},
                "max_num_seqs": {"choices": [8, 64, 128]},
            },
            "budget": {"trials": 2, "validate_rollouts": 0},
        }
    )
    url = f"sqlite:///{tmp_path / 'copies.db'}"
    for seqs in (64, 64, 64, 8):  # two copies of the first before a second configuration
        open_study(study, url).enqueue_trial({"max_num_seqs": seqs})
    launcher = SeqsLauncher()
    result = await run_sweep(study, storage=url, launcher=launcher)
    assert [knobs["max_num_seqs"] for knobs in launcher.started] == [64, 8]
    assert [t.copied_from for t in result.trials] == [None, 0, 0, None]
    # Every configuration tried (measured or copied): the study stops, whatever its budget.
    whole = study.model_copy(update={"budget": study.budget.model_copy(update={"trials": 30})})
    open_study(whole, url).enqueue_trial({"max_num_seqs": 128})
    finished = await run_sweep(whole, storage=url, launcher=launcher)
    assert [knobs["max_num_seqs"] for knobs in launcher.started] == [64, 8, 128]
    assert len(finished.trials) == 5  # the four before and 128: nothing left to try
