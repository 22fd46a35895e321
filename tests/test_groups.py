"""GRPO groups: hand-worked figures, the simulated policy, and batch steps on the simulator.

The figures: a group's completion time and straggler ratio, a batch's informative share
and goodput, a step's tail share. Then collect --batch-groups end to end: plain steps,
over-sampling (cancelled samples stop on the server and are written, none lost) and
carry-over (samples finish in a later step, their age recorded).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import aiohttp
import orjson
import pytest

from autotune.collector.collect_job import collect
from autotune.config.collection import (
    PROBE_DEFAULTS,
    CollectConfig,
    LiveConfig,
    SyntheticWorkload,
    TargetConfig,
)
from autotune.config.rl_specs import BatchSpec
from autotune.diagnose.diagnose_job import DiagnoseConfig, diagnose
from autotune.errors import UsageError
from autotune.hardware.deployment import SimConfigError
from autotune.results.stages import percentile
from autotune.rl.batch import Occupancy, grouped
from autotune.rl.groups import (
    ClosedGroup,
    GroupTracker,
    completion_s,
    is_informative,
    straggler_ratio,
    summarise_closed,
    tail_share,
)
from autotune.rollout.store import failures_path
from autotune.rollout.workload import Task, WorkItem
from autotune.servers.sim.policy import RIGHT, WRONG, Policy, RolloutReplay
from autotune.servers.sim.server import load_config
from autotune.servers.sim.server import main as sim_main
from autotune.telemetry.prometheus import PrometheusSampler
from autotune.verifiers.pool import synthetic_reward
from tests.helpers import SimProcess, read_rows

# A group of 8: when each sample started and ended (seconds).
STARTS = [0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
ENDS = [2.0, 3.0, 3.0, 4.0, 4.5, 5.5, 7.0, 13.0]
# durations 2 3 3 4 4 5 6 12: median (4 + 4) / 2 = 4, slowest 12


def test_a_group_of_eight_by_hand() -> None:
    assert completion_s(STARTS, ENDS) == 13.0  # first start 0 to last end 13
    durations = [end - start for start, end in zip(STARTS, ENDS, strict=True)]
    assert straggler_ratio(durations) == 3.0  # 12 / 4
    tracker = GroupTracker(8)
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    closed = [
        tracker.ended(7, start, end, reward, output_tokens=10)
        for start, end, reward in zip(STARTS, ENDS, rewards, strict=True)
    ]
    assert closed[:-1] == [None] * 7  # open until its eighth sample ends
    last = closed[-1]
    assert last is not None and last.complete and last.informative
    assert last.completion_s == 13.0 and last.output_tokens == 80
    summary = tracker.summary(elapsed_s=13.0)
    assert summary.straggler_ratio.p50 == 3.0 and summary.completion_s.p50 == 13.0


def test_a_batch_of_all_pass_and_all_fail_groups_by_hand() -> None:
    groups = [
        [1.0, 1.0, 1.0, 1.0],  # all pass: zero advantage
        [0.0, 0.0, 0.0, 0.0],  # all fail: zero advantage
        [1.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
        [1.0, 1.0, 1.0, 1.0],
    ]
    tracker = GroupTracker(4)
    for task, rewards in enumerate(groups):
        for sample, reward in enumerate(rewards):
            tracker.ended(task, 0.0, 1.0 + sample, reward, output_tokens=100)
    summary = tracker.summary(elapsed_s=4.0)
    assert (summary.complete, summary.informative, summary.incomplete) == (5, 2, 0)
    assert summary.informative_share == 0.4  # 2 of 5
    assert summary.informative_groups_per_s == 0.5  # 2 groups in 4 s
    assert summary.informative_tokens_per_s == 200.0  # 2 groups x 4 samples x 100 tokens / 4 s


def test_a_failed_or_single_sample_group_is_never_informative() -> None:
    tracker = GroupTracker(2)
    tracker.ended(0, 0.0, 1.0, 1.0)
    closed = tracker.ended(0, 0.0, 2.0, completed=False)
    assert closed is not None and not closed.complete and not closed.informative
    assert tracker.summary(2.0).incomplete == 1
    assert not is_informative([1.0]) and is_informative([0.0, 0.5])


def test_a_steps_tail_share_by_hand() -> None:
    # 10 samples: the 9th (90%) ended at 9 s, the step ended at 20 s: 11 of its 20 s are tail
    ends = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 20.0]
    assert tail_share(ends, 0.0, 20.0) == pytest.approx(0.55)
    assert tail_share([2.0, 2.0], 0.0, 2.0) == 0.0  # no straggler, no tail
    assert tail_share([], 0.0, 1.0) is None


def test_a_windows_groups_by_hand() -> None:
    """What a probe reports for the groups that ended in its 10 s window."""
    closed = [
        ClosedGroup(1, True, True, 4.0, 300, 2.0),
        ClosedGroup(2, True, False, 2.0, 100, 1.0),
        ClosedGroup(3, True, True, 6.0, 500, 3.0),
        ClosedGroup(4, False, False, 5.0, 50),
    ]
    summary = summarise_closed(8, closed, 10.0)
    assert (summary.complete, summary.informative, summary.incomplete) == (3, 2, 1)
    assert summary.informative_share == pytest.approx(2 / 3)
    assert summary.informative_groups_per_s == pytest.approx(0.2)
    assert summary.informative_tokens_per_s == pytest.approx(80.0)  # (300 + 500) / 10
    assert summary.completion_s.p50 == 4.0 and summary.straggler_ratio.p50 == 2.0


def test_occupancy_means_a_level_over_a_window() -> None:
    level = Occupancy(0.0)
    level.set(4, 1.0)  # 0 for 1 s, then 4
    level.set(2, 3.0)  # 4 for 2 s, then 2
    assert level.area(5.0) == 12.0  # 0 + 8 + 4
    assert level.mean(1.0, 5.0) == 3.0  # (8 + 4) / 4
    assert level.mean(2.0, 4.0) == 3.0  # 4 for 1 s, 2 for 1 s
    level.forget_before(3.5)
    assert level.mean(3.5, 5.0) == 2.0


def test_work_items_group_by_task() -> None:
    tasks = [Task(i, {}, [], "", {}) for i in range(3)]
    items = [WorkItem(task, r) for task in tasks for r in range(2)]
    assert [[item.task.index for item in group] for group in grouped(iter(items))] == [
        [0, 0],
        [1, 1],
        [2, 2],
    ]


def test_the_simulated_policy_has_the_tail_and_the_uninformative_share_it_is_set_to() -> None:
    policy = Policy(seed=0, median_tokens=100, sigma=1.0, uninformative=0.4)
    lengths, uninformative, prompts = [], 0, 1000
    for prompt in range(prompts):
        text = f"[{prompt}] what is six times seven?"
        answers = []
        for _ in range(4):
            length, answer = policy.sample(text)
            assert length is not None and answer.strip() in (RIGHT, WRONG)
            lengths.append(length)
            answers.append(synthetic_reward(answer, "42"))
        uninformative += not is_informative(answers)
    p50, p99 = percentile(lengths, 50), percentile(lengths, 99)
    assert p50 is not None and p99 is not None
    assert 80 <= p50 <= 125 and 8 <= p99 / p50 <= 13  # e^(2.33) = 10.2 with sigma 1
    assert abs(uninformative / prompts - 0.4) < 0.05
    plain = Policy(seed=0, median_tokens=100, sigma=None, uninformative=None)
    assert not plain.active


def rollouts_file(path: Path, groups: dict[str, list[tuple[int, float]]]) -> Path:
    """A rollouts JSONL in NeMo Gym's shape: per prompt, its samples' (tokens, reward)."""
    with path.open("wb") as handle:
        for prompt, samples in groups.items():
            for tokens, reward in samples:
                row = {
                    "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
                    "response": {"output": [], "usage": {"output_tokens": tokens}},
                    "reward": reward,
                }
                handle.write(orjson.dumps(row) + b"\n")
    return path


# One prompt whose samples disagree (an informative group), one all right (uninformative).
REPLAYED = {"mixed": [(40, 1.0), (80, 0.0)], "easy": [(20, 1.0), (30, 1.0)]}


def test_a_replayed_prompt_is_one_of_the_files_groups_sample_by_sample(tmp_path: Path) -> None:
    replay = RolloutReplay.load(str(rollouts_file(tmp_path / "r.jsonl", REPLAYED)))
    assert not replay.pooled
    policy = Policy(seed=0, median_tokens=100, sigma=None, uninformative=None, replay=replay)
    kinds = set()
    for prompt in (f"prompt {i}" for i in range(40)):
        samples = [policy.sample(prompt) for _ in range(4)]
        lengths = [length for length, _ in samples]
        answers = [answer.strip() for _, answer in samples]
        assert lengths in ([40, 80, 40, 80], [20, 30, 20, 30])  # a whole group, cycled
        mixed = lengths[0] == 40
        kinds.add(mixed)
        assert answers == ([RIGHT, WRONG] * 2 if mixed else [RIGHT] * 4)
    assert kinds == {True, False}  # prompts are spread over the file's groups


def test_a_file_of_single_samples_is_replayed_as_one_pool(tmp_path: Path) -> None:
    """One row per prompt, as NeMo Gym's example rollouts are: lengths from usage, or
    from the text where a row has none (four characters a token)."""
    path = rollouts_file(tmp_path / "r.jsonl", {"a": [(475, 0.0)], "b": [(377, 1.0)]})
    text = {"type": "message", "content": [{"type": "output_text", "text": "x" * 400}]}
    row = {"responses_create_params": {"input": "c"}, "response": {"output": [text]}, "reward": 1}
    with path.open("ab") as handle:
        handle.write(orjson.dumps(row) + b"\n")
    replay = RolloutReplay.load(str(path))
    assert replay.pooled
    rows = replay.groups[0]
    assert sorted((row.tokens, row.passed) for row in rows) == [
        (100, True), (377, True), (475, False),
    ]  # fmt: skip
    drawn = {replay.sample(f"p{i}", k, 0) for i in range(30) for k in range(4)}
    assert drawn == set(rows)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot be read (No such file or directory)"),
        (b'{"reward": 1}\n{"response": {}}\n', "line 2 is not a rollout row with a numeric reward"),
        (b"\n", "holds no rows"),
    ],
    ids=["missing", "no-reward", "empty"],
)
def test_a_rollouts_file_the_simulator_cannot_replay_is_one_sentence(
    tmp_path: Path, content: bytes | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rollouts.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SimConfigError, match=re.escape(message)):
        load_config(["--rollouts", str(path)])
    assert sim_main(["--rollouts", str(path)]) == 1  # before it listens
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("ValueError: --rollouts ") and message in line


@pytest.mark.slow
async def test_collect_against_a_replayed_file_gets_its_groups(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    replay = rollouts_file(tmp_path / "replay.jsonl", REPLAYED)
    async with sim_process("--time-scale", "0.02", "--rollouts", str(replay)) as sim:
        summary = await collect(_collect(sim.base_url, tmp_path, None))
    rows = read_rows(tmp_path / "rollouts.jsonl")
    by_task: dict[object, list[int]] = {}
    for row in sorted(rows, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"])):
        usage = row["response"]["usage"]  # type: ignore[index]
        by_task.setdefault(row["_ng_task_index"], []).append(usage["output_tokens"])
    # The replay cycles a group's samples in the order its requests arrive, which a busy
    # machine may shuffle within a group: each group is whole, in whatever order.
    mixed = sum(sorted(lengths) == [40, 40, 80, 80] for lengths in by_task.values())
    easy = sum(sorted(lengths) == [20, 20, 30, 30] for lengths in by_task.values())
    assert mixed + easy == 24 and mixed > 0 and easy > 0
    assert summary.groups is not None and summary.groups.informative == mixed


def test_the_synthetic_verifier_grades_a_boxed_answer() -> None:
    assert synthetic_reward("tok tok " + RIGHT, "42") == 1.0
    assert synthetic_reward("tok tok " + WRONG, "42") == 0.0
    assert synthetic_reward("tok tok", "42") in (0.0, 1.0)  # no answer: the text's hash


async def test_a_grouped_run_on_the_embedded_default_has_groups_worth_tuning(
    tmp_path: Path,
) -> None:
    """A newcomer's first `collect --num-repeats 4`: some groups teach nothing (the stated
    40%), the rest do, and a group's samples differ in length; the simulator's own policy
    flags replace that default."""

    async def grouped(out: Path, *sim_args: str) -> tuple[float | None, float | None, Path]:
        summary = await collect(
            CollectConfig(
                # 10x real time, not 50x: a straggler is a time, and at 50x the client's own
                # cost a sample, the same for all, hid the lengths' spread (a CI run beside
                # another measuring test read a p50 ratio of 1.04, against 1.33 alone).
                target=TargetConfig(sim_args=("--time-scale", "0.1", *sim_args)),
                synthetic=SyntheticWorkload(num_tasks=40),
                num_repeats=4,
                verifier="synthetic",
                parallelism=64,
                output=out / "rollouts.jsonl",
                progress=False,
            )
        )
        assert summary.groups is not None and summary.groups.complete == 40
        return summary.groups.informative_share, summary.groups.straggler_ratio.p50, out

    share, straggler, out = await grouped(tmp_path / "default")
    assert share is not None and 0.4 < share < 0.8
    assert straggler is not None and straggler > 1.05
    lengths: dict[object, set[int]] = {}
    for row in read_rows(out / "rollouts.jsonl"):
        usage = row["response"]["usage"]  # type: ignore[index]
        lengths.setdefault(row["_ng_task_index"], set()).add(usage["output_tokens"])
    assert sum(len(group) > 1 for group in lengths.values()) > 30  # lengths vary in a group
    share, _, _ = await grouped(tmp_path / "own", "--uninformative-share=0")
    assert share == 1.0  # no prompt solved by all or none: every group informative


# -- collect --batch-groups on the simulator ----------------------------------------------

RL_SIM = ("--output-length-sigma", "1", "--uninformative-share", "0.4")
RL_SIM += ("--natural-output-tokens", "64", "--max-num-seqs", "64", "--time-scale", "0.02")


def _collect(base_url: str, out: Path, batch: BatchSpec | None, tasks: int = 24) -> CollectConfig:
    return CollectConfig(
        target=TargetConfig(base_url=base_url),
        synthetic=SyntheticWorkload(num_tasks=tasks, output_tokens_mean=2048, output_tokens_std=0),
        num_repeats=4,
        verifier="synthetic",
        parallelism=64,
        output=out / "rollouts.jsonl",
        progress=False,
        batch=batch,
    )


async def _ended(base_url: str) -> dict[str, float]:
    """The server's ended requests by finished_reason, and its running gauge, as vLLM
    names them."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(base_url.removesuffix("/v1") + "/metrics") as response,
    ):
        text = await response.text()
    ended: dict[str, float] = {}
    pattern = r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"[^}]*\} (\S+)$'
    for reason, value in re.findall(pattern, text, re.MULTILINE):
        ended[reason] = ended.get(reason, 0.0) + float(value)
    running = re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.MULTILINE)
    ended["running"] = sum(map(float, running))
    return ended


@pytest.mark.slow
async def test_plain_batch_steps_wait_for_every_group(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    async with sim_process(*RL_SIM) as sim:
        config = _collect(sim.base_url, tmp_path, BatchSpec(batch_groups=4))
        summary = await collect(config)
    batch = summary.batch
    assert batch is not None and summary.groups is not None
    assert [step.groups for step in batch.steps] == [4] * 6  # 24 tasks, 4 groups a step
    assert batch.cancelled_samples == 0 and batch.staleness_max == 0
    # ÷ the server's batch limit (the simulator states its max_num_seqs), not ÷ the 16
    # samples a step launches: the server idles three quarters of its seats at best
    assert batch.busy_source == "server" and batch.capacity == 64
    assert batch.capacity_source == "max_num_seqs"
    assert all((step.busy_share or 0) <= 16 / 64 for step in batch.steps)
    assert all(0 <= (step.tail_share or 0) <= 1 for step in batch.steps)
    rows = read_rows(tmp_path / "rollouts.jsonl")
    assert len(rows) == 96
    steps = {row["_ng_task_index"]: row["_autotune"]["step"] for row in rows}  # type: ignore[index]
    assert sorted(steps.values()) == sorted(i // 4 for i in range(24))  # four groups a step
    share = summary.groups.informative_share
    assert share is not None and 0.3 < share < 0.9


@pytest.mark.slow
async def test_a_busy_share_is_over_what_the_kv_cache_holds_when_that_is_fewer(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    """A KV cache sized for about a dozen samples: the busy share's denominator is its
    capacity (vLLM's cache_config_info) ÷ the tokens a sample took, not max_num_seqs."""
    memory = ("--gpu-memory-utilization", "0.22", "--max-model-len", "2560")
    async with sim_process(*RL_SIM, *memory) as sim:
        async with aiohttp.ClientSession() as session:
            sampler = PrometheusSampler(session, sim.base_url.removesuffix("/v1") + "/metrics")
            values = await sampler.sample()
        assert values is not None and values["autotune_max_num_seqs"] == 64
        kv_tokens = values["kv_capacity_tokens"]
        config = _collect(sim.base_url, tmp_path, BatchSpec(batch_groups=4), tasks=8)
        summary = await collect(config)
    batch = summary.batch
    assert batch is not None and batch.capacity_source == "KV cache"
    assert batch.failed_samples == 0
    rows = read_rows(tmp_path / "rollouts.jsonl")
    usage = [row["response"]["usage"] for row in rows]  # type: ignore[index]
    tokens = sum(u["input_tokens"] + u["output_tokens"] for u in usage) / len(usage)
    assert batch.capacity < 64 and batch.capacity == pytest.approx(kv_tokens / tokens, rel=0.05)


@pytest.mark.slow
async def test_over_sampling_cancels_on_the_server_and_loses_nothing(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    async with sim_process(*RL_SIM) as sim:
        config = _collect(sim.base_url, tmp_path, BatchSpec(batch_groups=2, over_sample=1.0))
        summary = await collect(config)
        server = await _ended(sim.base_url)
    batch = summary.batch
    assert batch is not None
    # A step ends at B = 2 informative groups, cancelling the rest; only a step whose
    # four groups held fewer ran them all.
    assert all(step.informative >= 2 or not step.cancelled for step in batch.steps)
    assert any(step.cancelled for step in batch.steps)
    assert summary.cancelled == batch.cancelled_samples > 0
    # Cancelled samples stopped on the server: aborted there, none left running. (One whose
    # answer was already on its way when its step ended is cancelled here, done there.)
    assert 0 < server["abort"] <= summary.cancelled and server["running"] == 0
    assert batch.cancelled_tokens is not None and batch.cancelled_tokens > 0
    rows = read_rows(tmp_path / "rollouts.jsonl")
    failures = read_rows(failures_path(tmp_path / "rollouts.jsonl"))
    assert {row["failure_class"] for row in failures} == {"cancelled"}
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows + failures]
    assert len(keys) == len(set(keys)) == 4 * 24  # every launched sample, once
    assert server["stop"] + server["length"] + server["abort"] == 4 * 24


@pytest.mark.slow
async def test_carry_over_finishes_samples_in_later_steps(
    sim_process: SimProcess, tmp_path: Path
) -> None:
    async with sim_process(*RL_SIM) as sim:
        config = _collect(sim.base_url, tmp_path, BatchSpec(batch_groups=2, carry_over=True))
        config = replace(config, live=LiveConfig(report=tmp_path / "report"))
        summary = await collect(config)
    batch = summary.batch
    assert batch is not None and batch.cancelled_samples == 0
    rows = read_rows(tmp_path / "rollouts.jsonl")
    ages = [row["_autotune"]["age_steps"] for row in rows]  # type: ignore[index]
    assert len(rows) == 96 and max(ages) >= 1 and batch.staleness_max == max(ages)
    assert batch.staleness_mean is not None and batch.staleness_mean > 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "RL goodput: informative groups/s" in page and "staleness max (steps)" in page


def test_batch_settings_are_checked_together() -> None:
    with pytest.raises(ValueError, match="give batch_groups"):
        BatchSpec(over_sample=0.5)
    with pytest.raises(UsageError, match="a group of one sample is never informative"):
        CollectConfig(batch=BatchSpec(batch_groups=2, over_sample=0.5))
    with pytest.raises(UsageError, match="collect into a new --output-dir"):
        CollectConfig(batch=BatchSpec(batch_groups=2), output=Path("x.jsonl"), resume=True)


# -- diagnose: tail-bound ------------------------------------------------------------------


async def _diagnoses(sim_process: SimProcess, sigma: str, runs: int) -> list[str]:
    flags = ("--output-length-sigma", sigma, "--uninformative-share", "0.4")
    flags += ("--natural-output-tokens", "128", "--max-num-seqs", "256", "--time-scale", "0.05")
    verdicts = []
    async with sim_process(*flags) as sim:
        collect_config = _collect(sim.base_url, Path("unused"), BatchSpec(batch_groups=4))
        collect_config = replace(collect_config, output=None, num_repeats=8, parallelism=None)
        for _ in range(runs):
            config = DiagnoseConfig(collect_config, low=2, high=8, min_s=0.5, max_s=1.5)
            result = await diagnose(config)
            assert result.batch is not None and len(result.batch.steps) == PROBE_DEFAULTS.steps
            for probe in result.probes:  # the pair probes count groups too, in their windows
                groups = probe.groups
                assert groups is not None and groups.size == 8
                assert groups.complete * 8 <= probe.completed + 8 * probe.parallelism
                assert groups.informative_groups_per_s == pytest.approx(
                    groups.informative / probe.measured_s
                )
            verdicts.append(result.verdict.verdict)
    return verdicts


@pytest.mark.slow
@pytest.mark.measures
async def test_diagnose_says_tail_bound_on_a_long_tail_five_times_of_five(
    sim_process: SimProcess,
) -> None:
    assert await _diagnoses(sim_process, sigma="1.0", runs=5) == ["tail-bound"] * 5


@pytest.mark.slow
@pytest.mark.measures
async def test_diagnose_never_says_tail_bound_on_a_short_tail(sim_process: SimProcess) -> None:
    assert "tail-bound" not in await _diagnoses(sim_process, sigma="0.1", runs=5)
