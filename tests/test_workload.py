"""Task loading: the three input formats, Responses → chat conversion, bad lines, slicing."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from autotune.config.collection import Shard, SyntheticWorkload
from autotune.errors import UsageError
from autotune.rollout.workload import (
    Workload,
    read_tasks,
    synthetic_tasks,
    task_from_row,
    work_items,
)


def _write(path: Path, rows: list[object]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_every_nemo_gym_example_loads(nemo_gym_data: Path) -> None:
    files = sorted(nemo_gym_data.glob("*.example.jsonl"))
    assert files
    for path in files:
        tasks = list(read_tasks(path))
        assert len(tasks) == 5, path.name
        for task in tasks:
            assert task.messages and all(isinstance(m["content"], str) for m in task.messages)
            assert task.create_params is task.row["responses_create_params"]


def test_input_parts_developer_role_and_tools_convert_to_chat() -> None:
    row = {
        "responses_create_params": {
            "input": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "type": "message",
                    "content": [
                        {"type": "input_text", "text": "hi "},
                        {"type": "input_text", "text": "there"},
                    ],
                },
            ],
            "max_output_tokens": 33,
            "temperature": 0.5,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
        },
        "expected_answer": "x",
    }
    task = task_from_row(3, row)
    assert task.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi there"},
    ]
    assert task.sampling["max_tokens"] == 33
    assert task.sampling["temperature"] == 0.5
    assert task.sampling["tools"][0]["function"]["name"] == "get_weather"
    assert task.verifier_fields() == {"expected_answer": "x"}


def test_chat_and_prompt_rows() -> None:
    chat = task_from_row(0, {"messages": [{"role": "user", "content": "q"}], "answer": 1})
    assert chat.messages == [{"role": "user", "content": "q"}]
    assert chat.create_params == {"input": [{"role": "user", "content": "q"}]}
    prompt = task_from_row(1, {"prompt": "2+2=", "max_tokens": 4})
    assert prompt.prompt == "2+2="
    assert prompt.sampling == {"max_tokens": 4}


def test_malformed_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"\n')
    with pytest.raises(UsageError, match=r"line 3 is not valid JSON"):
        list(read_tasks(path))


def test_row_without_a_prompt_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "tasks.jsonl", [{"prompt": "a"}, {"question": "b"}])
    with pytest.raises(UsageError, match=r"line 2 is not a task"):
        list(read_tasks(path))


def test_missing_file_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        list(read_tasks(tmp_path / "nope.jsonl"))


def test_shards_are_contiguous_and_cover_everything(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"prompt": str(i)} for i in range(10)])
    seen: list[int] = []
    for i in range(3):
        workload = Workload(path, SyntheticWorkload(), shard=Shard(i, 3))
        start, stop = workload.task_range()
        seen += [t.index for t in workload.tasks(start, stop)]
    assert seen == list(range(10))


def test_limit_and_repeats_and_resume_skip(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"prompt": str(i)} for i in range(5)])
    workload = Workload(path, SyntheticWorkload(), limit=3, num_repeats=2)
    start, stop = workload.task_range()
    items = [(w.task.index, w.rollout_index) for w in work_items(workload, start, stop)]
    assert items == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    done = {(1 << 20) | 1, 0}
    left = [(w.task.index, w.rollout_index) for w in work_items(workload, start, stop, done)]
    assert left == [(0, 1), (1, 0), (2, 0), (2, 1)]


def test_shard_flag_validation() -> None:
    assert Shard.parse("1/4") == Shard(1, 4)
    for bad in ("4/4", "x/2", "1", "-1/3"):
        with pytest.raises(UsageError, match="--shard"):
            Shard.parse(bad)


def test_synthetic_tasks_are_stable_per_index() -> None:
    spec = SyntheticWorkload(
        num_tasks=50,
        prompt_tokens_mean=100,
        prompt_tokens_std=10,
        output_tokens_mean=20,
        output_tokens_std=5,
        seed=7,
    )
    whole = list(synthetic_tasks(spec))
    part = list(synthetic_tasks(spec, 10, 20))
    assert [t.row for t in whole[10:20]] == [t.row for t in part]
    lengths = [t.sampling["max_tokens"] for t in whole]
    assert 10 < sum(lengths) / len(lengths) < 30
    assert abs(sum(len(t.prompt) for t in whole) / 50 - 400) < 60  # ~4 characters a token
