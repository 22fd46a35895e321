"""How the simulated server reads a request as vLLM does: its prompt and prefix-cache key,
its output length, a simulated tool call, and the error body vLLM answers with; and the
fields an engine that refuses unknown ones (TensorRT-LLM) takes, with its 400's body.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Hashable
from typing import Any

import orjson
from aiohttp import web

from autotune.engines import Dialect
from autotune.servers.sim.policy import uniform

DEFAULT_MAX_TOKENS = 256


TOKEN_TEXT = "tok "  # 4 characters: one simulated token


def natural_output_tokens(text: str, seed: int, mean: int) -> int:
    """Where the fake model stops on its own: exponential with `mean`, fixed by text and seed."""
    return max(1, round(-mean * math.log(uniform(text, str(seed)))))


_PLACEHOLDERS: dict[Any, Any] = {"string": "sim", "integer": 1, "number": 1.0, "boolean": True}


def simulated_tool_call(tools: Any, text: str, seed: int) -> dict[str, Any] | None:
    """One chat-completions tool call to a tool of `tools` (chosen by a draw on `text`),
    its arguments a placeholder per schema property; None when no tool has a name."""
    functions: list[dict[str, Any]] = [
        t["function"] if isinstance(t.get("function"), dict) else t
        for t in tools if isinstance(t, dict)
    ]  # fmt: skip
    named = [f for f in functions if isinstance(f.get("name"), str) and f["name"]]
    if not named:
        return None
    function = named[int(uniform(text, f"{seed}/tool") * len(named)) % len(named)]
    schema = function.get("parameters")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    arguments = {
        name: _PLACEHOLDERS.get(spec.get("type") if isinstance(spec, dict) else None)
        for name, spec in (properties.items() if isinstance(properties, dict) else ())
    }
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": function["name"], "arguments": json_text(arguments)},
    }


def error_response(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """vLLM's (OpenAI-style) error body."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


# OpenAI's request fields that TensorRT-LLM's request models take, by endpoint
# (tensorrt_llm/serve/openai_protocol.py: ChatCompletionRequest, CompletionRequest).
OPENAI_CHAT_FIELDS = frozenset(
    {
        "messages", "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
        "max_completion_tokens", "max_tokens", "n", "presence_penalty", "response_format",
        "seed", "stop", "stream", "stream_options", "temperature", "top_p", "tools",
        "tool_choice", "parallel_tool_calls", "user", "reasoning_effort", "echo",
    }
)  # fmt: skip
OPENAI_COMPLETION_FIELDS = frozenset(
    {
        "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
        "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options",
        "suffix", "temperature", "top_p", "user",
    }
)  # fmt: skip


def unknown_fields(body: dict[str, Any], chat: bool, dialect: Dialect) -> list[str]:
    """The body's fields that neither OpenAI's request nor the engine's extras name."""
    known = (OPENAI_CHAT_FIELDS if chat else OPENAI_COMPLETION_FIELDS) | dialect.extra_fields
    return [name for name in body if name not in known]


def validation_error(body: dict[str, Any], fields: list[str]) -> web.Response:
    """TensorRT-LLM's 400 for fields its request models forbid: FastAPI's validation errors
    as text under `error` (openai_server.py's RequestValidationError handler)."""
    errors = [
        {
            "type": "extra_forbidden",
            "loc": ("body", name),
            "msg": "Extra inputs are not permitted",
            "input": body[name],
        }
        for name in fields
    ]
    return web.json_response({"error": str(errors)}, status=400)


class BadRequest(Exception):
    """A request the server answers with 400 and this message."""


def text_of(content: Any) -> str:
    """Message content: a string, or a list of parts whose `text` fields count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    raise BadRequest("message content must be a string or a list of content parts")


def prefix_key(body: dict[str, Any], chat: bool) -> Hashable:
    """What identifies the request's prompt for the prefix cache (the model is left out)."""
    parts = [body.get("messages"), body.get("tools")] if chat else [body.get("prompt")]
    return hashlib.blake2b(orjson.dumps(parts), digest_size=16).digest()


def prompt_of(body: dict[str, Any], chat: bool) -> tuple[str, int]:
    """(text the output length is keyed on, prompt tokens)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty list")
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                raise BadRequest("each message must be an object")
            parts.append(text_of(m.get("content")))
        text = "".join(parts)
        return text, max(1, math.ceil(len(text) / 4))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, max(1, math.ceil(len(prompt) / 4))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return ",".join(map(str, prompt)), len(prompt)
    raise BadRequest("`prompt` must be a string, a list of token ids or a list of one string")


def json_text(obj: Any) -> str:
    """A JSON body as text, written by orjson."""
    return orjson.dumps(obj).decode()
