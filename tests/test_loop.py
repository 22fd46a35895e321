"""The RL loop (`autotune loop`) against the simulator with fixed lengths, worked by hand.

For a batch of B groups that the server generates in B/G seconds, a step time T and a
sync S: a synchronous step takes B/G + T + S; the asynchronous mode runs at the pace of
the slower of generation and training plus the sync, B/G + S or T + S a step, and its
groups are as stale as the bound Q lets them be, Q/B versions once the queue is full.
B/G is measured on its own (a loop that neither trains nor syncs), the rest predicted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import orjson
import pytest

from autotune.config.collection import CollectConfig, LiveConfig, SyntheticWorkload, TargetConfig
from autotune.config.rl_specs import LoopSpec
from autotune.results.runs import LoopSummary
from autotune.rl.loop_job import loop
from autotune.rl.replay import step_period
from autotune.rl.trainer import LEDGER_FILE
from tests.helpers import SimProcess, autotune, free_port, one_sentence_error

GROUPS, SAMPLES, TOKENS = 4, 4, 200
SIM = ("--time-scale", "0.5")  # a batch of 16 samples of 200 tokens: about 0.7 s


def _config(base_url: str, output: Path | None = None) -> CollectConfig:
    return CollectConfig(
        target=TargetConfig(base_url=base_url),
        synthetic=SyntheticWorkload(num_tasks=64, output_tokens_mean=TOKENS, output_tokens_std=0),
        num_repeats=SAMPLES,
        verifier="synthetic",
        output=output,
        progress=False,
    )


def _lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def _loop(base_url: str, output: Path | None = None, **spec: object) -> LoopSummary:
    fields = {"batch_groups": GROUPS, "steps": 6, **spec}
    return await loop(_config(base_url, output), LoopSpec.model_validate(fields))


async def _generation_s(base_url: str) -> float:
    """B/G: a batch's generation time, from a loop that neither trains nor syncs."""
    summary = await _loop(base_url, train_s=0)
    return statistics.median(step.wait_s for step in summary.steps)


@pytest.mark.measures
@pytest.mark.slow
async def test_a_synchronous_step_takes_generation_plus_training_plus_sync(
    sim_process: SimProcess,
) -> None:
    async with sim_process(*SIM) as sim:
        generation = await _generation_s(sim.base_url)
        summary = await _loop(sim.base_url, train_s=0.6, sync_s=0.3)
    assert 0.5 < generation < 1.0
    assert step_period(summary, skip=0) == pytest.approx(generation + 0.6 + 0.3, rel=0.05)
    assert summary.trained_samples == 6 * GROUPS * SAMPLES
    assert set(summary.staleness_histogram) == {"0"}  # on-policy: every sample version 0 behind
    assert summary.trainer_idle_share == pytest.approx(
        generation / step_period(summary, 0), rel=0.1
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("train_s", "bound"),
    [(1.2, "training"), (0.2, "generation")],
    ids=["training-slower", "generation-slower"],
)
@pytest.mark.measures
async def test_the_asynchronous_mode_runs_at_the_pace_of_the_slower_side(
    sim_process: SimProcess, train_s: float, bound: str
) -> None:
    async with sim_process(*SIM) as sim:
        generation = await _generation_s(sim.base_url)
        summary = await _loop(sim.base_url, mode="async", train_s=train_s, sync_s=0.2, steps=7)
    slower = max(generation, train_s)
    assert (generation < train_s) == (bound == "training")
    assert step_period(summary, skip=1) == pytest.approx(slower + 0.2, rel=0.05)
    rate = GROUPS * SAMPLES / (slower + 0.2)
    steady = [s for s in summary.steps if s.index >= 1]
    measured = sum(s.samples for s in steady[1:]) / (steady[-1].train_start - steady[0].train_start)
    assert measured == pytest.approx(rate, rel=0.05)
    # One batch ahead (Q = B): from the second step on, each trains the last version's groups.
    assert [max(s.staleness) for s in summary.steps] == [0] + [1] * 6


@pytest.mark.measures
@pytest.mark.slow
@pytest.mark.parametrize("ahead", [1, 2, 3])
async def test_a_queue_of_q_groups_trains_groups_q_over_b_versions_old(
    sim_process: SimProcess, ahead: int
) -> None:
    async with sim_process(*SIM) as sim:
        summary = await _loop(
            sim.base_url, mode="async", train_s=1.0, max_ahead=ahead * GROUPS, steps=ahead + 3
        )
    steady = summary.steps[ahead:]
    assert all(set(step.staleness) == {ahead} for step in steady), summary.staleness_histogram
    assert summary.staleness_max == ahead


@pytest.mark.slow
async def test_abort_sends_the_aborted_samples_again_and_loses_none(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    """Q = 2B and a sync while the next batch is generating: every sync aborts samples;
    each is recorded (failures file) and sent again; every group ends in the ledger."""
    rows = tmp_path / "rollouts.jsonl"
    async with sim_process(*SIM) as sim:
        summary = await _loop(
            sim.base_url, rows, mode="async", pause_mode="abort", max_ahead=2 * GROUPS,
            train_s=0.2, sync_s=0.1,
        )  # fmt: skip
    assert summary.aborted_samples > 0 and summary.pause_source == "server"
    failures = _lines(tmp_path / "rollouts_failures.jsonl")
    assert {f["failure_class"] for f in failures} <= {"aborted", "cancelled"}
    assert sum(f["failure_class"] == "aborted" for f in failures) == summary.aborted_samples
    ledger = _lines(tmp_path / LEDGER_FILE)
    fates = {entry["group"]: entry["fate"] for entry in ledger}
    assert len(fates) == len(ledger)  # one line a group
    assert sorted(fates) == list(range(len(fates)))  # every group launched is there
    assert set(fates.values()) <= {"trained", "cancelled", "untrained"}
    trained = [g for g, fate in fates.items() if fate == "trained"]
    assert len(trained) * SAMPLES == summary.trained_samples
    untrained = sum(fate == "untrained" for fate in fates.values())
    assert untrained * SAMPLES == summary.untrained_samples
    completed = _lines(rows)
    done = {(row["_ng_task_index"], row["_ng_rollout_index"]) for row in completed}
    assert all((g, s) in done for g in trained for s in range(SAMPLES))
    assert all(row["_autotune"]["policy_version"] >= 0 for row in completed)


@pytest.mark.slow
async def test_the_users_own_command_is_the_training_step(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    log = tmp_path / "steps.txt"
    script.write_text(
        "import os, time\n"
        "time.sleep(0.4)\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(f\"{os.environ['AUTOTUNE_STEP']} {os.environ['AUTOTUNE_POLICY_VERSION']} "
        "{os.environ['AUTOTUNE_BATCH_SAMPLES']}\\n\")\n"
    )
    async with sim_process(*SIM) as sim:
        summary = await _loop(
            sim.base_url, train_command=f"{sys.executable} {script}", steps=3, sync_s=0.1
        )
    assert log.read_text().split("\n")[:-1] == [f"{i} {i} {GROUPS * SAMPLES}" for i in range(3)]
    assert all(step.train_end - step.train_start >= 0.4 for step in summary.steps)


# -- the simulator's RL endpoints, as vLLM's dev mode serves them ---------------------------


async def _metric(session: aiohttp.ClientSession, root: str, name: str) -> float:
    async with session.get(root + "/metrics") as response:
        text = await response.text()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def _stream(session: aiohttp.ClientSession, root: str, tokens: int) -> tuple[str, int]:
    """(finish_reason, output tokens) of one streamed completion of `tokens` tokens."""
    body = {"prompt": "x" * 40, "max_tokens": tokens, "ignore_eos": True, "stream": True}
    reason, text = "", ""
    async with session.post(root + "/v1/completions", json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: {"):
                choice = orjson.loads(line[6:])["choices"][0]
                text += choice["text"]
                reason = choice["finish_reason"] or reason
    return reason, len(text) // 4


async def test_pause_keep_freezes_requests_and_resume_finishes_them(
    sim_process: SimProcess, session: aiohttp.ClientSession
) -> None:
    async with sim_process("--time-scale", "0.1") as sim:
        root = sim.base_url.removesuffix("/v1")
        request = asyncio.create_task(_stream(session, root, 2000))
        await asyncio.sleep(0.2)
        async with session.post(root + "/pause", params={"mode": "keep"}) as answer:
            assert answer.status == 200
        before = await _metric(session, root, "vllm:generation_tokens_total")
        await asyncio.sleep(0.3)
        assert await _metric(session, root, "vllm:generation_tokens_total") == before
        assert await _metric(session, root, "vllm:num_requests_running") == 1  # frozen, kept
        async with session.get(root + "/is_paused") as answer:
            assert (await answer.json())["is_paused"] is True
        async with session.post(root + "/resume"):
            pass
        assert await request == ("length", 2000)


async def test_pause_abort_ends_requests_and_wait_lets_them_finish(
    sim_process: SimProcess, session: aiohttp.ClientSession
) -> None:
    async with sim_process("--time-scale", "0.1") as sim:
        root = sim.base_url.removesuffix("/v1")
        request = asyncio.create_task(_stream(session, root, 2000))
        await asyncio.sleep(0.2)
        async with session.post(root + "/pause", params={"mode": "abort"}):
            pass
        reason, tokens = await request
        assert reason == "abort" and 0 < tokens < 2000
        async with session.post(root + "/resume"):
            pass
        running = asyncio.create_task(_stream(session, root, 500))
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        async with session.post(root + "/pause", params={"mode": "wait"}):
            pass
        assert time.perf_counter() - started > 0.05  # it waited for the drain
        assert await _metric(session, root, "vllm:num_requests_running") == 0
        assert await running == ("length", 500)  # finished, not ended
        queued = asyncio.create_task(_stream(session, root, 10))
        await asyncio.sleep(0.2)
        assert not queued.done()  # paused: a new request waits for /resume
        async with session.post(root + "/resume"):
            pass
        assert await queued == ("length", 10)


@pytest.mark.measures
async def test_weight_loads_take_the_weights_over_the_set_bandwidth(
    sim_process: SimProcess, session: aiohttp.ClientSession
) -> None:
    """8B parameters in bf16 are 16.06 GB: 0.2 s at 80 GB/s, 0.4 s each way at 40 GB/s."""
    flags = ("--time-scale", "1", "--weight-sync-gbps", "80", "--host-gbps", "40")
    async with sim_process(*flags) as sim:
        root = sim.base_url.removesuffix("/v1")

        async def timed(path: str, **query: str) -> float:
            started = time.perf_counter()
            async with session.post(root + path, params=query, json={}) as answer:
                assert answer.status == 200, await answer.text()
            return time.perf_counter() - started

        await timed("/init_weight_transfer_engine")  # the connection made: not timed below
        assert 0.2 <= await timed("/update_weights") < 0.3
        assert 0.4 <= await timed("/sleep", level="1") < 0.5
        async with session.get(root + "/is_sleeping") as answer:
            assert (await answer.json())["is_sleeping"] is True
        assert 0.4 <= await timed("/wake_up") < 0.5
        assert await timed("/sleep", level="2") < 0.1  # level 2 drops the weights
        assert 0.4 <= await timed("/wake_up") < 0.5
        assert await _stream(session, root, 5) == ("length", 5)  # awake and serving


# -- the command and its report --------------------------------------------------------------


def test_loop_writes_its_files_and_a_page_the_report_command_rebuilds(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = autotune(
        "loop", "--num-repeats", "2", "--batch-groups", "2", "--steps", "3",
        "--mode", "async", "--train-s", "0.05", "--sync-s", "0.02", "--output-tokens", "16,0",
        "--sim-arg=--time-scale=0.01", "--output-dir", str(out), "--json", "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = orjson.loads(result.stdout)
    assert summary["trained_samples"] == 3 * 2 * 2 and summary["mode"] == "async"
    assert {p.name for p in out.iterdir()} >= {"loop.json", "index.html", "groups.jsonl"}
    page = (out / "index.html").read_text()
    for lane in ("generation", "training", "sync"):
        assert f'id="lanes-{lane}-0"' in page, lane
    assert page.count('id="lanes-training-') == 3
    original = page
    (out / "index.html").unlink()
    rebuilt = autotune("report", str(out))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (out / "index.html").read_text() == original


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--max-ahead", "4"), "bound the async mode"),
        (("--mode", "async", "--max-ahead", "1"), "must be at least batch_groups"),
        (("--train-s", "soon"), "--train-s: must be seconds"),
        (("--sync-s", "1", "--sync-via-server"), "give one weight transfer"),
        (("--num-repeats", "1"), "a trainer takes GRPO groups"),
    ],
)
def test_a_bad_loop_flag_is_one_sentence(flags: tuple[str, ...], says: str) -> None:
    args = ("--num-repeats", "2", "--batch-groups", "2", *flags)
    line = one_sentence_error(autotune("loop", *args))
    assert says in line


async def test_metrics_port_serves_the_loops_figures_while_it_runs(
    sim_process: SimProcess, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    port = free_port()
    config = replace(_config("", tmp_path / "rollouts.jsonl"), live=LiveConfig(metrics_port=port))
    spec = LoopSpec(batch_groups=2, steps=4, mode="async", train_s=0.3)
    async with sim_process("--time-scale", "0.05") as sim:
        config = replace(config, target=TargetConfig(base_url=sim.base_url))
        running = asyncio.create_task(loop(config, spec))
        seen: dict[str, float] = {}
        while not running.done():
            with contextlib.suppress(aiohttp.ClientError):  # not bound yet
                seen = await _scrape(session, port)
            if seen.get("autotune_loop_steps_total", 0) >= 2:
                break
            await asyncio.sleep(0.05)
        summary = await running
    assert 2 <= seen["autotune_loop_steps_total"] <= 4
    assert (
        seen["autotune_loop_trained_samples_total"]
        == seen["autotune_loop_steps_total"] * 2 * SAMPLES
    )
    assert seen["autotune_loop_policy_version"] >= 1
    assert summary.trained_samples == 4 * 2 * SAMPLES


async def _scrape(session: aiohttp.ClientSession, port: int) -> dict[str, float]:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    return {
        name: float(value)
        for name, value in re.findall(r"^(autotune_loop_\w+) (\S+)$", text, re.MULTILINE)
    }


@pytest.mark.slow
def test_a_server_that_dies_mid_loop_is_one_sentence_and_keeps_what_was_made(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    result = autotune(
        "loop", "--num-repeats", "2", "--batch-groups", "2", "--steps", "5", "--train-s", "0.05",
        "--output-tokens", "16,0", "--sim-arg=--time-scale=0.01",
        "--sim-arg=--die-after-requests=12", "--output-dir", str(out),
    )  # fmt: skip
    line = one_sentence_error(result)
    assert "the loop stopped: the model server stopped answering" in line
    rows = _lines(out / "rollouts.jsonl")
    assert 0 < len(rows) < 12
    ledger = {entry["group"]: entry["fate"] for entry in _lines(out / LEDGER_FILE)}
    assert "trained" in ledger.values()
    assert len(ledger) * 2 >= len(rows)  # every row's group has its line
