"""A NeMo Gym agent server as the target: each rollout is one `POST {agent}/run`, the agent
making and verifying the whole rollout itself; connection errors and 429/5xx are retried.
Why: docs/design/backends.md.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import orjson

from autotune.config.collection import TargetConfig
from autotune.errors import ServerUnreachable, UsageError
from autotune.rollout.backends import CallCounters, Generation, ModelCallError
from autotune.rollout.workload import Task

AGENT_MODEL = "set by the NeMo Gym agent"  # what rows and summaries name as the model
PREFLIGHT_TIMEOUT_S = 5.0
_RETRYABLE = frozenset({429, 502, 503, 504})
_HEADERS = {"Content-Type": "application/json"}


class AgentBackend:
    """POSTs each task row to `{agent_url}/run`; the answer is the rollout row."""

    def __init__(self, session: aiohttp.ClientSession, target: TargetConfig, agent_url: str):
        self._session = session
        self._target = target
        self._url = agent_url.rstrip("/") + "/run"
        self._timeout = aiohttp.ClientTimeout(
            total=target.request_timeout_s, sock_connect=target.connect_timeout_s
        )
        self.model = AGENT_MODEL
        self.counters = CallCounters()

    async def generate(self, task: Task) -> Generation:
        """One rollout by the agent, retried on transient failures; raises ModelCallError."""
        data = orjson.dumps(task.row)
        target = self._target
        attempt = 0
        while True:
            attempt += 1
            started = time.time()
            try:
                row = await self._attempt(data)
            except _Transient as failure:
                if attempt > target.max_retries:
                    raise ModelCallError(failure.failure_class, str(failure), attempt) from None
                self.counters.count_retry(failure.failure_class)
                backoff = min(target.retry_max_s, target.retry_base_s * 2 ** (attempt - 1))
                await asyncio.sleep(random.uniform(0, backoff))
                await self.counters.before_retry()
                continue
            except ModelCallError as error:
                error.attempts = attempt
                raise
            return _generation(row, started, time.time(), attempt)

    async def _attempt(self, data: bytes) -> dict[str, Any]:
        try:
            async with self._session.post(
                self._url, data=data, headers=_HEADERS, timeout=self._timeout
            ) as resp:
                status = resp.status
                body = await resp.read()
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise ModelCallError(
                "timeout", f"the agent gave no answer within {self._target.request_timeout_s:g} s"
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            raise _Transient("connection", f"connection to the agent failed ({error})") from None
        if status != 200:
            text = body[:300].decode(errors="replace").replace("\n", " ")
            failure = "rate_limited" if status == 429 else f"http_{status // 100}xx"
            if status == 429:
                self.counters.rate_limited_responses += 1
            elif status == 503:
                self.counters.unavailable_responses += 1
            if status in _RETRYABLE:
                raise _Transient(failure, f"the agent answered HTTP {status}: {text}")
            raise ModelCallError(failure, f"the agent answered HTTP {status}: {text}")
        try:
            row = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise ModelCallError(
                "bad_response", f"the agent's answer is not JSON ({error})"
            ) from None
        if not isinstance(row, dict) or "reward" not in row or "response" not in row:
            raise ModelCallError(
                "bad_response", "the agent's answer is not a rollout (no 'reward' and 'response')"
            )
        return row


class _Transient(Exception):
    """One failed /run that may be retried."""

    def __init__(self, failure_class: str, message: str) -> None:
        super().__init__(message)
        self.failure_class = failure_class


def _generation(row: dict[str, Any], started: float, ended: float, attempts: int) -> Generation:
    """The agent's rollout as the engine's Generation: its row, its token counts."""
    response = row.get("response")
    response = response if isinstance(response, dict) else {}
    usage = response.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return Generation(
        text="",
        tool_calls=[],
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        finish_reason=None,
        response_id=str(response.get("id") or ""),
        model_start=started,
        first_token=None,
        model_end=ended,
        attempts=attempts,
        row=row,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class AgentRewardVerifier:
    """The agent verified each rollout itself: its `reward` is taken as it answered it."""

    name = "nemo-gym-agent"
    capacity: int | None = None

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"reward": row.get("reward")}

    async def aclose(self) -> None:
        """Nothing to release."""


async def check_agent(session: aiohttp.ClientSession, agent_url: str) -> None:
    """Checks within 5 s that `agent_url` answers and, where it publishes its routes
    (NeMo Gym's servers do, at /openapi.json), that it has /run; else one UsageError or
    ServerUnreachable sentence naming the fix."""
    url = agent_url.rstrip("/") + "/openapi.json"
    timeout = aiohttp.ClientTimeout(total=PREFLIGHT_TIMEOUT_S)
    try:
        async with session.get(url, timeout=timeout) as resp:
            routes = (await resp.json(content_type=None)) if resp.status == 200 else None
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        reason = str(error) or "no answer within 5 s"
        raise ServerUnreachable(
            f"cannot reach the NeMo Gym agent at {agent_url} ({reason}); start it (ng_run) "
            "or fix --agent-url."
        ) from None
    except (ValueError, aiohttp.ClientResponseError, aiohttp.ClientPayloadError):
        return  # no route list to read: the first /run will tell
    paths = routes.get("paths") if isinstance(routes, dict) else None
    if isinstance(paths, dict) and "/run" not in paths:
        raise UsageError(
            f"the server at {agent_url} has no /run route, so it is not a NeMo Gym agent; "
            "pass an agent's URL from the head server's /server_instances "
            "(a responses_api_agents entry) to --agent-url."
        )
