"""Tools a multi-turn rollout calls between its model turns (autotune.rollout.turns runs
the loop): a NeMo Gym resources server, or the null tools.
Why: docs/design/rollout.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from autotune.errors import ServerUnreachable, UsageError

NULL_OUTPUT = '{"result": "ok"}'
PREFLIGHT_TIMEOUT_S = 5.0
_HEADERS = {"Content-Type": "application/json"}


class ToolCallError(Exception):
    """A tool endpoint that could not be used (refused, no session: `tool_error`) or gave
    no answer in time (`tool_timeout`): the rollout fails with that class. A tool that
    answers an error status is an output instead (a ToolOutput with its `error`)."""

    def __init__(self, message: str, failure_class: str = "tool_error") -> None:
        super().__init__(message)
        self.failure_class = failure_class


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool answered: the text the model reads next, and `error` ("HTTP 500")
    where the endpoint answered an error status."""

    text: str
    error: str | None = None


class Tools(Protocol):
    """Where a rollout's tool calls go."""

    name: str

    async def open(self, row: dict[str, Any]) -> dict[str, str]:
        """Starts one rollout's session with its task row; returns its state (cookies),
        which every call of that rollout is given and may update."""
        ...

    async def call(self, state: dict[str, str], name: str, arguments: str) -> ToolOutput:
        """The output of tool `name` called with `arguments` (a JSON object's text)."""
        ...


class NullTools:
    """Every call answered at once with NULL_OUTPUT, no session, no I/O."""

    name = "null"

    async def open(self, row: dict[str, Any]) -> dict[str, str]:
        return {}

    async def call(self, state: dict[str, str], name: str, arguments: str) -> ToolOutput:
        return ToolOutput(NULL_OUTPUT)


class ResourcesServerTools:
    """A NeMo Gym resources server at `url` (its root: tools are `{url}/{name}`)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
        self.name = url
        self._session = session
        self._root = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def open(self, row: dict[str, Any]) -> dict[str, str]:
        status, body, cookies = await self._post("seed_session", orjson.dumps(row), {})
        if status != 200:
            raise ToolCallError(f"{self._root}/seed_session answered HTTP {status}: {body[:200]}")
        return cookies

    async def call(self, state: dict[str, str], name: str, arguments: str) -> ToolOutput:
        try:
            orjson.loads(arguments)
        except orjson.JSONDecodeError as error:  # what NeMo Gym's agent tells the model
            text = orjson.dumps({"error": f"Invalid tool call arguments: {error!r}"}).decode()
            return ToolOutput(text)  # the model's mistake, not the environment's
        status, body, cookies = await self._post(name, arguments.encode(), state)
        state.update(cookies)
        return ToolOutput(body, f"HTTP {status}" if status >= 400 else None)

    async def _post(
        self, path: str, data: bytes, cookies: dict[str, str]
    ) -> tuple[int, str, dict[str, str]]:
        headers = _HEADERS
        if cookies:
            headers = {**_HEADERS, "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}
        url = f"{self._root}/{path}"
        try:
            async with self._session.post(
                url, data=data, headers=headers, timeout=self._timeout
            ) as resp:
                body = await resp.text(errors="replace")
                return resp.status, body, {k: m.value for k, m in resp.cookies.items()}
        except TimeoutError:
            raise ToolCallError(
                f"{url} gave no answer within {self._timeout.total:g} s (--tool-timeout)",
                "tool_timeout",
            ) from None
        except aiohttp.ClientError as error:
            raise ToolCallError(f"{url} could not be called ({error})") from None


async def load_tools(
    spec: str | None, session: aiohttp.ClientSession, timeout_s: float
) -> Tools | None:
    """The tools `--tools` names (None: none), checked to answer within 5 s."""
    if spec is None:
        return None
    if spec == "null":
        return NullTools()
    if not spec.lower().startswith(("http://", "https://")):
        raise UsageError(
            f"--tools {spec!r} is neither a resources server's URL (http://host:port) nor null."
        )
    url = spec.rstrip("/") + "/openapi.json"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=PREFLIGHT_TIMEOUT_S)):
            pass
    except (aiohttp.ClientError, TimeoutError) as error:
        reason = str(error) or "no answer within 5 s"
        raise ServerUnreachable(
            f"cannot reach the resources server at {spec} ({reason}); start it or fix --tools."
        ) from None
    return ResourcesServerTools(session, spec, timeout_s)
