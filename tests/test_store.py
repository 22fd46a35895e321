"""Rollout files: refusing to clobber, resume after a truncated tail (and never onto
another run's file), merging shards."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from autotune.errors import UsageError
from autotune.rollout.store import (
    RolloutSink,
    check_run,
    completed_keys,
    failures_path,
    input_identity,
    merge_rollouts,
    run_path,
    save_run,
)
from autotune.rollout.workload import rollout_key


def _row(task: int, rollout: int = 0) -> dict[str, object]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0}


def test_existing_output_needs_resume(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    sink = RolloutSink(out, resume=False)
    sink.write(_row(0))
    sink.close()
    with pytest.raises(UsageError, match="--resume"):
        RolloutSink(out, resume=False)
    resumed = RolloutSink(out, resume=True)
    assert resumed.done == {rollout_key(0, 0)}
    resumed.close()


def test_truncated_last_line_is_cut_on_resume(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(orjson.dumps(_row(0)) + b"\n" + orjson.dumps(_row(1)) + b"\n" + b'{"_ng_ta')
    assert completed_keys(out) == {rollout_key(0, 0), rollout_key(1, 0)}
    assert out.read_bytes().endswith(b"\n")
    sink = RolloutSink(out, resume=True)
    sink.write(_row(2))
    sink.close()
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["_ng_task_index"] for r in rows] == [0, 1, 2]


def test_corrupt_middle_line_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"not json\n" + orjson.dumps(_row(1)) + b"\n")
    with pytest.raises(UsageError, match="line 1"):
        completed_keys(out)


def test_failures_go_beside_the_output(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    sink = RolloutSink(out, resume=False)
    sink.write_failure({"_ng_task_index": 0, "failure_class": "timeout"})
    sink.close()
    assert failures_path(out) == tmp_path / "run_failures.jsonl"
    assert orjson.loads(failures_path(out).read_bytes())["failure_class"] == "timeout"


def test_merge_drops_duplicates_and_truncated_tails(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_bytes(b"".join(orjson.dumps(_row(i)) + b"\n" for i in range(3)))
    b.write_bytes(
        b"".join(orjson.dumps(_row(i)) + b"\n" for i in range(2, 5)) + b'{"_ng_task_index": 9'
    )
    written, dropped = merge_rollouts([a, b], tmp_path / "all.jsonl")
    assert (written, dropped) == (5, 1)
    keys = [
        orjson.loads(x)["_ng_task_index"]
        for x in (tmp_path / "all.jsonl").read_bytes().splitlines()
    ]
    assert keys == [0, 1, 2, 3, 4]
    with pytest.raises(UsageError, match="already exists"):
        merge_rollouts([a], tmp_path / "all.jsonl")


def test_merge_of_a_foreign_file_leaves_nothing_behind(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    with pytest.raises(UsageError, match="not a rollout row"):
        merge_rollouts([bad], tmp_path / "merged.jsonl")
    assert not (tmp_path / "merged.jsonl").exists()


RUN = {
    "tasks": {"synthetic": {"seed": 0, "prompt_tokens": [256, 64], "output_tokens": [8, 2]}},
    "input": None,
    "verifier": "exact",
    "num_repeats": 2,
    "limit": 10,
    "model": "m",
}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"verifier": "boxed"}, "its verifier was 'exact', now 'boxed'); pass the same --verifier"),
        ({"num_repeats": 4}, "its --num-repeats was 2, now 4); pass the same --num-repeats"),
        ({"model": "other"}, "its model was 'm', now 'other'); collect from the same model"),
        (
            {"tasks": {"bytes": 9, "sha256_head": "ab" * 32}, "input": "t.jsonl"},
            "its tasks were synthetic with seed 0, prompts of 256±64 and outputs of 8±2 "
            "tokens, now t.jsonl of 9 bytes, sha256 abababababab); pass the same --input",
        ),
    ],
)
def test_resume_refuses_another_runs_output(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    out = tmp_path / "out.jsonl"
    save_run(out, RUN)
    assert run_path(out) == tmp_path / "out_run.json"
    check_run(out, RUN)  # its own run resumes
    check_run(out, {**RUN, "limit": 100, "shard": "1/4"})  # a wider or other slice adds rows
    with pytest.raises(UsageError) as caught:
        check_run(out, {**RUN, **change})
    message = str(caught.value)
    assert message.startswith(f"--resume: {out} holds rollouts of another run (")
    assert says in message and message.endswith("or choose another --output-dir.")


def test_run_records_are_optional_but_must_be_readable(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    check_run(out, RUN)  # an output from before run records resumes as before
    save_run(out, {key: value for key, value in RUN.items() if key != "model"})
    check_run(out, {**RUN, "model": "anything"})  # a key only one side has is not compared
    run_path(out).write_text("{not json")
    with pytest.raises(UsageError, match=r"out_run.json is not a run record .* delete it"):
        check_run(out, RUN)


def test_input_identity_is_the_content_not_the_path(tmp_path: Path) -> None:
    first, moved = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text('{"prompt": "a"}\n')
    moved.write_bytes(first.read_bytes())
    assert input_identity(first) == input_identity(moved)
    moved.write_text('{"prompt": "b"}\n')  # same size, other tasks
    assert input_identity(first) != input_identity(moved)
