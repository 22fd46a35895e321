"""Mistakes a user can make end as one sentence (cause and fix), never a traceback."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from autotune.store import completed_keys
from autotune.workload import rollout_key
from tests.helpers import autotune, one_sentence_error

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
    out = tmp_path / "new" / "dir" / "m.jsonl"
    result = autotune("merge", str(shard), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == shard.read_bytes()


def test_merge_into_a_path_under_a_file(tmp_path: Path) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0))
    line = one_sentence_error(autotune("merge", str(shard), "-o", str(shard / "m.jsonl")))
    assert f"cannot write {shard / 'm.jsonl'}" in line


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_merge_of_a_shard_that_fails_to_read(tmp_path: Path) -> None:
    # /proc/self/mem opens, then fails the first read (EIO), as a bad disk would.
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0))
    out = tmp_path / "m.jsonl"
    line = one_sentence_error(autotune("merge", str(shard), "/proc/self/mem", "-o", str(out)))
    assert f"cannot merge into {out}" in line
    assert not out.exists()


@pytest.mark.skipif(ROOT, reason="root reads any file")
def test_merge_of_an_unreadable_shard(tmp_path: Path) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_bytes(_rollout(0))
    shard.chmod(0)
    out = tmp_path / "m.jsonl"
    line = one_sentence_error(autotune("merge", str(shard), "-o", str(out)))
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
    line = one_sentence_error(autotune("collect", "--synthetic", "3", "--output", str(out)))
    assert f"cannot write {out}" in line


# -- 6. --resume never cuts a file autotune did not write ---------------------------------


def test_resume_onto_the_task_file_leaves_it_untouched(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    content = b'{"prompt": "a"}\n{"prompt": "b"}'  # no newline after the last line
    tasks.write_bytes(content)
    line = one_sentence_error(
        autotune("collect", "--input", str(tasks), "--output", str(tasks), "--resume")
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
    out = tmp_path / "out.jsonl"
    out.write_bytes(content)
    line = one_sentence_error(
        autotune("collect", "--synthetic", "3", "--output", str(out), "--resume")
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
    started = time.monotonic()
    line = one_sentence_error(autotune("diagnose", "--json", str(tmp_path)))
    assert f"--json {tmp_path} is a directory" in line
    assert time.monotonic() - started < 10  # defaults measure for up to 2 × 20 s


def test_diagnose_json_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = one_sentence_error(autotune("diagnose", "--json", str(blocker / "d.json")))
    assert f"{blocker} is a file" in line


def test_diagnose_report_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for report in (blocker, blocker / "sub"):
        line = one_sentence_error(autotune("diagnose", "--report", str(report)))
        assert f"--report {report} cannot be written: {blocker} is a file" in line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_diagnose_write_failure_keeps_the_result() -> None:
    result = autotune("diagnose", *FAST_DIAGNOSE, "--json", "/dev/full")
    line = one_sentence_error(result)
    assert "could not write /dev/full (No space left on device)" in line
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
