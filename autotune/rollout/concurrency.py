"""Adaptive concurrency: an AIMD limit on the model calls in flight, halved when the server
refuses a call and grown back on successes.
Why: docs/design/rollout.md.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque

DECREASE = 0.5  # multiplicative decrease: TCP's and concurrency-limits' AIMD default
MIN_ROUND_TRIP_S = 1.0
RTT_WEIGHT = 0.125  # TCP's smoothed round-trip time (RFC 6298)


class AdaptiveConcurrency:
    """How many model calls may be in flight: between 1 and `max_limit`, AIMD."""

    def __init__(self, max_limit: int, decrease: float = DECREASE) -> None:
        if max_limit < 1:
            raise ValueError(f"the concurrency limit must be at least 1, not {max_limit}")
        if not 0 < decrease < 1:
            raise ValueError(f"the decrease factor must be between 0 and 1, not {decrease}")
        self.max_limit = max_limit
        self.limit = max_limit
        self.lowest = max_limit
        self.decreases = 0
        self.in_flight = 0
        self._decrease = decrease
        self._successes = 0
        self._rtt_s = 0.0
        self._last_change = -math.inf  # time.monotonic() of the last step up or down
        self._last_decrease = -math.inf
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        """Wait for a slot, first come first served."""
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot as it was cancelled: pass it on
            raise

    def release(self) -> None:
        """Give a slot back."""
        self.in_flight -= 1
        if self._waiters:
            self._wake()

    async def requeue(self) -> None:
        """A retry about to re-send: above the limit, its slot goes and it queues anew."""
        if self.in_flight > self.limit:
            self.in_flight -= 1  # still at or above the limit: nobody to wake
            await self.acquire()

    def succeeded(self, rtt_s: float, now: float | None = None) -> None:
        """A call was answered: +1 per limit-many successes, at most once a round trip."""
        self._rtt_s += RTT_WEIGHT * (rtt_s - self._rtt_s) if self._rtt_s else rtt_s
        if self.limit >= self.max_limit:
            return
        self._successes += 1
        if self._successes >= self.limit:
            now = time.monotonic() if now is None else now
            if now - self._last_change >= self.round_trip_s:
                self._successes = 0
                self._last_change = now
                self.limit += 1
                if self._waiters:
                    self._wake()

    def overloaded(self, now: float | None = None) -> None:
        """The server refused a call: ×`decrease` (never below 1), at most once a round trip."""
        now = time.monotonic() if now is None else now
        if now - self._last_decrease < self.round_trip_s:
            return
        self._last_change = self._last_decrease = now
        self._successes = 0
        self.limit = max(1, int(self.limit * self._decrease))
        self.lowest = min(self.lowest, self.limit)
        self.decreases += 1

    @property
    def round_trip_s(self) -> float:
        """The smoothed time a successful call takes, but at least MIN_ROUND_TRIP_S."""
        return max(self._rtt_s, MIN_ROUND_TRIP_S)

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self.in_flight < self.limit:
            waiter = waiters.popleft()
            if not waiter.done():  # else cancelled while it waited
                self.in_flight += 1
                waiter.set_result(None)
