"""Multi-turn rollouts: NeMo Gym's simple-agent loop, in autotune's own engine.
What a multi-turn Generation carries, and why: docs/design/rollout.md.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from autotune.results.responses import output_items
from autotune.rollout.backends import Generation, ModelBackend, ModelCallError
from autotune.rollout.tools import ToolCallError, ToolOutput, Tools
from autotune.rollout.workload import Task


class MultiTurnBackend:
    """A backend whose `generate` is a whole tool-calling rollout over `backend`."""

    def __init__(
        self, backend: ModelBackend, tools: Tools, max_turns: int, tool_errors: str = "feed"
    ) -> None:
        self._backend = backend
        self._tools = tools
        self._max_turns = max_turns
        self._fail_on_tool_errors = tool_errors == "fail"
        self.model = backend.model
        self.counters = backend.counters

    async def generate(self, task: Task) -> Generation:
        """Model calls and tool calls until the rollout ends; raises ModelCallError (a
        `tool_error` or `tool_timeout` when a tool endpoint fails it)."""
        tools = self._tools
        started = time.time()
        try:
            state = await tools.open(task.row)
        except ToolCallError as error:
            raise ModelCallError(error.failure_class, str(error)) from None
        tool_s = time.time() - started
        messages = task.messages
        output: list[dict[str, Any]] = []
        turns: list[dict[str, Any]] = []
        input_tokens = output_tokens = attempts = tool_errors = 0
        first: Generation | None = None
        for turn in range(1, self._max_turns + 1):
            call_task = task if turn == 1 else replace(task, messages=messages)
            answer = await self._backend.generate(call_task)
            first = first or answer
            input_tokens += answer.input_tokens
            output_tokens += answer.output_tokens
            attempts += answer.attempts
            output += output_items(
                answer.response_id, answer.text, answer.tool_calls, answer.reasoning
            )
            timed: list[dict[str, Any]] = []
            turns.append(
                {
                    "model_start": answer.model_start,
                    "first_token": answer.first_token,
                    "model_end": answer.model_end,
                    "tools": timed,
                }
            )
            calls = answer.tool_calls
            if not calls or answer.finish_reason == "length":
                break
            messages = [
                *messages,
                {"role": "assistant", "content": answer.text or None, "tool_calls": calls},
            ]
            for call in calls:
                function = call.get("function") or {}
                name, call_id = function.get("name", ""), call.get("id", "")
                called = time.time()
                result = await self._call(state, name, function.get("arguments", ""))
                if result.error is not None:
                    tool_errors += 1
                    if self._fail_on_tool_errors:
                        failed = f"tool {name} answered {result.error} (--tool-errors fail)"
                        raise ModelCallError("tool_error", failed)
                ended = time.time()
                tool_s += ended - called
                timed.append({"name": name, "start": called, "end": ended})
                output.append(  # as NeMo Gym writes it, its id and status unset
                    {
                        "type": "function_call_output",
                        "call_id": call_id,
                        "output": result.text,
                        "id": None,
                        "status": None,
                    }
                )
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result.text})
        assert first is not None  # max_turns is at least 1
        return Generation(
            text=answer.text,
            tool_calls=answer.tool_calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            finish_reason=answer.finish_reason,
            response_id=first.response_id,
            model_start=started,
            first_token=first.first_token,
            model_end=time.time(),
            attempts=attempts,
            output=output,
            turns=turns,
            tool_s=tool_s,
            tool_errors=tool_errors,
        )

    async def _call(self, state: dict[str, str], name: str, arguments: str) -> ToolOutput:
        """One tool call, counted: made, in flight while it runs, and answered an error."""
        counters = self.counters
        counters.tool_calls += 1
        counters.tool_calls_in_flight += 1
        try:
            result = await self._tools.call(state, name, arguments)
        except ToolCallError as error:
            raise ModelCallError(error.failure_class, str(error)) from None
        finally:
            counters.tool_calls_in_flight -= 1
        if result.error is not None:
            counters.tool_errors += 1
        return result
