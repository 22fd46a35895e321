"""One output convention: a command's files go in --output-dir (collect's by default in a
new reports/collect-<time>/), --json puts its result on stdout, and the old spellings
still work with a note."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from autotune.servers.launcher import ServerSpec
from tests.helpers import HANG_S, as_in_a_terminal, autotune, read_rows, server_process

FAST_DIAGNOSE = ("--synthetic", "40", "--low", "2", "--high", "4", "--min-s", "0.2", "--max-s", "1")


@pytest.fixture(scope="module")
def null_url() -> Iterator[str]:
    with server_process(ServerSpec.null()) as url:
        yield url


def _collect(null_url: str, cwd: Path, *flags: str) -> tuple[str, str]:
    result = autotune(
        "collect", "--synthetic", "20", "--base-url", null_url, "--model", "null",
        "--verifier", "exact", "--parallelism", "4", *flags, cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


def test_collect_keeps_its_rollouts_in_a_new_folder_each_run(null_url: str, tmp_path: Path) -> None:
    stdout, stderr = _collect(null_url, tmp_path, "--json")
    _collect(null_url, tmp_path, "--quiet")
    runs = sorted((tmp_path / "reports").iterdir())
    assert len(runs) == 2 and all(re.fullmatch(r"collect-\d{8}-\d{6}(-\d+)?", r.name) for r in runs)
    first = next(run for run in runs if run.name in stderr)  # the note said where
    assert len(read_rows(first / "rollouts.jsonl")) == 20
    assert (first / "rollouts_run.json").exists()
    summary = orjson.loads(stdout)  # --json: stdout holds the summary and nothing else
    assert orjson.loads((first / "summary.json").read_bytes()) == summary
    assert (
        summary["completed"] == 20 and summary["output"] == f"reports/{first.name}/rollouts.jsonl"
    )


def test_no_output_writes_nothing(null_url: str, tmp_path: Path) -> None:
    stdout, _ = _collect(null_url, tmp_path, "--no-output")
    assert "20 done" in stdout
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_before_its_first_row_leaves_no_folder(tmp_path: Path) -> None:
    result = autotune("collect", "--synthetic", "3", "--base-url", "http://127.0.0.1:9/v1",
                      cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert list(tmp_path.iterdir()) == []


def test_the_old_output_spelling_still_writes_there_with_a_note(
    null_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "old" / "rows.jsonl"
    _, stderr = _collect(null_url, tmp_path, "--output", str(out))
    assert len(read_rows(out)) == 20
    assert (
        "autotune: note: --output FILE is deprecated and goes in the next release; use "
        "--output-dir DIR (rollouts go to DIR/rollouts.jsonl)." in stderr
    )
    assert not (tmp_path / "reports").exists()


def test_collect_report_without_a_folder_lands_in_the_output_dir(
    null_url: str, tmp_path: Path
) -> None:
    _collect(null_url, tmp_path, "--output-dir", "run", "--report", "--quiet")
    assert {p.name for p in (tmp_path / "run").iterdir()} >= {
        "rollouts.jsonl", "summary.json", "collect.json", "index.html",
    }  # fmt: skip


def test_merge_takes_shard_folders_and_writes_into_its_output_dir(
    null_url: str, tmp_path: Path
) -> None:
    for shard in ("0/2", "1/2"):
        _collect(null_url, tmp_path, "--shard", shard, "--output-dir", f"s{shard[0]}", "-q")
    result = autotune("merge", "s0", "s1", "--output-dir", "all", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout) == {
        "output": "all/rollouts.jsonl", "merged": 20, "duplicates": 0,
    }  # fmt: skip
    assert len(read_rows(tmp_path / "all" / "rollouts.jsonl")) == 20


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(the --output-dir of a diagnosis run with --json, its stdout, its stderr)."""
    directory = tmp_path_factory.mktemp("diagnose") / "out"
    result = autotune("diagnose", *FAST_DIAGNOSE, "--json", "--output-dir", str(directory))
    assert result.returncode == 0, result.stderr
    return directory, result.stdout, result.stderr


@pytest.mark.slow
def test_diagnose_json_is_the_result_on_stdout_and_output_dir_keeps_it(
    diagnosed: tuple[Path, str, str],
) -> None:
    directory, stdout, _ = diagnosed
    result = orjson.loads(stdout)
    assert result["kind"] == "diagnose" and result["verdict"]["verdict"]
    assert orjson.loads((directory / "diagnose.json").read_bytes()) == result
    assert (directory / "index.html").exists()


@pytest.mark.slow
def test_report_rebuilds_into_its_output_dir_and_lists_what_it_wrote(
    diagnosed: tuple[Path, str, str], tmp_path: Path
) -> None:
    directory, _, _ = diagnosed
    result = autotune("report", str(directory), "--output-dir", str(tmp_path / "r"), "--json")
    assert result.returncode == 0, result.stderr
    written = orjson.loads(result.stdout)["written"]
    assert written == [str(tmp_path / "r" / "diagnose.json"), str(tmp_path / "r" / "index.html")]
    assert all(Path(path).exists() for path in written)


@pytest.mark.slow
def test_diagnose_old_json_path_still_saves_there_with_a_note(tmp_path: Path) -> None:
    saved = tmp_path / "d.json"
    result = autotune("diagnose", *FAST_DIAGNOSE, "--json", str(saved))
    assert result.returncode == 0, result.stderr
    assert orjson.loads(saved.read_bytes())["kind"] == "diagnose"
    assert "autotune: note: --json PATH is deprecated" in result.stderr
    assert result.stdout.startswith("SIMULATED")  # the text, as before


def test_an_interrupted_run_names_its_folder_and_resumes_there(
    null_url: str, tmp_path: Path
) -> None:
    args = [
        sys.executable, "-m", "autotune", "collect", "--synthetic", "200000", "--base-url",
        null_url, "--model", "null", "--verifier", "exact", "--parallelism", "4",
    ]  # fmt: skip
    with subprocess.Popen(
        args, cwd=tmp_path, stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal
    ) as run:
        deadline = time.monotonic() + HANG_S
        rows = list(tmp_path.glob("reports/collect-*/rollouts.jsonl"))
        while not (rows and rows[0].stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.1)
            rows = list(tmp_path.glob("reports/collect-*/rollouts.jsonl"))
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    folder = f"reports/{rows[0].parent.name}"
    assert (
        f"autotune: interrupted; every finished rollout is in {folder}/ "
        f"(rerun with --output-dir {folder} --resume)." in stderr
    )
    kept = len(read_rows(rows[0]))
    resumed = autotune(args[3], "--synthetic", str(kept + 5), *args[6:],
                       "--output-dir", folder, "--resume", "-q", cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert len(read_rows(rows[0])) == kept + 5


# A child that writes `size` bytes into a pipe nobody reads yet; once the pipe is full, a
# thread signals the writing thread (SIGCHLD does so in a real run) and says so on stderr.
SHORT_WRITE_CHILD = """
import fcntl, os, signal, sys, termios, threading
from autotune.cli.common import print_result

signal.signal(signal.SIGUSR1, lambda *_: None)
main = threading.get_ident()
capacity = fcntl.fcntl(1, fcntl.F_GETPIPE_SZ)

def interrupt_once_full() -> None:
    while int.from_bytes(fcntl.ioctl(1, termios.FIONREAD, b"    "), "little") < capacity:
        threading.Event().wait(0.001)
    signal.pthread_kill(main, signal.SIGUSR1)
    os.write(2, b"signalled\\n")

threading.Thread(target=interrupt_once_full, daemon=True).start()
{write}("x" * {size})
"""


@pytest.mark.parametrize("write", ["print_result", "print"])
def test_a_result_interrupted_while_the_pipe_is_full_arrives_whole(write: str) -> None:
    """A signal that lands while a large result waits on a full pipe cuts the write short;
    `print` drops the rest with exit status 0 (a 140 KB diagnose JSON arrived as 64 KiB),
    the results' writer goes on until every byte is written."""
    size = 300_000
    code = SHORT_WRITE_CHILD.format(write=write, size=size)
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as child:
        assert child.stderr is not None and child.stdout is not None
        assert child.stderr.readline() == b"signalled\n"  # read nothing before it
        received = child.stdout.read()
        child.wait(timeout=30)
    if write == "print":  # the defect the results' writer exists for, shown on this Python
        assert len(received) < size
    else:
        assert len(received) == size + 1 and child.returncode == 0
