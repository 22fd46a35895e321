"""Tasks in: NeMo Gym JSONL, chat JSONL, prompt JSONL, or a synthetic workload, streamed.
Why: docs/design/rollout.md.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from autotune.config.collection import CollectConfig, Shard, SyntheticWorkload
from autotune.errors import UsageError
from autotune.results.responses import CHARS_PER_TOKEN
from autotune.results.runs import WorkloadRecord

# Responses-API sampling fields that map one-to-one onto chat/completions fields.
_PASSTHROUGH_SAMPLING = (
    "temperature",
    "top_p",
    "tool_choice",
    "parallel_tool_calls",
    "seed",
    "stop",
)


@dataclass(frozen=True, slots=True)
class Task:
    """One prompt, ready for a chat or completions call.

    `row` is the task as read (NeMo Gym keeps verifier fields beside
    `responses_create_params`); `messages`/`prompt` and `sampling` are derived from it.
    """

    index: int
    row: dict[str, Any]
    messages: list[dict[str, Any]]
    prompt: str
    sampling: dict[str, Any]

    @property
    def create_params(self) -> dict[str, Any]:
        """`responses_create_params` as NeMo Gym output rows carry it."""
        params = self.row.get("responses_create_params")
        if params is not None:
            return params
        if "messages" in self.row:
            return {"input": self.row["messages"]}
        return {"input": self.row.get("prompt", "")}

    def verifier_fields(self) -> dict[str, Any]:
        """Every top-level key but the request itself: metadata the verifier reads."""
        return {
            k: v
            for k, v in self.row.items()
            if k not in ("responses_create_params", "messages", "prompt")
        }


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One rollout to make: (task, rollout index)."""

    task: Task
    rollout_index: int


def _content_text(content: Any) -> str:
    """Message content as plain text (a string, or a list of parts carrying `text`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    return str(content)


def _chat_messages(items: Any) -> list[dict[str, Any]]:
    """Responses-style `input` (a string or a list of items) as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ValueError("`input` must be a string or a list of messages")
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("each `input` item must be an object")
        kind = item.get("type", "message")
        if kind == "function_call":
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": item.get("call_id", ""),
                            "type": "function",
                            "function": {
                                "name": item.get("name", ""),
                                "arguments": item.get("arguments", ""),
                            },
                        }
                    ],
                }
            )
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": _content_text(item.get("output")),
                }
            )
        else:
            role = item.get("role", "user")
            # Chat templates know "system"; the Responses API's "developer" is the same thing.
            messages.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _content_text(item.get("content")),
                }
            )
    return messages


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Responses-style flat function tools as chat-completions nested tools."""
    if not isinstance(tools, list):
        raise ValueError("`tools` must be a list of tool objects")
    converted = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise ValueError("each tool must be an object")
        if tool.get("type") == "function" and "function" not in tool:
            function = {k: v for k, v in tool.items() if k != "type"}
            converted.append({"type": "function", "function": function})
        else:
            converted.append(tool)
    return converted


def _flat_prompt(messages: list[dict[str, Any]]) -> str:
    """A completions prompt from chat messages, for servers without a chat template."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"] or ""
    lines = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
    return "\n".join(lines) + "\nassistant:"


def task_from_row(index: int, row: Any) -> Task:
    """Interpret one JSONL object; raises ValueError naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    sampling: dict[str, Any] = {}
    if "responses_create_params" in row:
        params = row["responses_create_params"]
        if not isinstance(params, dict) or "input" not in params:
            raise ValueError("`responses_create_params` must be an object with `input`")
        messages = _chat_messages(params["input"])
        if params.get("instructions"):
            messages.insert(0, {"role": "system", "content": str(params["instructions"])})
        if params.get("max_output_tokens") is not None:
            sampling["max_tokens"] = params["max_output_tokens"]
        for key in _PASSTHROUGH_SAMPLING:
            if params.get(key) is not None:
                sampling[key] = params[key]
        if params.get("tools"):
            sampling["tools"] = _chat_tools(params["tools"])
        else:
            sampling.pop("tool_choice", None)
            sampling.pop("parallel_tool_calls", None)
    elif "messages" in row:
        messages = _chat_messages(row["messages"])
    elif "prompt" in row:
        if not isinstance(row["prompt"], str):
            raise ValueError("`prompt` must be a string")
        messages = [{"role": "user", "content": row["prompt"]}]
    else:
        raise ValueError("expected `responses_create_params`, `messages` or `prompt`")
    for key in ("max_tokens", "temperature", "top_p"):
        if key in row and key not in sampling and "responses_create_params" not in row:
            sampling[key] = row[key]
    prompt = row["prompt"] if isinstance(row.get("prompt"), str) else _flat_prompt(messages)
    return Task(index=index, row=row, messages=messages, prompt=prompt, sampling=sampling)


def count_tasks(path: Path) -> int:
    """Non-blank lines in a task file (one cheap pass; needed for shards and ETA)."""
    count = 0
    with _open_tasks(path) as handle:
        for line in handle:
            if line.strip():
                count += 1
    return count


def _open_tasks(path: Path) -> Any:
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise UsageError(f"task file {path} does not exist; check the --input path.") from None
    except IsADirectoryError:
        raise UsageError(f"task file {path} is a directory; pass a .jsonl file.") from None
    except PermissionError:
        raise UsageError(f"task file {path} cannot be read (permission denied).") from None


def read_tasks(path: Path, start: int = 0, stop: int | None = None) -> Iterator[Task]:
    """Tasks [start, stop) of a JSONL file, streamed; a bad line raises UsageError naming it."""
    with _open_tasks(path) as handle:
        index = -1
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            index += 1
            if index < start:
                continue
            if stop is not None and index >= stop:
                return
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                raise UsageError(
                    f"{path} line {line_number} is not valid JSON ({error}); "
                    "fix or remove that line."
                ) from None
            try:
                yield task_from_row(index, row)
            except ValueError as error:
                raise UsageError(
                    f"{path} line {line_number} is not a task: {error}; "
                    "each line needs `responses_create_params`, `messages` or `prompt`."
                ) from None


def synthetic_tasks(
    spec: SyntheticWorkload, start: int = 0, stop: int | None = None
) -> Iterator[Task]:
    """Generated prompts with normally distributed prompt and output lengths.

    Each task's lengths come from its own seeded generator, so a task is the same
    whichever shard or resumed run makes it.
    """
    words = ("lorem", "ipsum", "dolor", "sit", "amet", "tempor", "magna", "aliqua")
    text = " ".join(words[i % len(words)] for i in range(4096))
    end = spec.num_tasks if stop is None else min(stop, spec.num_tasks)
    for index in range(start, end):
        rng = random.Random(spec.seed * 1_000_003 + index)
        prompt_tokens = max(1, round(rng.gauss(spec.prompt_tokens_mean, spec.prompt_tokens_std)))
        output_tokens = max(1, round(rng.gauss(spec.output_tokens_mean, spec.output_tokens_std)))
        chars = prompt_tokens * CHARS_PER_TOKEN
        repeats = chars // len(text) + 1
        prompt = f"[{index}] " + (text * repeats)[: max(0, chars - 8)]
        row = {
            "responses_create_params": {
                "input": [{"role": "user", "content": prompt}],
                "max_output_tokens": output_tokens,
            },
            "expected_answer": "42",
        }
        yield Task(
            index=index,
            row=row,
            messages=[{"role": "user", "content": prompt}],
            prompt=prompt,
            sampling={"max_tokens": output_tokens},
        )


@dataclass(frozen=True, slots=True)
class Workload:
    """Where tasks come from and which slice of them this run makes."""

    input: Path | None
    synthetic: SyntheticWorkload
    limit: int | None = None
    num_repeats: int = 1
    shard: Shard | None = None

    def task_range(self) -> tuple[int, int]:
        """[start, stop) task indices after --limit and --shard."""
        total = count_tasks(self.input) if self.input is not None else self.synthetic.num_tasks
        if self.limit is not None:
            total = min(total, self.limit)
        if self.shard is None:
            return 0, total
        size, extra = divmod(total, self.shard.count)
        start = self.shard.index * size + min(self.shard.index, extra)
        return start, start + size + (1 if self.shard.index < extra else 0)

    def tasks(self, start: int, stop: int) -> Iterator[Task]:
        if self.input is not None:
            return read_tasks(self.input, start, stop)
        return synthetic_tasks(self.synthetic, start, stop)

    def probe_tasks(self, most: int = 5000) -> list[Task]:
        """The first `most` tasks of this run's slice, held in memory, each `num_repeats`
        times in a row (a GRPO group sharing its prompt, as collect sends them): a probe
        cycles through them for as long as it measures."""
        start, stop = self.task_range()
        tasks = list(self.tasks(start, min(stop, start + most)))
        if not tasks:
            raise UsageError("the workload holds no task; pass a task file with at least one line.")
        return [task for task in tasks for _ in range(self.num_repeats)]

    def validate(self) -> None:
        """Parse every task once before any request is sent, so a bad line fails fast."""
        if self.input is not None:
            start, stop = self.task_range()
            for _ in read_tasks(self.input, start, stop):
                pass


def work_items(
    workload: Workload, start: int, stop: int, done: set[int] | None = None
) -> Iterator[WorkItem]:
    """Rollouts to make, task-major, skipping keys already in `done` (see rollout_key)."""
    repeats = workload.num_repeats
    for task in workload.tasks(start, stop):
        for rollout_index in range(repeats):
            if done and rollout_key(task.index, rollout_index) in done:
                continue
            yield WorkItem(task, rollout_index)


def rollout_key(task_index: int, rollout_index: int) -> int:
    """One int per (task, rollout): a compact set member for resume bookkeeping."""
    return (task_index << 20) | rollout_index


def workload_record(config: CollectConfig) -> WorkloadRecord:
    """What `config` runs on, as a recommendation records it and `--expect` compares it;
    `config.target.extra_body` must be the fields actually sent (automatic ones included)."""
    target, synthetic = config.target, config.synthetic
    path = config.input
    return WorkloadRecord(
        input=str(path) if path is not None else None,
        input_sha256=_sha256(path) if path is not None else None,
        synthetic_tasks=synthetic.num_tasks if path is None else None,
        prompt_tokens=(synthetic.prompt_tokens_mean, synthetic.prompt_tokens_std)
        if path is None
        else None,
        output_tokens=(synthetic.output_tokens_mean, synthetic.output_tokens_std)
        if path is None
        else None,
        seed=synthetic.seed if path is None else None,
        limit=config.limit,
        num_repeats=config.num_repeats,
        extra_body=dict(target.extra_body),
        api=target.api,
        stream=target.stream,
        verifier=config.verifier,
    )


def _sha256(path: Path) -> str | None:
    """The file's content hash; None where it cannot be read (the run itself says why)."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def workload_flags(record: WorkloadRecord) -> list[str]:
    """The flags of `autotune collect` or `diagnose` that run on `record`'s workload."""
    words: list[str] = []
    if record.input is not None:
        words += ["--input", record.input]
    if record.synthetic_tasks is not None:
        words += ["--synthetic", str(record.synthetic_tasks)]
    for flag, tokens in (
        ("--prompt-tokens", record.prompt_tokens),
        ("--output-tokens", record.output_tokens),
    ):
        if tokens is not None:
            words += [flag, f"{tokens[0]},{tokens[1]}"]
    if record.seed is not None:
        words += ["--seed", str(record.seed)]
    if record.limit is not None:
        words += ["--limit", str(record.limit)]
    if record.num_repeats != 1:
        words += ["--num-repeats", str(record.num_repeats)]
    if record.extra_body:
        words += ["--extra-body", orjson.dumps(record.extra_body).decode()]
    if record.api != "chat":
        words += ["--api", record.api]
    if not record.stream:
        words.append("--no-stream")
    return [*words, "--verifier", record.verifier]
