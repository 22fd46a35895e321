"""Issue 10: every fault of tests/faults.py through `autotune collect` and `autotune
diagnose`, run as a user runs them. Whatever the server does: no traceback, no saved row
that is not the server's whole answer, every failed rollout in the failures file with
its class, a run that ends in bounded time, and the documented exit code (0 ok; 1 a
runtime error such as a dead server, in one sentence; 3 collect made no rollout or
failed more than --max-failure-rate of them).

A fault hits the first attempt of every 4th prompt (retried, so the run completes and
exactly 5 of 20 rollouts retry once), or every attempt ("always": every rollout fails).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from autotune.rollout.store import failures_path
from autotune.rollout.workload import task_from_row
from autotune.servers.launcher import ServerSpec
from tests.faults import answer_text, fault_app, reasoning_text
from tests.helpers import (
    REPO,
    ServeApp,
    autotune,
    free_port,
    one_sentence_error,
    read_rows,
    server_process,
)

pytestmark = pytest.mark.slow  # about 90 s: 48 runs of the CLI as a subprocess

TASKS = 20
EVERY = 4  # 5 of the 20 prompts meet the fault
BOUND_S = 20.0  # a run that hangs (600 s timeout, Retry-After: 1e9) takes far longer
EXIT_OK, EXIT_ERROR, EXIT_FAILED = 0, 1, 3
IDLE = ("--idle-timeout", "0.5")  # a stream silent for half a second has stalled


DIALECTS = ("json_for_stream", "no_usage", "reasoning", "reasoning_only", "length")


@dataclass(frozen=True)
class Case:
    """One fault as the suite runs it: server share, CLI flags, what must come out."""

    fault: str
    failure_class: str | None  # of the faulted attempts; None: the fault is not a failure
    always: bool = False
    flags: tuple[str, ...] = ()
    collect_exit: int = EXIT_OK
    diagnose_exit: int = EXIT_OK
    label: str = ""  # for the test id, where the fault alone does not tell cases apart

    @property
    def id(self) -> str:
        return self.label or self.fault + ("-always" if self.always else "")


def _always(fault: str, failure_class: str, *flags: str) -> Case:
    return Case(fault, failure_class, True, flags, EXIT_FAILED, EXIT_ERROR)


CASES = [
    Case("truncate", "truncated"),
    Case("close", "connection"),
    Case("invalid_json", "bad_response"),
    Case("usage_str", "bad_response"),
    Case("choices_str", "bad_response"),
    Case("choice_int", "bad_response"),
    Case("message_null", "bad_response", flags=("--no-stream",)),
    Case("delta_str", "bad_response"),
    Case("chunk_list", "bad_response"),
    Case("stall", "timeout", flags=IDLE),
    # A non-streamed answer is silent until done: only --timeout can end its stall.
    Case("stall", "timeout", flags=("--no-stream", "--timeout", "1"), label="stall-no-stream"),
    Case("429_inf", "rate_limited"),
    Case("429_nan", "rate_limited"),
    Case("429_negative", "rate_limited"),
    Case("429_date", "rate_limited"),
    # Retry-After: 1e9 is honoured only up to the 30 s backoff ceiling; with no retry left
    # it costs nothing, and 5 failed of 20 is over the 5% failure share.
    Case("429_huge", "rate_limited", flags=("--max-retries", "0"), collect_exit=EXIT_FAILED),
    Case("long_line", None, always=True),
    _always("truncate", "truncated", "--max-retries", "1"),
    _always("close", "connection", "--max-retries", "1"),
    _always("choices_str", "bad_response", "--max-retries", "1"),
    _always("stall", "timeout", "--max-retries", "1", *IDLE),
    # Dialects: servers that answer every request their way, read as they mean it.
    *(Case(dialect, None, always=True) for dialect in DIALECTS),
    *(
        Case(dialect, None, always=True, flags=("--no-stream",), label=f"{dialect}-no-stream")
        for dialect in ("no_usage", "reasoning", "reasoning_only", "length")
    ),
]
# diagnose: every case but the all-failing ones, and one of those, where no rollout
# completes at the low parallelism (exit 1).
DIAGNOSED = [
    case
    for case in CASES
    if not case.always or case.failure_class is None or case.fault == "truncate"
]


def _response_text(row: dict[str, Any], kind: str = "message", part: str = "content") -> str:
    return "".join(
        piece["text"]
        for item in row["response"]["output"]
        if item["type"] == kind
        for piece in item[part]
    )


def _prompt(row: dict[str, Any]) -> str:
    """The prompt the server saw for this row (as the backend sends it)."""
    task = task_from_row(0, {"responses_create_params": row["responses_create_params"]})
    return str(task.messages[-1]["content"])


def check_output(
    output: Path, fault: str, failure_class: str | None, tasks: int = TASKS
) -> tuple[int, int]:
    """Every saved row whole and every failure classed, each rollout once; (saved, failed)."""
    rows = read_rows(output) if output.exists() else []
    failures = read_rows(failures_path(output)) if failures_path(output).exists() else []
    for row in rows:
        prompt = _prompt(row)
        assert _response_text(row) == answer_text(prompt, fault), "a corrupt row"
        thought = _response_text(row, "reasoning", "summary")
        assert thought == reasoning_text(prompt, fault), "reasoning not kept as it came"
        response = row["response"]
        assert response["status"] == ("incomplete" if fault == "length" else "completed")
        assert response["usage"]["output_tokens"] > 0
        assert isinstance(row["reward"], float)
        assert isinstance(row["_ng_task_index"], int) and row["_ng_rollout_index"] == 0
    for failure in failures:
        assert failure["failure_class"] == failure_class, failure
        assert isinstance(failure["_ng_task_index"], int) and failure["message"]
    keys = [row["_ng_task_index"] for row in rows + failures]
    assert len(keys) == len(set(keys)) and set(keys) <= set(range(tasks))
    return len(rows), len(failures)


def _outcome(case: str, command: str, result: subprocess.CompletedProcess[str], took: float,
             counts: str = "") -> None:  # fmt: skip
    """One line of the fault table (shown with `pytest -s`), then the common checks."""
    print(f"\nFAULT {case:22} {command:8} exit {result.returncode}  {counts:14} {took:5.1f} s")
    assert "Traceback" not in result.stderr, result.stderr
    assert took < BOUND_S, f"{command} took {took:.1f} s"


async def _run(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`autotune ARGS` in a thread, so the fault server on this loop keeps answering."""
    started = time.monotonic()
    quiet = ("--quiet",) if args[0] == "collect" else ()  # diagnose shows no progress bar
    result = await asyncio.to_thread(autotune, *args, *quiet, timeout=120)
    return result, time.monotonic() - started


async def _serve(serve_app: ServeApp, case: Case) -> str:
    return await serve_app(fault_app(case.fault, every=EVERY, always=case.always)) + "/v1"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
async def test_collect(case: Case, serve_app: ServeApp, tmp_path: Path) -> None:
    base_url = await _serve(serve_app, case)
    output = tmp_path / "rollouts.jsonl"
    tasks = 8 if case.always else TASKS
    result, took = await _run(
        "collect", "--base-url", base_url, "--synthetic", str(tasks), "--parallelism",
        str(tasks if case.always else 4), "--output-dir", str(tmp_path), "--json", *case.flags,
    )  # fmt: skip
    saved, failed = check_output(output, case.fault, case.failure_class, tasks)
    _outcome(case.id, "collect", result, took, f"{saved} done/{failed} failed")
    assert result.returncode == case.collect_exit, result.stderr
    if case.always and case.failure_class is not None:
        assert (saved, failed) == (0, tasks)
        return
    summary = orjson.loads(result.stdout)
    warned = "does not stream" in result.stderr
    assert warned == (case.fault == "json_for_stream" and "--no-stream" not in case.flags)
    if case.collect_exit == EXIT_FAILED:  # faulted rollouts had no retry left
        assert (saved, failed) == (TASKS - TASKS // EVERY, TASKS // EVERY)
        assert summary["errors_by_class"] == {case.failure_class: TASKS // EVERY}
    else:
        assert (saved, failed) == (tasks, 0)
        retried = {case.failure_class: TASKS // EVERY} if case.failure_class else {}
        assert summary["retries_by_class"] == retried


@pytest.mark.parametrize("case", DIAGNOSED, ids=lambda case: case.id)
async def test_diagnose(case: Case, serve_app: ServeApp, tmp_path: Path) -> None:
    """The classes diagnose saw are the fault's: retried or failed, summed over both
    probes' whole runs; a dialect read as it means costs no retry and no failure."""
    base_url = await _serve(serve_app, case)
    result, took = await _run(
        "diagnose", "--base-url", base_url, "--synthetic", str(TASKS), "--low", "2",
        "--high", "4", "--min-s", "0.1", "--max-s", "0.3", "--output-dir", str(tmp_path),
        *case.flags,
    )  # fmt: skip
    _outcome(case.id, "diagnose", result, took)
    assert result.returncode == case.diagnose_exit, result.stderr
    if case.diagnose_exit == EXIT_ERROR:
        assert case.failure_class in one_sentence_error(result)
        return
    assert result.stdout.startswith("verdict:")
    probes = orjson.loads((tmp_path / "diagnose.json").read_bytes())["probes"]
    seen = {
        failure_class
        for probe in probes
        for counts in (probe["errors_by_class"], probe["retries_by_class"])
        for failure_class, count in counts.items()
        if count
    }
    assert seen == ({case.failure_class} if case.failure_class else set()), seen


@pytest.mark.parametrize("model", [None, "fault/model"])
@pytest.mark.parametrize("command", ["collect", "diagnose"])
async def test_models_answered_as_a_list(
    model: str | None, command: str, serve_app: ServeApp, tmp_path: Path
) -> None:
    """/v1/models of the wrong shape lists no model: fine with --model, else one sentence."""
    base_url = await serve_app(fault_app("models_list")) + "/v1"
    flags = ("--model", model) if model else ()
    if command == "collect":
        flags += ("--output-dir", str(tmp_path), "--synthetic", "5")
    else:
        flags += ("--synthetic", "5", "--low", "1", "--high", "2", "--min-s", "0.1",
                  "--max-s", "0.2")  # fmt: skip
    result, took = await _run(command, "--base-url", base_url, *flags)
    _outcome(f"models_list{'' if model else '-no-model'}", command, result, took)
    if model is None:
        assert result.returncode == EXIT_ERROR
        assert "lists no model at /models; pass --model NAME." in one_sentence_error(result)
    else:
        assert result.returncode == EXIT_OK, result.stderr


@pytest.mark.parametrize("rpm", [None, "240"])
async def test_sliding_window_rate_limit(
    rpm: str | None, serve_app: ServeApp, tmp_path: Path
) -> None:
    """A limit of 10 a second that counts rejected attempts too: under it with --rpm (4 a
    second, at most 8 in any second with the limiter's burst) nothing is refused; without
    it, whatever fails is classed and the exit code follows the failure share."""
    base_url = await serve_app(fault_app("rate_limit", limit_per_s=10, window_s=1.0)) + "/v1"
    output = tmp_path / "rollouts.jsonl"
    flags = ("--rpm", rpm) if rpm else ()
    result, took = await _run(
        "collect", "--base-url", base_url, "--synthetic", str(TASKS), "--parallelism", "4",
        "--output-dir", str(tmp_path), "--json", *flags,
    )  # fmt: skip
    saved, failed = check_output(output, "none", "rate_limited")
    _outcome(f"rate_limit{'-rpm' if rpm else ''}", "collect", result, took,
             f"{saved} done/{failed} failed")  # fmt: skip
    assert saved + failed == TASKS
    assert result.returncode == (EXIT_FAILED if failed > TASKS * 0.05 else EXIT_OK)
    if rpm:
        assert orjson.loads(result.stdout)["retries_by_class"] == {}
        assert saved == TASKS


async def test_unreadable_max_tokens_under_tpm(serve_app: ServeApp, tmp_path: Path) -> None:
    """`max_output_tokens: "lots"` is the server's to judge; the token limiter's estimate
    falls back to its default instead of ending the run."""
    base_url = await serve_app(fault_app("none")) + "/v1"
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"responses_create_params": {"input": f"q{i}", "max_output_tokens": "lots"}}
            for i in range(5)]  # fmt: skip
    tasks.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    output = tmp_path / "rollouts.jsonl"
    result, took = await _run(
        "collect", "--base-url", base_url, "--input", str(tasks), "--tpm", "600000",
        "--verifier", "none", "--output-dir", str(tmp_path),
    )  # fmt: skip
    _outcome("max_tokens_lots-tpm", "collect", result, took)
    assert result.returncode == EXIT_OK, result.stderr
    rows = sorted(read_rows(output), key=lambda row: row["_ng_task_index"])  # as they ended
    assert [_response_text(row) for row in rows] == [answer_text(f"q{i}") for i in range(5)]


@pytest.mark.parametrize("command", ["collect", "diagnose"])
def test_server_that_dies(command: str, tmp_path: Path) -> None:
    """The server process exits after 10 requests. collect: one sentence, exit 1, every row
    collected before it whole. diagnose: the verdict says the server died (`unstable`),
    which --fail-on turns into exit 3."""
    port = free_port()
    spec = ServerSpec.local(
        [sys.executable, "-m", "tests.faults", "--fault", "die", "--die-after", "10",
         "--port", str(port)], port, startup_timeout_s=30,
    )  # fmt: skip
    output = tmp_path / "rollouts.jsonl"
    if command == "collect":
        flags = ("--parallelism", "4", "--output-dir", str(tmp_path), "--quiet")
    else:
        flags = ("--low", "2", "--high", "4", "--min-s", "0.5", "--fail-on", "unstable")
    with server_process(replace(spec, cwd=REPO)) as base_url:
        started = time.monotonic()
        result = autotune(command, "--base-url", base_url, "--synthetic", "60",
                          "--max-retries", "1", *flags, timeout=120)  # fmt: skip
        took = time.monotonic() - started
    saved, failed = check_output(output, "none", "connection", tasks=60)
    _outcome("die", command, result, took, f"{saved} done/{failed} failed" if saved else "")
    sentence = one_sentence_error(result)
    if command == "collect":
        assert result.returncode == EXIT_ERROR
        assert "the model server stopped answering" in sentence and "--resume" in sentence
        assert 0 < saved <= 10
    else:
        assert result.returncode == EXIT_FAILED
        assert "the verdict is unstable" in sentence
        assert "high probe stopped because the server died" in result.stdout
