"""Model backends: a task in, one model generation out.

The engine owns this Protocol. Backends take their HTTP session as an argument, so
tests run them in-process against the simulated server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.rollout.replicas import ReplicaSet
from autotune.rollout.workload import Task


@dataclass(slots=True)
class Generation:
    """What one model call produced, with its timings (time.time() seconds)."""

    text: str
    tool_calls: list[dict[str, Any]]
    input_tokens: int
    output_tokens: int
    finish_reason: str | None
    response_id: str
    model_start: float
    first_token: float | None
    model_end: float
    attempts: int = 1
    replica: int = 0  # which of the run's replicas answered (autotune/rollout/replicas.py)
    # A whole rollout made elsewhere (a NeMo Gym agent's /run answer): the row as it came.
    row: dict[str, Any] | None = None
    # What a reasoning parser split off the answer (vLLM's `reasoning_content`, or
    # `reasoning` from vLLM 0.16 on), as the server sent it.
    reasoning: str = ""
    # A multi-turn rollout (autotune.rollout.turns): every turn's Responses output items, tool
    # outputs included; each turn's timings (its model call, then its tool calls); and
    # the seconds spent in the environment (its session's start and every tool call).
    output: list[dict[str, Any]] | None = None
    turns: list[dict[str, Any]] | None = None
    tool_s: float = 0.0
    tool_errors: int = 0  # tool calls that answered an error status, fed back to the model


class ModelCallError(Exception):
    """A model call that failed for good (after retries).

    `failure_class` keys the error tables: timeout (no answer in time, or a stream that
    stalled), connection, rate_limited, http_4xx, http_5xx, bad_response (an answer of
    the wrong shape), truncated (a stream that ended before its answer did) or
    tool_error (a multi-turn rollout's tool endpoint could not be used, or answered an
    error under `--tool-errors fail`), tool_timeout (a tool call with no answer within
    `--tool-timeout`) or aborted (the server ended it, `finish_reason: abort`: a pause
    for a weight sync; never retried, the RL loop re-sends it after the sync).
    """

    def __init__(self, failure_class: str, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.failure_class = failure_class
        self.attempts = attempts


@dataclass(slots=True)
class CallCounters:
    """Retry-level events the summary and diagnose read (429s, Retry-After, ...)."""

    retries: dict[str, int] = field(default_factory=dict)
    rate_limited_responses: int = 0  # HTTP 429
    unavailable_responses: int = 0  # HTTP 503: a server shedding load
    retry_after_seen: int = 0
    limiter_wait_s: float = 0.0
    unstreamed_answers: int = 0  # streamed requests answered with one JSON body
    # Text pieces streamed so far (one token each on most servers), counted as they come:
    # a probe of long rollouts times its throughput by them where the server does not
    # count its generated tokens itself (probe.window).
    streamed_tokens: int = 0
    # The pieces and the tokens (as the server's usage counts them) of the streamed answers
    # that ended: their ratio converts a rate of pieces into tokens (a server may stream
    # several tokens a piece).
    ended_pieces: int = 0
    ended_tokens: int = 0
    # Multi-turn rollouts' tool calls (autotune.rollout.turns): made, answered with an error
    # status, and in flight now (a probe counts the ones still hanging when it ends).
    tool_calls: int = 0
    tool_errors: int = 0
    tool_calls_in_flight: int = 0
    # Where a model server's calls went when several replicas serve it (None: an agent).
    replicas: ReplicaSet | None = None
    # Set by an engine with an adaptive concurrency limit, which every retry must pass.
    retry_gate: Callable[[], Awaitable[None]] | None = None

    def count_retry(self, failure_class: str) -> None:
        self.retries[failure_class] = self.retries.get(failure_class, 0) + 1

    @property
    def overloads(self) -> int:
        """Grows with every 429 and 503: the answers an adaptive concurrency limit backs
        off on."""
        return self.rate_limited_responses + self.unavailable_responses

    async def before_retry(self) -> None:
        """A backend awaits this just before it re-sends a failed call, after its backoff,
        so retries queue behind an adaptive concurrency limit instead of storming past it."""
        if self.retry_gate is not None:
            await self.retry_gate()


class ModelBackend(Protocol):
    """One way of calling a model server (openai.py), or of having a whole rollout made by
    a NeMo Gym agent server (nemo_gym_agent.py: its Generation carries the row)."""

    model: str
    counters: CallCounters

    async def generate(self, task: Task) -> Generation: ...
