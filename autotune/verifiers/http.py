"""A NeMo Gym resources-server verifier: POST the row to `/verify`, read `reward` back.
Why: docs/design/verifiers.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from autotune.errors import UsageError, VerifierHTTPError

if TYPE_CHECKING:
    from autotune.verifiers import VerifierOptions

DEFAULT_CONNECTIONS = 64
_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
_ECHOED = frozenset({"responses_create_params", "response"})

__all__ = ["HttpVerifier", "VerifierHTTPError"]


class HttpVerifier:
    """POST each row to a verify URL; capacity = workers (default 64 connections)."""

    def __init__(
        self, url: str, options: VerifierOptions, session: aiohttp.ClientSession, owned: bool
    ) -> None:
        self.name = url
        self.capacity: int | None = options.workers or DEFAULT_CONNECTIONS
        self._url = url
        self._session = session
        self._owned = owned
        self._timeout = aiohttp.ClientTimeout(total=options.timeout_s)
        self._closed = False

    @classmethod
    async def open(
        cls, url: str, options: VerifierOptions, session: aiohttp.ClientSession | None
    ) -> HttpVerifier:
        """Check the URL's shape; without a `session`, open one this verifier owns."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise UsageError(
                f"verifier {url!r} is not a usable URL; write it as http://host:port/verify."
            )
        try:
            parts.port  # noqa: B018 - raises ValueError for a malformed port
        except ValueError:
            raise UsageError(
                f"verifier {url!r} has a malformed port; write it as http://host:port/verify."
            ) from None
        owned = session is None
        if session is None:
            limit = options.workers or DEFAULT_CONNECTIONS
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit))
        return cls(url, options, session, owned)

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        async with self._session.post(
            self._url, data=orjson.dumps(row), headers=_HEADERS, timeout=self._timeout
        ) as response:
            status = response.status
            body = await response.read()
        if not 200 <= status < 300:
            snippet = body[:200].decode("utf-8", "replace").strip()
            raise VerifierHTTPError(
                f"verifier {self._url} answered HTTP {status}" + (f": {snippet}" if snippet else "")
            )
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise VerifierHTTPError(
                f"verifier {self._url} answered HTTP {status} with a body that is not JSON"
            ) from None
        if not isinstance(answer, dict) or "reward" not in answer:
            raise VerifierHTTPError(
                f"verifier {self._url} answered HTTP {status} without a 'reward' field"
            )
        reward = answer["reward"]
        if reward is not None and not isinstance(reward, int | float):
            raise VerifierHTTPError(
                f"verifier {self._url} answered a 'reward' that is not a number: {reward!r}"
            )
        fields = {key: value for key, value in answer.items() if key not in _ECHOED}
        fields["reward"] = None if reward is None else float(reward)
        return fields

    async def aclose(self) -> None:
        """Close the session if this verifier opened it; the caller's stays open."""
        if self._closed:
            return
        self._closed = True
        if self._owned:
            await self._session.close()
