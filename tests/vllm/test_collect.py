"""`autotune collect` and `autotune loop` against real vLLM: token counts, NeMo Gym rows,
batch steps, and the loop's pauses through vLLM's own endpoints.

Every finished request's `usage` must add up to exactly what vLLM counted itself in
/metrics, for streaming and non-streaming calls to both APIs; every NeMo Gym example
must run and come back as rows with the reference rollouts' keys and types; samples
that over-sampling cancels stop on vLLM and none is lost. One vLLM serves them all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from autotune.config.collection import SyntheticWorkload, TargetConfig
from autotune.rollout.backends.openai import OpenAIBackend
from autotune.rollout.store import failures_path
from autotune.rollout.target import resolve_target
from autotune.rollout.workload import synthetic_tasks
from autotune.servers.vllm import VllmServer
from autotune.telemetry import parse_prometheus
from tests.helpers import autotune, read_rows
from tests.vllm.conftest import server_counters

pytestmark = pytest.mark.vllm

TASKS = 24
VERIFIER_FOR = {
    "string_match": "boxed",
    "mcqa": "mcqa",
    "code_gen": "code",
    "math_with_judge": "boxed",
    "example_single_tool_call": "none",
}
CORE_KEYS = {"responses_create_params", "response", "reward", "_ng_task_index", "_ng_rollout_index"}
JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def settled_counters(server: VllmServer) -> dict[str, float]:
    """The counters once two reads in a row agree (vLLM records a request as it ends)."""
    last = server_counters(server)
    for _ in range(20):
        time.sleep(0.25)
        now = server_counters(server)
        if now == last:
            return now
        last = now
    return last


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_usage_token_counts_match_the_servers_counters(
    vllm_server: VllmServer, api: str, stream: bool, tmp_path: Path
) -> None:
    out = tmp_path / "rollouts.jsonl"
    before = settled_counters(vllm_server)
    result = autotune(
        "collect",
        "--base-url",
        vllm_server.base_url or "",
        "--api",
        api,
        *([] if stream else ["--no-stream"]),
        "--synthetic",
        str(TASKS),
        "--prompt-tokens",
        "96,32",
        "--output-tokens",
        "48,16",
        "--parallelism",
        "8",
        "--output-dir",
        str(tmp_path),
        "--json",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr + vllm_server.log_tail()
    after = settled_counters(vllm_server)
    summary = json.loads(result.stdout)
    assert summary["completed"] == TASKS and summary["failed"] == 0
    assert summary["model"] == "tiny-llama" and summary["simulated"] is False
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    prompted = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert summary["output_tokens"] == generated > 0
    assert summary["input_tokens"] == prompted > 0
    rows = read_rows(out)
    assert sum(row["response"]["usage"]["output_tokens"] for row in rows) == generated


def json_type(value: Any) -> str:
    return (
        "number"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else (JSON_TYPES[type(value)])
    )


def reference_types(rows: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each key of the reference rows with the JSON types its values take."""
    types: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row.items():
            types.setdefault(key, set()).add(json_type(value))
    return types


@pytest.mark.parametrize("name", sorted(VERIFIER_FOR))
def test_nemo_gym_examples_run_and_rows_match_the_reference(
    vllm_server: VllmServer, nemo_gym_data: Path, name: str, tmp_path: Path
) -> None:
    out = tmp_path / "rollouts.jsonl"
    result = autotune(
        "collect",
        "--input",
        str(nemo_gym_data / f"{name}.example.jsonl"),
        "--base-url",
        vllm_server.base_url or "",
        "--verifier",
        VERIFIER_FOR[name],
        "--num-repeats",
        "2",
        # The examples set no output limit; the random model would write to max_model_len.
        "--extra-body",
        '{"max_tokens": 48}',
        "--output-dir",
        str(tmp_path),
        "--json",
        "--quiet",
    )
    assert result.returncode == 0, result.stderr + vllm_server.log_tail()
    summary = json.loads(result.stdout)
    assert (summary["completed"], summary["failed"]) == (10, 0)
    rows = read_rows(out)
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [
        (t, r) for t in range(5) for r in range(2)
    ]
    for row in rows:
        response = row["response"]
        assert response["object"] == "response" and response["model"] == "tiny-llama"
        assert response["output"] and response["usage"]["output_tokens"] > 0
        assert "simulated" not in row["_autotune"]
        if VERIFIER_FOR[name] != "none":
            assert row["reward"] in (0.0, 1.0)
    reference = nemo_gym_data / f"{name}.example_rollouts.jsonl"
    if not reference.exists():
        return
    expected = reference_types(read_rows(reference))
    response_types = reference_types([r["response"] for r in read_rows(reference)])
    for row in rows:
        for key, types in expected.items():
            assert key in row, f"{key} missing from the row"
            # A random model's text holds nothing to check: NeMo Gym's verifiers write
            # null into their own fields then too.
            allowed = types if key in CORE_KEYS else types | {"null"}
            assert json_type(row[key]) in allowed, (key, row[key], types)
        for key, types in response_types.items():
            if key in row["response"] and types != {"null"}:  # null there: an optional field
                assert json_type(row["response"][key]) in types | {"null"}, (key, types)


# -- collect --batch-groups --over-sample ----------------------------------------------------
# collect --batch-groups --over-sample against real vLLM (its CPU build): the samples a
# step's end cancels stop on the server, and every launched sample is written once.
#
# tests/test_groups.py proves the same on the simulator. Here vLLM itself must see each
# cancelled call's connection close and abort the request: it generated tokens for it,
# yet never finished it (neither `stop` nor `length`), and nothing is left running.
# vLLM 0.32 does not count such a client abort in `vllm:request_success_total` (its
# OutputProcessor.abort_requests drops the request without recording a finish; upstream
# vllm-project/vllm#31503), so its `abort` count is checked only as an upper bound: no
# more than the requests that never finished.
#
# The tiny model writes random text, which the synthetic verifier grades 0 or 1 by its
# hash, so a group of 4 is informative by chance (7 in 8). Output lengths (max_tokens,
# 160 ± 120 with --seed 62) give each step of 6 groups one far longer than the other five,
# by 170 tokens or more: 1 11 81 100 108 282, 41 98 100 110 119 314, 1 1 19 38 132 300,
# 1 126 129 132 225 383. A step whose five shorter groups hold four informative ones
# ends while that one is still generating; all four steps missing that is about 1 in
# 5000 (0.12 ** 4).

GROUP_TASKS, REPEATS, BATCH = 24, 4, 4  # ceil(4 x 1.5) = 6 groups (24 samples) start a step
ENDED = re.compile(
    r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"[^}]*\} (\S+)$', re.MULTILINE
)
RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? (\S+)$", re.MULTILINE)
GENERATED = re.compile(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", re.MULTILINE)
SETTLE_S = 10.0


def server_requests(server: VllmServer) -> dict[str, float]:
    """vLLM's ended requests by finished_reason (stop, length, abort, ...), its running
    gauge (`running`) and its generated tokens (`generated`), from its /metrics."""
    root = (server.base_url or "").removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/metrics", timeout=10) as response:
        text = response.read().decode()
    figures: dict[str, float] = {}
    for reason, value in ENDED.findall(text):
        figures[reason] = figures.get(reason, 0.0) + float(value)
    for name, pattern in (("running", RUNNING), ("generated", GENERATED)):
        values = pattern.findall(text)
        assert values, f"vLLM's /metrics has no {pattern.pattern}"
        figures[name] = sum(map(float, values))
    return figures


def settled_requests(server: VllmServer) -> dict[str, float]:
    """The server's figures once nothing runs and two reads in a row agree (vLLM sets
    its gauge and counters as its engine loop turns), else the last read after SETTLE_S."""
    last = server_requests(server)
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = server_requests(server)
        if now == last and now["running"] == 0:
            return now
        last = now
    return last


def _gauges(
    server: VllmServer, stop: threading.Event, into: list[tuple[float, float, float]]
) -> None:
    """(Unix time, running requests, generated tokens) from vLLM's /metrics every 50 ms."""
    root = (server.base_url or "").removesuffix("/v1")
    names = ("vllm:num_requests_running", "vllm:generation_tokens_total")
    while not stop.is_set():
        with urllib.request.urlopen(f"{root}/metrics", timeout=10) as response:
            values = parse_prometheus(response.read().decode(), names=names)
        into.append((time.time(), values.get(names[0], 0.0), values.get(names[1], 0.0)))
        stop.wait(0.05)


@contextmanager
def gauges_of(server: VllmServer) -> Iterator[list[tuple[float, float, float]]]:
    """`_gauges`' readings while inside, from a thread beside the test's own calls."""
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_gauges, args=(server, stop, samples))
    watcher.start()
    try:
        yield samples
    finally:
        stop.set()
        watcher.join()


async def test_a_cancelled_sample_stops_on_vllm_at_the_cancel(vllm_server: VllmServer) -> None:
    """Four long streamed samples through autotune's own backend, cancelled as a batch step
    cancels them (the task, so its connection closes): cancelling two drops vLLM's running
    gauge by two at once while the other two go on generating, and cancelling those
    empties it. vLLM 0.32 counts a client's cancel in no ended-request counter: its
    AsyncLLM.abort calls OutputProcessor.abort_requests (vllm/v1/engine/output_processor.py),
    which drops the request's state without the finished-request stats that feed
    `vllm:request_success_total`, so no finished_reason, "abort" included, rises."""
    base_url = vllm_server.base_url or ""
    tasks = synthetic_tasks(
        SyntheticWorkload(
            num_tasks=4, prompt_tokens_mean=32, prompt_tokens_std=0, output_tokens_mean=1800,
            output_tokens_std=0,
        )
    )  # fmt: skip
    before = settled_requests(vllm_server)
    assert before["running"] == 0
    loop = asyncio.get_running_loop()

    async def gauge_reaches(level: float, within_s: float) -> tuple[float, float]:
        """(seconds it took, the generated-token count then)."""
        started = time.monotonic()
        while True:
            figures = await loop.run_in_executor(None, server_requests, vllm_server)
            took = time.monotonic() - started
            if figures["running"] == level or took > within_s:
                assert figures["running"] == level, (figures, took)
                return took, figures["generated"]
            await asyncio.sleep(0.02)

    config = TargetConfig(base_url=base_url, extra_body={"ignore_eos": True})
    async with aiohttp.ClientSession() as session:
        target = await resolve_target(session, base_url, None, None)
        backend = OpenAIBackend(session, config, target.model, None)
        calls = [asyncio.create_task(backend.generate(task)) for task in tasks]
        await gauge_reaches(4, within_s=60)
        for call in calls[:2]:
            call.cancel()
        took, generated = await gauge_reaches(2, within_s=2)
        await asyncio.sleep(0.3)
        _, generated_later = await gauge_reaches(2, within_s=0)  # the two others go on
        for call in calls[2:]:
            call.cancel()
        await gauge_reaches(0, within_s=2)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    # A sample of the second two may reach its length before its cancel on a fast moment
    # (a CI run saw both end so): vLLM then counts it as ended, as it should.
    ran_out = sum(not isinstance(outcome, BaseException) for outcome in outcomes[2:])
    assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes[:2])
    after = settled_requests(vllm_server)
    print(
        f"running 4 -> 2 in {took:.2f} s of the cancel; the two left generated "
        f"+{generated_later - generated:.0f} tokens in 0.3 s"
    )
    assert generated_later > generated
    ended = {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key not in ("running", "generated")
    }
    assert ended.pop("length", 0.0) == ran_out, ended  # the ones that ran to their end
    assert not any(ended.values()), ended  # no ended-request counter counts a cancel
    assert after["generated"] - before["generated"] < (2 + ran_out) * 1800


def test_over_sampling_cancels_on_vllm_and_loses_no_sample(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    before = settled_requests(vllm_server)
    assert before["running"] == 0
    started = time.monotonic()
    with gauges_of(vllm_server) as gauges:
        result = autotune(
            "collect", "--base-url", vllm_server.base_url or "",
            "--synthetic", str(GROUP_TASKS), "--seed", "62",
            "--prompt-tokens", "32,8", "--output-tokens", "160,120",
            "--num-repeats", str(REPEATS), "--verifier", "synthetic",
            "--batch-groups", str(BATCH), "--over-sample", "0.5", "--parallelism", "64",
            "--output-dir", str(tmp_path), "--json", "--quiet",
        )  # fmt: skip
        time.sleep(1.0)  # the gauge after the last cancel
    wall_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr + vllm_server.log_tail()
    after = settled_requests(vllm_server)
    summary = json.loads(result.stdout)
    batch = summary["batch"]
    cancelled, completed, failed = summary["cancelled"], summary["completed"], summary["failed"]
    change = {key: after[key] - before.get(key, 0.0) for key in after}
    # Requests that ended on the server other than by abort (stop, length, ...).
    finished = sum(n for key, n in change.items() if key not in ("abort", "running", "generated"))
    out = tmp_path / "rollouts.jsonl"
    rows = read_rows(out)
    failures = read_rows(failures_path(out))
    print(
        f"cancelled {cancelled}, completed {completed}, failed {failed}; vLLM: "
        f"abort +{change['abort']:.0f}, finished +{finished:.0f}, running {after['running']:.0f}, "
        f"generated +{change['generated']:.0f} (the completed: {summary['output_tokens']}); "
        f"busy {batch['busy_share']:.1%} of {batch['capacity']} ({batch['capacity_source']}); "
        f"steps (groups, informative, cancelled) "
        f"{[(s['groups'], s['informative'], s['cancelled']) for s in batch['steps']]}; "
        f"collect {wall_s:.1f} s"
    )

    # Over-sampling cancelled samples, and the summary counts them once.
    assert cancelled > 0 and cancelled == batch["cancelled_samples"]
    assert sum(step["cancelled"] for step in batch["steps"]) == cancelled
    assert batch["busy_source"] == "server"  # vLLM's running gauge
    # ÷ what its KV cache holds: vLLM states its blocks (vllm:cache_config_info), not its
    # max_num_seqs, and this collect was not told it
    assert batch["capacity_source"] == "KV cache" and batch["capacity"] > 0, batch["capacity"]

    # Every launched sample ends in a file exactly once: whole groups, every task.
    assert failed == 0 and {row["failure_class"] for row in failures} == {"cancelled"}
    assert len(rows) == completed and len(failures) == cancelled
    keys = [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows + failures]
    assert len(keys) == len(set(keys)) == completed + cancelled + failed
    assert len(keys) % REPEATS == 0
    assert set(keys) == {(task, sample) for task in range(GROUP_TASKS) for sample in range(REPEATS)}

    # The cancelled samples stopped on vLLM: its running gauge fell at the last cancel, it
    # generated fewer tokens for them than they asked for (none for a sample cancelled while
    # it still waited in vLLM's queue), and none is left running. Each
    # completed sample finished there; a cancelled one may have too, its answer in while
    # its reward was pending. vLLM's ended-request counters count no cancel, "abort"
    # included (test_a_cancelled_sample_stops_on_vllm_at_the_cancel says why).
    stopped = len(keys) - finished
    assert finished >= completed and stopped <= cancelled, (finished, completed, cancelled)
    assert change["abort"] == 0
    assert after["running"] == 0
    last_cancel = max(row["_autotune"]["timings"]["cancelled"] for row in failures)  # type: ignore[index]
    later = [row for row in rows if row["_autotune"]["timings"]["queued"] > last_cancel]  # type: ignore[index]
    if not later:  # the last step ended at a cancel: nothing ran after it but those
        # The gauge's cadence is its resolution (a read takes longer on a busy machine): the
        # first reading taken after the cancel may have been asked for before it, the
        # second was not, and one more allows for vLLM's engine step.
        before_cancel = [r for t, r, _ in gauges if t <= last_cancel][-1:]
        after_cancel = [(t - last_cancel, r) for t, r, _ in gauges if t > last_cancel][:3]
        print(f"running {before_cancel} at the last cancel, then {after_cancel}")
        assert any(r == 0 for _, r in after_cancel), after_cancel
    wasted = change["generated"] - summary["output_tokens"]
    asked = sum(
        row["responses_create_params"]["max_output_tokens"]  # type: ignore[index]
        for row in failures
    )
    assert 0 <= wasted < asked, (wasted, asked)


# -- the RL loop: each sync really pauses and resumes vLLM through its own endpoints --------


@pytest.mark.parametrize("pause_mode", ["keep", "abort"])
def test_the_loop_pauses_and_resumes_vllm_at_each_sync(
    vllm_server: VllmServer, tmp_path: Path, pause_mode: str
) -> None:
    """Async, two batches ahead, so requests are in flight at every sync: with `keep` vLLM
    holds them frozen (running, no token made) until /resume; with `abort` it ends them
    (none running) and the loop sends them again. Every launched group ends in the ledger.

    The gauges are judged from halfway through each pause: vLLM's API server writes them as
    it reads the engine core's outputs, and the paused core has sent all of its outputs
    when /pause returns, but the API server may still be reading a backlog of them (on a
    busy machine, 280 tokens of 16 requests 0.1 s after the pause returned)."""
    with gauges_of(vllm_server) as samples:
        result = autotune(
            "loop", "--base-url", vllm_server.base_url or "",
            "--synthetic", "16", "--output-tokens", "256,0", "--num-repeats", "4",
            "--mode", "async", "--batch-groups", "2", "--max-ahead", "4", "--steps", "3",
            "--train-s", "0.5", "--sync-s", "2", "--pause-mode", pause_mode,
            "--output-dir", str(tmp_path), "--json", "--quiet",
            timeout=300,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr + vllm_server.log_tail()
    summary = json.loads(result.stdout)
    assert summary["pause_source"] == "server"
    print(
        f"{pause_mode}: pause {summary['pause_s']['mean'] * 1000:.0f} ms, resume "
        f"{summary['resume_s']['mean'] * 1000:.0f} ms (means of {summary['pause_s']['count']}); "
        f"{summary['trained_samples_per_s']:.2f} trained samples/s, aborted "
        f"{summary['aborted_samples']}"
    )
    paused_windows = [
        (
            summary["started_at"] + step["sync_start"] + step["pause_s"],
            summary["started_at"] + step["sync_end"] - step["resume_s"],
        )
        for step in summary["steps"]
    ]
    moved = [t for (_, *then), (t, *now) in itertools.pairwise(samples) if now != then]
    held, backlog_s = 0, 0.0
    for start, end in paused_windows:
        backlog_s = max(backlog_s, max((t - start for t in moved if start < t < end), default=0))
        middle = (start + end) / 2
        inside = [(running, made) for t, running, made in samples if middle < t < end - 0.1]
        assert len(inside) >= 5, (start, end, len(samples))
        assert len({made for _, made in inside}) == 1, inside  # paused: no token made
        if pause_mode == "keep":
            assert len({running for running, _ in inside}) == 1, inside  # frozen where it was
            held += inside[0][0] > 0
        else:
            assert all(running == 0 for running, _ in inside), inside  # ended
    print(f"the gauges last moved {backlog_s * 1000:.0f} ms into a pause")
    if pause_mode == "keep":
        assert held, "no sync found a request in flight to hold"
    else:
        assert summary["aborted_samples"] > 0
    failures = read_rows(failures_path(tmp_path / "rollouts.jsonl"))
    aborted = [row for row in failures if row["failure_class"] == "aborted"]
    assert len(aborted) == summary["aborted_samples"]
    assert {row["failure_class"] for row in failures} <= {"aborted", "cancelled"}
    ledger = read_rows(tmp_path / "groups.jsonl")
    assert sorted(entry["group"] for entry in ledger) == list(range(len(ledger)))
    trained = {entry["group"] for entry in ledger if entry["fate"] == "trained"}
    assert len(trained) * 4 == summary["trained_samples"] == 3 * 2 * 4
    done = {
        (row["_ng_task_index"], row["_ng_rollout_index"])
        for row in read_rows(tmp_path / "rollouts.jsonl")
    }
    assert all((group, sample) in done for group in trained for sample in range(4))
