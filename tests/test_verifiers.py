"""Verifiers: one contract suite over every kind, then each kind's own behaviour.

The behaviour tests replay NeMo Gym's own example rollouts (../shared/data/nemo-gym):
given the same response, a verifier must give the reward and extracted fields NeMo
Gym's resources server recorded.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from autotune.errors import UsageError
from autotune.results.responses import build_response
from autotune.verifiers import VERIFIERS, Verifier, VerifierOptions, load_verifier
from autotune.verifiers.builtin import answers_match, extract_boxed
from autotune.verifiers.http import VerifierHTTPError
from autotune.verifiers.pool import compare_output, default_workers, extract_code
from tests.helpers import ServeApp

DATA = Path(__file__).resolve().parents[2] / "shared/data/nemo-gym"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "verifiers"
SCORES = FIXTURES / "autotune_test_scores.py"
needs_data = pytest.mark.skipif(
    not DATA.is_dir(), reason="the shared NeMo Gym example data is not beside this checkout"
)


def respond(text: str) -> dict[str, Any]:
    """A Responses-API `response` holding `text`, as the engine stores it."""
    return build_response(
        response_id="t",
        model="m",
        text=text,
        tool_calls=None,
        input_tokens=1,
        output_tokens=1,
        finish_reason="stop",
        request={},
    )


def row(text: str, **fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "q"}, "response": respond(text), **fields}


def read_jsonl(name: str) -> list[dict[str, Any]]:
    with (DATA / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def prompt_of(item: dict[str, Any]) -> str:
    content = item["responses_create_params"]["input"][0]["content"]
    return content if isinstance(content, str) else content[0]["text"]


def replayed(dataset: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(task row + the rollout's response, the rollout) for each example rollout.

    Rollout files drop some task fields (extraction_mode, options, unit tests), so
    each rollout is joined to its task by prompt text.
    """
    tasks = {prompt_of(task): task for task in read_jsonl(f"{dataset}.example.jsonl")}
    pairs = []
    for rollout in read_jsonl(f"{dataset}.example_rollouts.jsonl"):
        task = tasks[prompt_of(rollout)]
        pairs.append(({**task, "response": rollout["response"]}, rollout))
    return pairs


# --- an in-process NeMo Gym style resources server ---------------------------------


async def _verify_handler(request: web.Request) -> web.Response:
    body = await request.json()
    text = body["response"]["output"][-1]["content"][0]["text"]
    reward = 1.0 if text.strip() == body.get("expected_answer") else 0.0
    # NeMo Gym echoes the request; the verifier must not copy the echo into the row.
    return web.json_response({**body, "reward": reward, "judge": "in-process"})


def _fixed(response: web.Response) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return response

    return handler


def _make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/verify", _verify_handler)
    app.router.add_post("/fails", _fixed(web.Response(status=503, text="overloaded")))
    app.router.add_post("/text", _fixed(web.Response(text="reward: 1")))
    app.router.add_post("/noreward", _fixed(web.json_response({"score": 1})))
    return app


@pytest.fixture
async def server_url(serve_app: ServeApp) -> str:
    return await serve_app(_make_app())


# --- the contract, over every kind --------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One verifier kind: how to load it, a row it can verify, what it must add."""

    spec: str
    row: dict[str, Any]
    fields: tuple[str, ...] = ()
    options: VerifierOptions = field(default_factory=VerifierOptions)
    capacity: int | None = None
    http: bool = False


CODE_ROW = row(
    "```python\nprint(sum(map(int, input().split())))\n```",
    verifier_metadata={"unit_tests": {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}},
)
TWO = VerifierOptions(workers=2)

CASES = {
    "none": Case("none", row("anything"), capacity=None),
    "exact": Case("exact", row(" 42 ", expected_answer=42), ("extracted_answer",)),
    "boxed": Case("boxed", row(r"so \boxed{42}", expected_answer="42"), ("extracted_answer",)),
    "mcqa": Case(
        "mcqa",
        row(r"\boxed{B}", expected_answer="B", options=[{"A": "x"}, {"B": "y"}]),
        ("extracted_answer",),
    ),
    "code": Case(
        "code",
        CODE_ROW,
        ("extracted_model_output", "extracted_model_code", "result", "metadata"),
        TWO,
        2,
    ),
    "synthetic-inline": Case("synthetic", row("hello"), capacity=None),
    "synthetic-pool": Case("synthetic", row("hello"), (), VerifierOptions(2, cost_ms=5), 2),
    "file-callable": Case(f"{SCORES}:with_fields", row("x"), ("note",), TWO, 2),
    "module-callable": Case("autotune_test_scores:half", row("x"), (), TWO, 2),
    "http": Case("/verify", row("42", expected_answer="42"), ("judge",), capacity=64, http=True),
}


async def _load(case: Case, server_url: str, session: aiohttp.ClientSession) -> Verifier:
    spec = server_url + case.spec if case.http else case.spec
    return await load_verifier(spec, case.options, session if case.http else None)


@pytest.mark.parametrize("kind", CASES)
async def test_contract(
    kind: str,
    server_url: str,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))  # for the package.module:function form
    case = CASES[kind]
    verifier = await _load(case, server_url, session)
    try:
        assert isinstance(verifier.name, str) and verifier.name
        assert verifier.capacity == case.capacity
        results = await asyncio.gather(*(verifier.verify(dict(case.row)) for _ in range(4)))
        first = results[0]
        assert all(result["reward"] == first["reward"] for result in results)  # deterministic
        reward = first["reward"]
        if case.spec == "none":
            assert reward is None
        else:
            assert type(reward) is float and 0.0 <= reward <= 1.0
        for name in case.fields:
            assert name in first, f"{kind} did not add {name}"
        assert "response" not in first and "responses_create_params" not in first
    finally:
        await verifier.aclose()
    await verifier.aclose()  # idempotent


def test_every_named_kind_has_a_contract_case() -> None:
    assert {case.spec for case in CASES.values()} >= set(VERIFIERS)


async def test_pool_capacity_defaults_to_usable_cpus() -> None:
    verifier = await load_verifier("synthetic", VerifierOptions(cost_ms=1))
    try:
        assert verifier.capacity == default_workers()
    finally:
        await verifier.aclose()


# --- exact --------------------------------------------------------------------------


async def test_exact_compares_stripped_text_with_case_as_the_row_says() -> None:
    verifier = await load_verifier("exact")
    assert (await verifier.verify(row("Paris\n", expected_answer="Paris")))["reward"] == 1.0
    assert (await verifier.verify(row("paris", expected_answer="Paris")))["reward"] == 0.0
    loose = row("paris", expected_answer="Paris", case_sensitive=False)
    assert await verifier.verify(loose) == {"reward": 1.0, "extracted_answer": "paris"}
    assert (await verifier.verify(row("x")))["reward"] == 0.0  # no expected_answer


# --- boxed (string_match) ------------------------------------------------------------


@needs_data
async def test_boxed_matches_nemo_gym_string_match_rollouts() -> None:
    verifier = await load_verifier("boxed")
    pairs = replayed("string_match")
    assert len(pairs) == 5
    for task, rollout in pairs:
        result = await verifier.verify(task)
        assert result["reward"] == rollout["reward"], task["extraction_mode"]
        assert result["extracted_answer"] == rollout["extracted_answer"]


@needs_data
async def test_boxed_grades_math_with_judge_rows() -> None:
    verifier = await load_verifier("boxed")
    tasks = read_jsonl("math_with_judge.example.jsonl")
    for task in tasks:
        expected = task["expected_answer"]
        inner = expected.removeprefix(r"\(").removesuffix(r"\)")  # judges get LaTeX-wrapped gold
        text = f"Working...\nSo the answer is $\\boxed{{ {inner} }}$."
        result = await verifier.verify({**task, "response": respond(text)})
        assert result["reward"] == 1.0, (expected, result)
        wrong = await verifier.verify({**task, "response": respond(r"\boxed{7}")})
        assert wrong == {"reward": 0.0, "extracted_answer": "7"}


def test_extract_boxed_takes_the_last_balanced_box() -> None:
    assert extract_boxed(r"\boxed{1} then \boxed{\frac{a}{b}}") == r"\frac{a}{b}"
    assert extract_boxed(r"\boxed{\text{ Paris }}") == "Paris"
    assert extract_boxed(r"\boxed{2} and an unclosed \boxed{3") == "2"
    assert extract_boxed("no box") is None


async def test_boxed_extraction_modes() -> None:
    verifier = await load_verifier("boxed")
    cases = [  # mode, answer text, expected_answer, extracted, reward
        ("final_answer", "blah\nFinal answer: 15.", "15", "15", 1.0),
        ("final_answer", "**Final answer:** 15", "15", "15", 1.0),
        ("final_answer", r"no marker but \boxed{15}", "15", "15", 1.0),
        ("last_line", "thinking\n\n  Pacific   Ocean \n", "pacific ocean", "Pacific   Ocean", 1.0),
        ("full_response", "  1,000  ", "1000", "1,000", 1.0),
        ("boxed", "nothing boxed", "15", None, 0.0),
        ("boxed", r"\boxed{16}", "15", "16", 0.0),
    ]
    for mode, text, expected, extracted, reward in cases:
        result = await verifier.verify(row(text, expected_answer=expected, extraction_mode=mode))
        assert result == {"reward": reward, "extracted_answer": extracted}, (mode, text)
    strict = row(r"\boxed{paris}", expected_answer="Paris", case_sensitive=True)
    assert (await verifier.verify(strict))["reward"] == 0.0
    loose = row(r"\boxed{paris}", expected_answer="Paris")
    assert (await verifier.verify(loose))["reward"] == 1.0


def test_answers_match_normalises_without_guessing() -> None:
    assert answers_match("  new   york. ", "New York", fold=True)
    assert answers_match(r"$\sqrt{2}$", r"\(\sqrt{2}\)", fold=True)
    assert answers_match("12,000", "12000.0", fold=True)
    assert not answers_match("12", "13", fold=True)
    assert not answers_match("Paris", "paris", fold=False)


# --- mcqa ----------------------------------------------------------------------------


@needs_data
async def test_mcqa_matches_nemo_gym_mcqa_rollouts() -> None:
    verifier = await load_verifier("mcqa")
    pairs = replayed("mcqa")
    assert len(pairs) == 5
    assert any(rollout["extracted_answer"] is None for _, rollout in pairs)
    for task, rollout in pairs:
        result = await verifier.verify(task)
        assert result == {
            "reward": rollout["reward"],
            "extracted_answer": rollout["extracted_answer"],
        }


async def test_mcqa_lenient_modes() -> None:
    verifier = await load_verifier("mcqa")
    options = [{"A": "Karyotyping"}, {"B": "Polymerase Chain Reaction (PCR)"}]

    async def pick(text: str, mode: str = "lenient_boxed") -> str | None:
        result = await verifier.verify(
            row(text, expected_answer="B", options=options, grading_mode=mode)
        )
        return result["extracted_answer"]

    spelled_out = r"\boxed{B: Polymerase chain reaction (PCR)}"
    assert await pick(spelled_out) == "B"
    assert await pick(spelled_out, "strict_single_letter_boxed") is None
    assert await pick("Answer: b", "lenient_answer_colon") == "B"
    assert await pick("Answer: Karyotyping.", "lenient_answer_colon") == "A"
    assert await pick(" (B) ", "lenient_answer_colon") == "B"
    assert await pick(r"\boxed{Z}", "lenient_boxed") is None  # not an option letter
    assert await pick("I cannot tell") is None


# --- code (code_gen) -----------------------------------------------------------------


@pytest.mark.slow
@needs_data
async def test_code_matches_nemo_gym_code_gen_rollouts() -> None:
    verifier = await load_verifier("code", TWO)
    try:
        pairs = replayed("code_gen")
        results = await asyncio.gather(*(verifier.verify(task) for task, _ in pairs))
    finally:
        await verifier.aclose()
    assert {rollout["reward"] for _, rollout in pairs} == {0.0, 1.0}
    for result, (_, rollout) in zip(results, pairs, strict=True):
        for name in ("reward", "result", "extracted_model_output", "extracted_model_code"):
            assert result[name] == rollout[name], name
        ours = {k: v for k, v in result["metadata"].items() if k != "execution time"}
        theirs = {k: v for k, v in rollout["metadata"].items() if k != "execution time"}
        assert ours == theirs


async def test_code_reports_runtime_errors_timeouts_and_missing_code() -> None:
    tests = {"unit_tests": json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})}  # as text
    verifier = await load_verifier("code", VerifierOptions(workers=2, timeout_s=1.0))
    try:
        crash, hang, prose = await asyncio.gather(
            verifier.verify(row("```python\nraise KeyError('k')\n```", verifier_metadata=tests)),
            verifier.verify(row("```python\nwhile True: pass\n```", verifier_metadata=tests)),
            verifier.verify(row("I would print 1.", verifier_metadata=tests)),
        )
    finally:
        await verifier.aclose()
    assert crash["result"] == [-4] and crash["metadata"]["error"] == "KeyError: 'k'"
    assert hang["result"] == [-3] and hang["metadata"]["error_message"] == "Time Limit Exceeded"
    assert prose["extracted_model_code"] is None and prose["reward"] == 0.0
    assert prose["extracted_model_output"] == "I would print 1."


def test_code_helpers() -> None:
    text = "```text\nnot code\n```\n```python\nprint(1)\n```\n```\nplain\n```"
    assert extract_code(text) == "print(1)"
    assert extract_code("```\nx = 1\n```") == "x = 1"
    assert extract_code("no fences") is None
    assert compare_output("1.0 2\n\n", "1 2.00") is None
    assert compare_output("3\n", "4\n") == "Wrong answer at output_line_idx=0: 3 != 4"


# --- synthetic -----------------------------------------------------------------------


async def test_synthetic_reward_is_a_deterministic_bit() -> None:
    inline = await load_verifier("synthetic")
    rewards = {
        text: (await inline.verify(row(text)))["reward"] for text in ("a", "b", "c", "d", "e")
    }
    assert set(rewards.values()) == {0.0, 1.0}
    pooled = await load_verifier("synthetic", VerifierOptions(workers=1, cost_ms=50))
    try:
        started = time.perf_counter()
        for text, reward in rewards.items():
            assert (await pooled.verify(row(text)))["reward"] == reward
        assert time.perf_counter() - started >= 5 * 0.045  # really burned the CPU
    finally:
        await pooled.aclose()


# --- user callables in the pool -----------------------------------------------------


async def test_pool_runs_two_cpu_heavy_calls_at_once() -> None:
    """Two calls of 0.4 CPU-seconds each, in two worker processes at the same time: each
    started before the other ended. (Not judged by the wall time the pair took: a core
    taken by another process would make two parallel calls look serial.)"""
    verifier = await load_verifier(f"{SCORES}:cpu_burn", TWO)
    try:
        await asyncio.gather(verifier.verify(row("x")), verifier.verify(row("x")))  # warm
        first, second = await asyncio.gather(verifier.verify(row("x")), verifier.verify(row("x")))
    finally:
        await verifier.aclose()
    # each really burned its 0.4 s of CPU, in a process of its own
    assert all(call["ended"] - call["started"] >= 0.35 for call in (first, second))
    assert first["pid"] != second["pid"]
    overlap = min(first["ended"], second["ended"]) - max(first["started"], second["started"])
    assert overlap > 0, f"the second call started {-overlap:.2f} s after the first ended"


async def test_pool_exceptions_reach_the_caller_with_their_class() -> None:
    verifier = await load_verifier(f"{SCORES}:raises_value_error", VerifierOptions(workers=1))
    try:
        with pytest.raises(ValueError, match="this row is bad"):
            await verifier.verify(row("x"))
    finally:
        await verifier.aclose()
    verifier = await load_verifier(f"{SCORES}:raises_custom", VerifierOptions(workers=1))
    try:
        with pytest.raises(Exception, match="custom failure") as caught:
            await verifier.verify(row("x"))
        assert type(caught.value).__name__ == "CustomVerifierError"
    finally:
        await verifier.aclose()


async def test_pool_survives_exceptions_it_cannot_rebuild_and_dead_workers() -> None:
    for function, message in [("raises_unpicklable", "TwoArgumentError: 1 and 2"),
                              ("exits", "SystemExit: 3")]:  # fmt: skip
        verifier = await load_verifier(f"{SCORES}:{function}", VerifierOptions(workers=1))
        try:
            for _ in range(2):  # the pool still works after the first
                with pytest.raises(RuntimeError, match=message):
                    await verifier.verify(row("x"))
        finally:
            await verifier.aclose()
    verifier = await load_verifier(f"{SCORES}:dies", VerifierOptions(workers=1))
    try:
        with pytest.raises(BrokenProcessPool):
            await verifier.verify(row("x"))
        with pytest.raises(BrokenProcessPool):  # a fresh pool, a fresh death
            await verifier.verify(row("x"))
    finally:
        await verifier.aclose()


async def test_pool_result_shapes() -> None:
    verifier = await load_verifier(f"{SCORES}:returns_text", VerifierOptions(workers=1))
    try:
        with pytest.raises(TypeError, match="returned str"):
            await verifier.verify(row("x"))
    finally:
        await verifier.aclose()


async def test_a_pool_cancelled_while_starting_stops_its_workers() -> None:
    """A Ctrl-C during start-up cancels `load_verifier` before any caller holds the pool
    to close it: the pool closes itself, or its workers outlive the run and its open
    pipes race concurrent.futures' exit hook ("Bad file descriptor" at exit)."""
    starting = asyncio.create_task(
        load_verifier("synthetic", VerifierOptions(workers=2, cost_ms=5))
    )
    await asyncio.sleep(0)  # it has submitted its warm-up calls; the workers are starting
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert multiprocessing.active_children() == []


async def test_slow_callable_times_out_and_aclose_does_not_hang() -> None:
    options = VerifierOptions(workers=1, timeout_s=0.3)
    verifier = await load_verifier(f"{SCORES}:sleeps", options)
    with pytest.raises(TimeoutError, match=r"0\.3 s"):
        await verifier.verify(row("x"))
    started = time.perf_counter()
    await verifier.aclose()  # its worker is still asleep in user code
    assert time.perf_counter() - started < 3.0


async def test_a_stuck_worker_is_replaced_so_later_calls_run() -> None:
    options = VerifierOptions(workers=1, timeout_s=0.5)
    verifier = await load_verifier(f"{SCORES}:hangs_on_stuck", options)
    try:
        with pytest.raises(TimeoutError, match=r"longer than 0\.5 s .*its worker was replaced"):
            await verifier.verify(row("x", stuck=True))
        for _ in range(3):  # before, each queued behind the stuck worker and timed out too
            assert (await verifier.verify(row("x")))["reward"] == 1.0
    finally:
        await verifier.aclose()


async def test_a_replacement_workers_start_up_is_not_counted_against_the_next_call(
    tmp_path: Path,
) -> None:
    """On a loaded machine a fresh worker can take longer to start than the timeout; the
    call after a stuck one then timed out too, though its verification took no time."""
    module = tmp_path / "slow_start.py"
    module.write_text(
        "import multiprocessing, time\n"
        "if multiprocessing.parent_process() is not None:  # a worker, not the parent\n"
        "    time.sleep(1.5)\n"
        "def score(row):\n"
        "    if row.get('stuck'):\n"
        "        time.sleep(3600)\n"
        "    return 1.0\n"
    )
    verifier = await load_verifier(f"{module}:score", VerifierOptions(workers=1, timeout_s=1.0))
    try:
        with pytest.raises(TimeoutError, match="its worker was replaced"):
            await verifier.verify({"stuck": True})
        assert (await verifier.verify({}))["reward"] == 1.0
    finally:
        await verifier.aclose()


async def test_a_stuck_worker_dies_once_its_pools_other_calls_end(tmp_path: Path) -> None:
    options = VerifierOptions(workers=2, timeout_s=1.0)
    verifier = await load_verifier(f"{SCORES}:hangs_on_stuck", options)
    pid_file = tmp_path / "stuck.pid"
    try:
        stuck = asyncio.ensure_future(verifier.verify(row("x", stuck=True, pid_file=str(pid_file))))
        await asyncio.sleep(0.7)
        # In flight beside the stuck call when that one times out: it is not lost.
        napping = asyncio.ensure_future(verifier.verify(row("x", nap=0.6)))
        with pytest.raises(TimeoutError):
            await stuck
        assert (await napping)["reward"] == 1.0
        stuck_pid = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while _alive(stuck_pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not _alive(stuck_pid), "the stuck worker outlived its pool's other calls"
    finally:
        await verifier.aclose()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_timeout_the_function_raises_is_its_own() -> None:
    options = VerifierOptions(workers=1, timeout_s=5.0)
    verifier = await load_verifier(f"{SCORES}:raises_timeout", options)
    try:
        with pytest.raises(TimeoutError, match="the grader's own deadline"):
            await verifier.verify(row("x"))
    finally:
        await verifier.aclose()


CTRL_C_IN_A_TERMINAL = """
import asyncio, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, not a CI job
from autotune.verifiers import VerifierOptions, load_verifier

async def main():
    verifier = await load_verifier(sys.argv[1], VerifierOptions(workers=1))
    try:
        pid = (await verifier.verify({}))["pid"]
        os.kill(pid, signal.SIGINT)  # what Ctrl-C sends every process of the group
        await asyncio.sleep(0.3)
        print(pid, (await verifier.verify({}))["pid"])
    finally:
        await verifier.aclose()

asyncio.run(main())
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_idle_workers_ignore_ctrl_c() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_A_TERMINAL, f"{SCORES}:with_fields"],
        capture_output=True, text=True, timeout=60, cwd=FIXTURES.parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == after  # the same worker answered: Ctrl-C did not kill it
    assert "KeyboardInterrupt" not in done.stderr


WORKER_BIRTH_HANDLER = """
import signal
from concurrent.futures import ProcessPoolExecutor
from autotune.processes.lifeline import forkserver_context

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=forkserver_context()) as pool:
        print(pool.submit(signal.getsignal, signal.SIGINT).result())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the forkserver start method")
def test_workers_are_born_ignoring_ctrl_c() -> None:
    # No initializer has run yet while a new worker imports: a Ctrl-C then must not
    # print a KeyboardInterrupt traceback from inside the worker.
    done = subprocess.run(
        [sys.executable, "-c", WORKER_BIRTH_HANDLER],
        capture_output=True, text=True, timeout=60, cwd=FIXTURES.parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(signal.SIG_IGN)


# --- http ----------------------------------------------------------------------------


async def test_http_errors_name_the_status(server_url: str, session: aiohttp.ClientSession) -> None:
    for path, message in [
        ("/fails", "HTTP 503: overloaded"),
        ("/text", "HTTP 200 with a body that is not JSON"),
        ("/noreward", "without a 'reward' field"),
        ("/missing", "HTTP 404"),
    ]:
        verifier = await load_verifier(server_url + path, VerifierOptions(), session)
        with pytest.raises(VerifierHTTPError, match=message):
            await verifier.verify(row("x"))
        await verifier.aclose()
    assert not session.closed  # the caller's session is the caller's


async def test_http_without_a_session_opens_and_closes_its_own(server_url: str) -> None:
    verifier = await load_verifier(server_url + "/verify", VerifierOptions(workers=3))
    assert verifier.capacity == 3
    result = await verifier.verify(row("no", expected_answer="yes"))
    assert result == {"reward": 0.0, "expected_answer": "yes", "judge": "in-process"}
    await verifier.aclose()
    await verifier.aclose()


# --- specs that cannot be used -------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "options", "fragment"),
    [
        ("nonsense", VerifierOptions(), "unknown verifier 'nonsense': use one of none"),
        ("", VerifierOptions(), "unknown verifier ''"),
        ("missing.py:score", VerifierOptions(), "missing.py does not exist"),
        (f"{SCORES}:nope", VerifierOptions(), "has no function 'nope'; check the name"),
        (f"{SCORES}:NOT_A_FUNCTION", VerifierOptions(), "is not a function but a int value"),
        (f"{SCORES}:", VerifierOptions(), "with a function name after the colon"),
        (str(SCORES), VerifierOptions(), "names a file but no function"),
        (f"{FIXTURES}/broken_import.py:score", VerifierOptions(), "RuntimeError: this module"),
        ("no_such_module_xyz:fn", VerifierOptions(), "module no_such_module_xyz cannot be"),
        ("http://:8080/verify", VerifierOptions(), "not a usable URL"),
        ("exact", VerifierOptions(workers=0), "workers must be at least 1"),
    ],
)
async def test_unusable_specs_raise_one_sentence(
    spec: str, options: VerifierOptions, fragment: str
) -> None:
    with pytest.raises(UsageError) as caught:
        await load_verifier(spec, options)
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message and message.endswith(".")
