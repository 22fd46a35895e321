"""Responses-API shaped objects, as NeMo Gym rows carry them.

Backends speak chat/completions; rows store a Responses-style `response` so that
NeMo Gym's own tools (and its verifiers) read our output unchanged.
"""

from __future__ import annotations

import time
from typing import Any

CHARS_PER_TOKEN = 4  # the rule of thumb for a text's tokens, the client's and the simulator's


def build_response(
    *,
    response_id: str,
    model: str,
    text: str,
    tool_calls: list[dict[str, Any]] | None,
    input_tokens: int,
    output_tokens: int,
    finish_reason: str | None,
    request: dict[str, Any],
    output: list[dict[str, Any]] | None = None,
    reasoning: str = "",
) -> dict[str, Any]:
    """A Responses-API `response` object from one chat/completions answer, or from a
    multi-turn rollout's `output` items (every turn's, tool outputs included).

    `request` is the task's `responses_create_params`: a response echoes its tool
    settings, which NeMo Gym's response model requires.
    """
    if output is None:
        output = output_items(response_id, text, tool_calls, reasoning)
    return {
        "id": f"resp_{response_id}",
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "status": "incomplete" if finish_reason == "length" else "completed",
        "incomplete_details": {"reason": "max_output_tokens"}
        if finish_reason == "length"
        else None,
        "error": None,
        "output": output,
        "tools": request.get("tools") or [],
        "tool_choice": request.get("tool_choice") or "auto",
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def output_items(
    response_id: str, text: str, tool_calls: list[dict[str, Any]] | None, reasoning: str = ""
) -> list[dict[str, Any]]:
    """One answer's Responses-API output items: its `reasoning` (as NeMo Gym's vllm_model
    writes a reasoning parser's output: one summary_text), a `function_call` per tool
    call, then the assistant `message` (also when empty and no tool was called)."""
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{response_id}",
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    for call in tool_calls or ():
        function = call.get("function") or {}
        output.append(
            {
                "type": "function_call",
                "id": call.get("id", ""),
                "call_id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
                "status": "completed",
            }
        )
    if text or not any(item["type"] == "function_call" for item in output):
        output.append(
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                ],
            }
        )
    return output


def response_text(response: dict[str, Any] | None) -> str:
    """All assistant output text of a Responses-API object, joined."""
    if not response:
        return ""
    parts: list[str] = []
    for item in response.get("output") or ():
        if item.get("type") == "message":
            for content in item.get("content") or ():
                text = content.get("text")
                if isinstance(text, str):
                    parts.append(text)
    return "".join(parts)
