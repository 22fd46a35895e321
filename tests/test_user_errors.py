"""Mistakes a user can make end as one sentence (cause and fix), never a traceback."""

from __future__ import annotations

import http.server
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from autotune.rollout.store import completed_keys
from autotune.rollout.workload import rollout_key
from tests.helpers import autotune, free_port, one_sentence_error, read_rows

ROOT = os.geteuid() == 0


def _rollout(task: int) -> bytes:
    return orjson.dumps({"_ng_task_index": task, "_ng_rollout_index": 0}) + b"\n"


def _study(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text("name: s\n" + body)
    return path


# -- 1. --base-url ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:9/v1", "needs http:// or https://, e.g. http://host:8000/v1."),
        ("ftp://host/v1", "needs http:// or https://"),
        ("http:///v1", "needs a host"),
        ("http://host:port/v1", "is not a valid URL"),
    ],
)
def test_base_url_without_scheme_or_host(url: str, says: str) -> None:
    line = one_sentence_error(autotune("collect", "--synthetic", "3", "--base-url", url))
    assert f"--base-url {url} {says}" in line


def test_study_base_url_without_scheme(tmp_path: Path) -> None:
    study = _study(tmp_path, "target: {kind: server, base_url: 'localhost:9/v1'}\n")
    line = one_sentence_error(autotune("sweep", str(study)))
    assert "base_url localhost:9/v1 needs http:// or https://" in line


# -- 2. study file that cannot be read ----------------------------------------------------


def test_sweep_of_a_directory(tmp_path: Path) -> None:
    line = one_sentence_error(autotune("sweep", str(tmp_path)))
    assert "is a directory" in line


def test_sweep_of_a_binary_file(tmp_path: Path) -> None:
    study = tmp_path / "study.yaml"
    study.write_bytes(b"\xff\xfe\x00\x81 binary")
    line = one_sentence_error(autotune("sweep", str(study)))
    assert "is not UTF-8 text" in line


@pytest.mark.skipif(ROOT, reason="root reads any file")
def test_sweep_of_an_unreadable_file(tmp_path: Path) -> None:
    study = _study(tmp_path, "target: {kind: sim}\n")
    study.chmod(0)
    line = one_sentence_error(autotune("sweep", str(study)))
    assert "cannot be read" in line


# -- 3. search spaces Optuna would refuse -------------------------------------------------


@pytest.mark.parametrize(
    ("space", "says"),
    [
        ("{low: 0, high: 0.9, log: true}", "log: true needs low > 0"),
        ("{low: -1, high: 0.9, log: true}", "log: true needs low > 0"),
        ("{low: 0.5, high: 0.9, step: 0}", "step must be > 0"),
        ("{low: 0.5, high: 0.9, step: -0.1}", "step must be > 0"),
        ("{low: 0.5, high: 0.9, step: 0.5}", "must not exceed high - low"),
    ],
)
def test_float_space_optuna_would_refuse(tmp_path: Path, space: str, says: str) -> None:
    study = _study(
        tmp_path, f"target: {{kind: sim}}\nsearch_space:\n  gpu_memory_utilization: {space}\n"
    )
    line = one_sentence_error(autotune("sweep", str(study)))
    assert "search_space.gpu_memory_utilization" in line and says in line


# -- 4. merge -----------------------------------------------------------------------------


def test_merge_creates_the_output_directory(tmp_path: Path) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0) + _rollout(1))
    out = tmp_path / "new" / "dir" / "rollouts.jsonl"
    result = autotune("merge", str(shard), "--output-dir", str(out.parent))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == shard.read_bytes()


def test_merge_into_a_path_under_a_file(tmp_path: Path) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0))
    line = one_sentence_error(autotune("merge", str(shard), "--output-dir", str(shard)))
    assert f"cannot write {shard / 'rollouts.jsonl'}" in line


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_merge_of_a_shard_that_fails_to_read(tmp_path: Path) -> None:
    # /proc/self/mem opens, then fails the first read (EIO), as a bad disk would.
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0))
    out = tmp_path / "m" / "rollouts.jsonl"
    merge = ("merge", str(shard), "/proc/self/mem", "--output-dir", str(out.parent))
    line = one_sentence_error(autotune(*merge))
    assert f"cannot merge into {out}" in line
    assert not out.exists()


@pytest.mark.skipif(ROOT, reason="root reads any file")
def test_merge_of_an_unreadable_shard(tmp_path: Path) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0))
    shard.chmod(0)
    out = tmp_path / "m" / "rollouts.jsonl"
    line = one_sentence_error(autotune("merge", str(shard), "--output-dir", str(out.parent)))
    assert f"shard file {shard} cannot be read" in line
    assert not out.exists()


# -- 5. --output is a directory -----------------------------------------------------------


@pytest.mark.parametrize("resume", [False, True])
def test_collect_output_is_a_directory(tmp_path: Path, resume: bool) -> None:
    args = ["collect", "--synthetic", "3", "--output", str(tmp_path)]
    line = one_sentence_error(autotune(*args, *(["--resume"] if resume else [])))
    assert f"--output {tmp_path} is a directory" in line


def test_collect_output_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "rollouts.jsonl"
    line = one_sentence_error(autotune("collect", "--synthetic", "3", "--output-dir", str(blocker)))
    assert f"cannot write {out}" in line


# -- 6. --resume never cuts a file autotune did not write ---------------------------------


def test_resume_onto_the_task_file_leaves_it_untouched(tmp_path: Path) -> None:
    tasks = tmp_path / "rollouts.jsonl"  # where --output-dir tmp_path keeps its rollouts
    content = b'{"prompt": "a"}\n{"prompt": "b"}'  # no newline after the last line
    tasks.write_bytes(content)
    line = one_sentence_error(
        autotune("collect", "--input", str(tasks), "--output-dir", str(tmp_path), "--resume")
    )
    assert "line 1 is not a rollout row" in line
    assert tasks.read_bytes() == content


@pytest.mark.parametrize(
    "content",
    [
        b'{"prompt": "a"}',  # one task line, no newline
        b'{"prom',  # one partial line that is no rollout row
        _rollout(0) + b'{"prompt": "a"}',  # a complete JSON tail that is no rollout row
        b'{"prompt": "a"}\n' + _rollout(0) + b'{"_ng_ta',  # a task line before the rows
    ],
)
def test_resume_refuses_a_foreign_file_untouched(tmp_path: Path, content: bytes) -> None:
    out = tmp_path / "rollouts.jsonl"
    out.write_bytes(content)
    line = one_sentence_error(
        autotune("collect", "--synthetic", "3", "--output-dir", str(tmp_path), "--resume")
    )
    assert "is not a rollout row autotune wrote" in line
    assert out.read_bytes() == content


@pytest.mark.parametrize("tail", [b'{"_ng_ta', b'{"_ng_task_index":2,"_ng_rollout_index":0}'])
def test_resume_still_cuts_a_truncated_rollout_tail(tmp_path: Path, tail: bytes) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(_rollout(0) + _rollout(1) + tail)
    assert completed_keys(out) == {rollout_key(0, 0), rollout_key(1, 0)}
    assert out.read_bytes() == _rollout(0) + _rollout(1)
    only = tmp_path / "only.jsonl"
    only.write_bytes(b'{"_ng_task_index":0,"_ng_rol')  # killed during the first row
    assert completed_keys(only) == set()
    assert only.read_bytes() == b""


# -- 7. tools that are not objects --------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "says"), [('["x"]', "each tool must be an object"), ('"x"', "`tools` must be a list")]
)
def test_tools_that_are_not_objects(tmp_path: Path, tools: str, says: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"prompt": "fine"}\n'
        f'{{"responses_create_params": {{"input": "hi", "tools": {tools}}}}}\n'
    )
    line = one_sentence_error(autotune("collect", "--input", str(tasks)))
    assert f"{tasks} line 2 is not a task: {says}" in line


# -- 8. diagnose output paths: checked before measuring, and a failed write keeps the result --

FAST_DIAGNOSE = ("--synthetic", "40", "--low", "2", "--high", "4", "--min-s", "0.2", "--max-s", "1")


def test_diagnose_json_into_a_directory_fails_before_measuring(tmp_path: Path) -> None:
    # No server listens on port 9: a diagnose that measured (or even reached for its
    # server) before checking where its result goes would fail on that instead.
    line = one_sentence_error(
        autotune("diagnose", "--json", str(tmp_path), "--base-url", "http://127.0.0.1:9/v1")
    )
    assert f"--json {tmp_path} is a directory" in line


def test_diagnose_json_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = one_sentence_error(autotune("diagnose", "--json", str(blocker / "d.json")))
    assert f"{blocker} is a file" in line


def test_diagnose_output_dir_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for report in (blocker, blocker / "sub"):
        line = one_sentence_error(autotune("diagnose", "--output-dir", str(report)))
        assert f"--output-dir {report} cannot be written: {blocker} is a file" in line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_diagnose_write_failure_keeps_the_result(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "diagnose.json").symlink_to("/dev/full")  # a full disk under the saved result
    result = autotune("diagnose", *FAST_DIAGNOSE, "--output-dir", str(out))
    line = one_sentence_error(result)
    assert f"could not write {out} (No space left on device)" in line
    assert result.stdout.strip()  # the summary was printed
    saved = Path(line.split("the result is saved in ")[1].split(" instead")[0])
    try:
        assert orjson.loads(saved.read_bytes())["kind"] == "diagnose"
    finally:
        saved.unlink()


# -- 9. a refused API key -----------------------------------------------------------------


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 401

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "no"}')

    def log_message(self, *args: object) -> None:
        pass


def _serve(status: int) -> Iterator[str]:
    handler = type("Handler", (_Answer,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def refusing_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _serve(request.param)


@pytest.mark.parametrize("refusing_url", [401, 403], indirect=True)
def test_refused_api_key_names_the_variable_not_the_key(refusing_url: str) -> None:
    result = autotune(
        "collect",
        "--synthetic",
        "3",
        "--base-url",
        refusing_url,
        "--api-key-env",
        "MY_SERVER_KEY",
        env={"MY_SERVER_KEY": "sekrit-123"},
    )
    line = one_sentence_error(result)
    assert f"the server at {refusing_url} refused the API key (HTTP " in line
    assert "check the environment variable MY_SERVER_KEY." in line
    assert "sekrit" not in result.stderr + result.stdout


@pytest.mark.parametrize("refusing_url", [401], indirect=True)
def test_missing_api_key_says_to_set_it(refusing_url: str) -> None:
    result = autotune(
        "collect", "--synthetic", "3", "--base-url", refusing_url, "--api-key-env", "NO_SUCH_KEY"
    )
    line = one_sentence_error(result)
    assert "needs an API key (HTTP 401); set the environment variable NO_SUCH_KEY." in line


@pytest.mark.parametrize("refusing_url", [404], indirect=True)
def test_models_404_still_asks_for_model(refusing_url: str) -> None:
    line = one_sentence_error(autotune("collect", "--synthetic", "3", "--base-url", refusing_url))
    assert "lists no model at /models; pass --model NAME." in line


# -- 10. numeric flags out of range: refused at parse time, exit 2 ------------------------

# The arguments each command needs before a flag can be the one at fault.
COMMAND = {
    "collect": ("collect",),
    "diagnose": ("diagnose",),
    "bench run": ("bench", "run", "benchmarks/suite.yaml", "--output-dir", "r"),
    "bench compare": ("bench", "compare", "r.json", "--baseline", "b.json"),
    "bench ab": ("bench", "ab", "benchmarks/suite.yaml", "--baseline-ref", "main"),
}
ABOVE_0 = "a number above 0"
WHOLE_0 = "a whole number of at least 0"
WHOLE_1 = "a whole number of at least 1"
TOKENS = "a token count or [mean, std]"  # the study and suite fields' own sentence
INNER = "a number above 0 and below 1"


@pytest.mark.parametrize(
    ("command", "flag", "value", "expected"),
    [
        ("collect", "--rpm", "-5", ABOVE_0),
        ("collect", "--rpm", "inf", ABOVE_0),
        ("collect", "--tpm", "0", ABOVE_0),
        ("collect", "--timeout", "0", ABOVE_0),
        ("collect", "--timeout", "nan", ABOVE_0),
        ("collect", "--idle-timeout", "-1", ABOVE_0),
        ("collect", "--max-retries", "-1", WHOLE_0),
        ("collect", "--max-retries", "1.5", WHOLE_0),
        ("collect", "--pool-limit", "0", WHOLE_1),
        ("collect", "--synthetic", "0", WHOLE_1),
        ("collect", "--prompt-tokens", "0", "at least 1 token"),
        ("collect", "--output-tokens", "64,-1", TOKENS),
        ("collect", "--output-tokens", "1,2,3", TOKENS),
        ("collect", "--seed", "-1", WHOLE_0),
        ("collect", "--limit", "-1", WHOLE_0),
        ("collect", "--num-repeats", "0", WHOLE_1),
        ("collect", "--verifier-workers", "0", WHOLE_1),
        ("collect", "--verifier-cost-ms", "-1", "a number of at least 0"),
        ("collect", "--verifier-timeout", "0", ABOVE_0),
        ("collect", "--parallelism", "0", WHOLE_1),
        ("collect", "--max-failure-rate", "1.5", "a share from 0 to 1"),
        ("collect", "--max-failure-rate", "-0.1", "a share from 0 to 1"),
        ("diagnose", "--low", "0", WHOLE_1),
        ("diagnose", "--high", "x", WHOLE_1),
        ("diagnose", "--min-s", "0", ABOVE_0),
        ("diagnose", "--max-s", "-3", ABOVE_0),
        ("diagnose", "--rpm", "-5", ABOVE_0),
        ("bench run", "--repetitions", "0", WHOLE_1),
        ("bench run", "--warmup", "-1", WHOLE_0),
        ("bench compare", "--threshold", "0", INNER),
        ("bench compare", "--alpha", "1", INNER),
        ("bench ab", "--min-pairs", "0", WHOLE_1),
        ("bench ab", "--max-pairs", "-2", WHOLE_1),
        ("bench ab", "--threshold", "1.5", INNER),
        ("bench ab", "--alpha", "0", INNER),
    ],
)
def test_out_of_range_flags_are_refused_before_anything_runs(
    command: str, flag: str, value: str, expected: str
) -> None:
    result = autotune(*COMMAND[command], flag, value)
    assert result.returncode == 2
    line = one_sentence_error(result)
    assert line.startswith(f"autotune: error: argument {flag}")  # its aliases may follow
    assert line.endswith(f": must be {expected}, not {value!r}; see `autotune {command} --help`.")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("unstable,slow", "'slow' is not a verdict; use parallelism-bound, model-bound"),
        ("", "'' is not a verdict"),
    ],
)
def test_fail_on_takes_only_verdict_names(value: str, says: str) -> None:
    result = autotune("diagnose", "--fail-on", value)
    assert result.returncode == 2
    assert f"argument --fail-on: {says}" in one_sentence_error(result)


def test_sim_serve_hands_every_flag_to_the_simulator() -> None:
    # Before, argparse took `--port` for one of its own and refused it.
    result = autotune("sim", "serve", "--port", "0", "--max-num-seqs", "0")
    assert result.returncode != 0
    assert "max_num_seqs (0) must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_command_documents_its_exit_codes() -> None:
    for command, gate in [
        ("collect", "3 the run finished, but no rollout succeeded"),
        ("diagnose", "3 the verdict is one of --fail-on"),
        ("sweep", ""),
        ("report", ""),
        ("merge", ""),
    ]:
        text = " ".join(autotune(command, "--help").stdout.split())
        assert "exit status: 0 done; 1 a runtime error" in text, command
        assert "130 interrupted (Ctrl-C); 143 terminated (SIGTERM)." in text, command
        assert gate in text, command


# -- 11. verifier answers no row can hold: that rollout fails, never the run ---------------

BAD_VALUES = """
import math

def score(row):
    task = row["_ng_task_index"]
    if task == 0:
        return {"reward": 1.0, "tags": {"a"}}
    if task == 1:
        return math.nan
    if task == 2:
        return {"reward": 1.0, "_ng_task_index": 99, "note": "kept"}
    return 1.0
"""


def test_bad_verifier_values_fail_their_rollouts_and_the_file_still_resumes(
    tmp_path: Path,
) -> None:
    verifier = tmp_path / "bad_values.py"
    verifier.write_text(BAD_VALUES)
    out = tmp_path / "rollouts.jsonl"
    collect = (
        "collect", "--synthetic", "4", "--output-tokens", "8", "--verifier", f"{verifier}:score",
        "--verifier-workers", "1", "--output-dir", str(tmp_path), "-q",
    )  # fmt: skip
    result = autotune(*collect)
    assert result.returncode == 3  # the run finished; half of it failed its gate
    line = one_sentence_error(result)
    assert "2 of 4 rollouts failed (50%, above --max-failure-rate 0.05; verifier_error 2)" in line
    assert f"{out} keeps the 2 rollouts collected" in line
    assert f"each failure's cause is in {tmp_path / 'rollouts_failures.jsonl'}" in line
    failures = read_rows(tmp_path / "rollouts_failures.jsonl")
    messages = {f["_ng_task_index"]: f["message"] for f in failures}
    assert "the verifier's 'tags' is a set JSON cannot hold" in messages[0]
    assert "the verifier's 'reward' is nan" in messages[1]
    rows = {r["_ng_task_index"]: r for r in read_rows(out)}
    assert sorted(rows) == [2, 3] and rows[2]["note"] == "kept"  # its own index, not 99
    again = autotune(*collect, "--resume")  # the file is one --resume accepts
    assert "2 of 2 rollouts failed (none succeeded" in one_sentence_error(again)
    assert again.returncode == 3
    assert "2 already on disk" in again.stdout


# -- 12. --resume onto another run's output -------------------------------------------------

QUICK = ("collect", "--synthetic", "3", "--output-tokens", "8", "-q")


@pytest.mark.parametrize(
    ("other", "says"),
    [
        (("--verifier", "exact"), "its verifier was 'synthetic', now 'exact'); pass the same"),
        (("--num-repeats", "2"), "its --num-repeats was 1, now 2); pass the same --num-repeats"),
        (("--seed", "7"), "its tasks were synthetic with seed 0,"),
        (("--sim-arg=--served-model-name=other",),
         "its model was 'sim/llama-3.1-8b', now 'sim/other'); collect from the same model"),
    ],
)  # fmt: skip
def test_resume_refuses_another_runs_output(
    tmp_path: Path, other: tuple[str, ...], says: str
) -> None:
    out = tmp_path / "rollouts.jsonl"
    run = ("--output-dir", str(tmp_path))
    first = autotune(*QUICK, *run)
    assert first.returncode == 0, first.stderr
    before = out.read_bytes()
    line = one_sentence_error(autotune(*QUICK, *run, "--resume", *other))
    assert f"--resume: {out} holds rollouts of another run (" in line and says in line
    assert line.endswith("or choose another --output-dir.")
    assert out.read_bytes() == before
    again = autotune(*QUICK, *run, "--resume", "--synthetic", "5")
    assert again.returncode == 0, again.stderr  # more of the same tasks: its own run
    assert len(read_rows(out)) == 5


def test_resume_refuses_a_changed_task_file(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    run = ("--output-dir", str(tmp_path / "run"))
    args = ("collect", "--input", str(tasks), "--output-tokens", "8", *run, "-q")
    assert autotune(*args).returncode == 0
    tasks.write_text('{"prompt": "c"}\n{"prompt": "d"}\n')
    line = one_sentence_error(autotune(*args, "--resume"))
    assert f"its tasks were {tasks} of 32 bytes, sha256 " in line
    assert "pass the same --input" in line


def test_resume_of_an_output_from_before_run_records_writes_one(tmp_path: Path) -> None:
    run = ("--output-dir", str(tmp_path))
    assert autotune(*QUICK, *run).returncode == 0
    record = tmp_path / "rollouts_run.json"
    record.unlink()
    result = autotune(*QUICK, *run, "--resume", "--verifier", "exact")
    assert result.returncode == 0, result.stderr
    assert orjson.loads(record.read_bytes())["verifier"] == "exact"


# -- sweep storage and folders; server flags a study may not set -------------------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ("--storage foo@bar", "--storage foo@bar is not a storage URL; for a file pass sqlite:///"),
        ("--storage redis://x", "--storage redis://x names a storage autotune cannot open"),
        ("--output-dir somefile/x", "--output-dir somefile/x cannot be written: somefile is a"),
        ("--studies-dir somefile/x", "--studies-dir somefile/x cannot be written: somefile is a"),
    ],
)
def test_sweep_storage_and_folders_are_refused_before_the_first_trial(
    tmp_path: Path, flags: str, says: str
) -> None:
    (tmp_path / "somefile").touch()
    study = _study(tmp_path, "target: {kind: sim}\nbudget: {trials: 1}\n")
    line = one_sentence_error(autotune("sweep", str(study), *flags.split(), cwd=tmp_path))
    assert says in line
    assert not (tmp_path / "studies").exists()  # no storage opened, no trial run


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("{kind: sim, args: [--port, '9']}", "args sets --port, which autotune picks"),
        ("{kind: sim, args: [--host=h]}", "args sets --host=h; use the study's target.host"),
        ("{kind: vllm, model: m, args: [--model, x]}", "args sets --model; use the study's"),
        ("{kind: vllm, model: m, command: [vllm, serve, --host, h]}", "command sets --host;"),
        ("{kind: sim}\nsearch_space: {flags: {port: {choices: [1]}}}", "flags sets port,"),
        ("{kind: sim}\nsearch_space: {flags: {--host: {choices: [h]}}}", "flags sets --host;"),
        ("{kind: server, base_url: 'http://h:1/v1', host: h}", "host does not apply; remove"),
    ],
)
def test_study_setting_a_flag_autotune_sets_itself(tmp_path: Path, target: str, says: str) -> None:
    line = one_sentence_error(autotune("sweep", str(_study(tmp_path, f"target: {target}\n"))))
    assert says in line


# -- collect's live flags: metrics, stats, drift watch, report (issue 17) ------------------


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--metrics-port", "0", "a port from 1 to 65535"),
        ("--metrics-port", "70000", "a port from 1 to 65535"),
        ("--metrics-port", "http", "a port from 1 to 65535"),
        ("--stats-every", "0", ABOVE_0),
        ("--stats-every", "-5", ABOVE_0),
        ("--expect-rate", "0", ABOVE_0),
        ("--drift-window", "0", ABOVE_0),
        ("--drift-windows", "0", WHOLE_1),
    ],
)
def test_out_of_range_live_flags_are_refused_before_anything_runs(
    flag: str, value: str, expected: str
) -> None:
    result = autotune("collect", flag, value)
    assert result.returncode == 2
    line = one_sentence_error(result)
    assert line == (
        f"autotune: error: argument {flag}: must be {expected}, not {value!r}; "
        "see `autotune collect --help`."
    )


def test_metrics_port_in_use_is_refused_before_a_rollout(tmp_path: Path) -> None:
    out = tmp_path / "rollouts.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = autotune(*QUICK, "--output-dir", str(tmp_path), "--metrics-port", str(port))
    line = one_sentence_error(result)
    assert line.startswith(f"autotune: error: --metrics-port {port} cannot be served on 127.0.0.1")
    assert line.endswith("pick a free port with --metrics-port, or stop what listens there.")
    assert not out.exists()  # refused before the rollout file was opened


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist; pass the recommendation.json a sweep wrote, e.g. reports/"),
        (b'{"kind": "sweep", "trials": []}', "is not a recommendation (KeyError: 'simulated'); "),
        (b"not json", "is not valid JSON ("),
    ],
)
def test_expect_file_that_is_missing_or_no_recommendation(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    expect = tmp_path / "recommendation.json"
    if content is not None:
        expect.write_bytes(content)
    run = ("--output-dir", str(tmp_path / "run"))
    line = one_sentence_error(autotune(*QUICK, *run, "--expect", str(expect)))
    assert says in line
    assert not (tmp_path / "run" / "rollouts.jsonl").exists()


def test_stats_every_without_output_names_the_fix() -> None:
    line = one_sentence_error(autotune(*QUICK, "--no-output", "--stats-every", "5"))
    assert line == (
        "autotune: error: --stats-every writes its lines beside the rollout file, and this run "
        "keeps none (--no-output); drop one of the two."
    )


def test_expect_and_expect_rate_together_are_refused(tmp_path: Path) -> None:
    line = one_sentence_error(
        autotune(*QUICK, "--expect", str(tmp_path / "r.json"), "--expect-rate", "5")
    )
    assert "argument --expect-rate: not allowed with argument --expect" in line


def test_collect_report_into_a_file_is_refused_before_collecting(tmp_path: Path) -> None:
    (tmp_path / "file").touch()
    run = ("--output-dir", str(tmp_path / "run"))
    result = autotune(*QUICK, *run, "--report", str(tmp_path / "file" / "r"))
    line = one_sentence_error(result)
    assert f"--report {tmp_path / 'file' / 'r'} cannot be written: " in line
    assert not (tmp_path / "run" / "rollouts.jsonl").exists()


# -- the output convention: a folder per run, the old spellings one at a time ------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--resume",), "--resume needs the folder of the run to continue; pass its --output-dir"),
        (("--no-output", "--resume"), "--no-output keeps nothing, so it takes no --output-dir"),
        (("--output", "a.jsonl", "--output-dir", "d"), "--output is the old spelling of"),
        (("--no-output", "--report"), "--report without DIR goes in --output-dir, and this"),
    ],
)
def test_collect_output_flags_that_cannot_go_together(
    tmp_path: Path, flags: tuple[str, ...], says: str
) -> None:
    line = one_sentence_error(autotune("collect", "--synthetic", "3", *flags, cwd=tmp_path))
    assert says in line
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_merge_without_a_place_for_its_rows(tmp_path: Path) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0))
    line = one_sentence_error(autotune("merge", str(shard)))
    assert line == (
        "autotune: error: merge needs a place for the merged rows; pass --output-dir DIR."
    )


def test_diagnose_report_and_output_dir_together(tmp_path: Path) -> None:
    line = one_sentence_error(
        autotune("diagnose", "--report", str(tmp_path / "a"), "--output-dir", str(tmp_path))
    )
    assert "--report is the old spelling of --output-dir; pass only one." in line


# -- sweep 2.0: latency budgets and the validation run ----------------------------------


ABOVE_0 = "must be a number above 0, not"
AT_LEAST_0 = "must be a whole number of at least 0, not"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("objective: {p95_latency_slo_s: 0}", f"objective.p95_latency_slo_s: {ABOVE_0} 0."),
        ("objective: {p95_ttft_slo_s: -1}", f"objective.p95_ttft_slo_s: {ABOVE_0} -1."),
        ("budget: {validate_rollouts: -5}", f"budget.validate_rollouts: {AT_LEAST_0} -5."),
        ("budget: {validate_rollouts: 1.5}", f"budget.validate_rollouts: {AT_LEAST_0} 1.5."),
    ],
)
def test_bad_latency_budgets_and_validation_lengths_are_one_sentence(
    tmp_path: Path, body: str, says: str
) -> None:
    study = _study(tmp_path, f"target: {{kind: sim}}\n{body}\n")
    line = one_sentence_error(autotune("sweep", str(study), cwd=tmp_path))
    assert line.endswith(says), line
    assert not (tmp_path / "studies").exists()  # refused before any storage or trial


# -- NeMo Gym targets: --agent-url, --metrics-url, --tools ---------------------------------


class _Routes(http.server.BaseHTTPRequestHandler):
    """A FastAPI-like server that publishes its routes at /openapi.json (and has no other)."""

    routes = b'{"paths": {"/server_instances": {}, "/readyz": {}}}'  # NeMo Gym's head server

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.routes)

    def log_message(self, *args: object) -> None:
        pass


def _serve_routes(routes: bytes) -> Iterator[str]:
    handler = type("Handler", (_Routes,), {"routes": routes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def head_server() -> Iterator[str]:
    yield from _serve_routes(_Routes.routes)


@pytest.fixture
def agent_server() -> Iterator[str]:
    yield from _serve_routes(b'{"paths": {"/run": {}, "/v1/responses": {}}}')


def test_agent_url_without_a_scheme() -> None:
    line = one_sentence_error(autotune("collect", "--synthetic", "3", "--agent-url", "host:11"))
    assert line == (
        "autotune: error: --agent-url host:11 needs http:// or https://, e.g. http://host:port."
    )


def test_an_agent_that_does_not_answer() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = one_sentence_error(autotune("collect", "--synthetic", "3", "--agent-url", url))
    assert line.startswith(f"autotune: error: cannot reach the NeMo Gym agent at {url} (")
    assert line.endswith("); start it (ng_run) or fix --agent-url.")


def test_a_server_without_run_is_not_an_agent(head_server: str) -> None:
    line = one_sentence_error(autotune("collect", "--synthetic", "3", "--agent-url", head_server))
    assert f"the server at {head_server} has no /run route, so it is not a NeMo Gym agent;" in line
    assert "/server_instances" in line


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--base-url", "http://h:1/v1"), "--agent-url and --base-url both say where rollouts go"),
        (("--verifier", "exact"), "the NeMo Gym agent verifies each rollout itself"),
        (("--tools", "null"), "the NeMo Gym agent calls its resources server's tools itself"),
    ],
)
def test_what_an_agent_does_itself_is_not_asked_of_autotune(
    flags: tuple[str, ...], says: str
) -> None:
    result = autotune("collect", "--synthetic", "3", "--agent-url", "http://h:1", *flags)
    assert says in one_sentence_error(result)


def test_diagnose_of_a_command_and_an_agent_at_once() -> None:
    result = autotune("diagnose", "--agent-url", "http://h:1", "--command", "x {parallelism}")
    line = one_sentence_error(result)
    assert "--command and --agent-url each name the collector to diagnose; pass one." in line


def test_metrics_url_that_cannot_be_read(agent_server: str) -> None:
    metrics = f"http://127.0.0.1:{free_port()}/metrics"
    result = autotune(
        "collect", "--synthetic", "3", "--agent-url", agent_server, "--metrics-url", metrics
    )
    line = one_sentence_error(result)
    assert line.startswith(f"autotune: error: cannot read --metrics-url {metrics} (")
    assert line.endswith("or drop it.")


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ("ftp://x", "--tools 'ftp://x' is neither a resources server's URL"),
        ("http://127.0.0.1:{port}", "cannot reach the resources server at http://127.0.0.1:"),
    ],
)
def test_tools_that_cannot_be_used(tools: str, says: str) -> None:
    tools = tools.format(port=free_port())
    result = autotune("collect", "--synthetic", "3", "--no-output", "--tools", tools)
    assert says in one_sentence_error(result)


def test_study_of_an_agent_without_its_url(tmp_path: Path) -> None:
    study = _study(tmp_path, "target: {kind: nemo-gym-agent}\n")
    line = one_sentence_error(autotune("sweep", str(study)))
    assert "kind: nemo-gym-agent needs agent_url" in line
