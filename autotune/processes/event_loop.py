"""Runs autotune's asyncio work in the main process: uvloop where it is installed, and
SIGTERM ends it as Ctrl-C does, so every `finally` on the way out runs."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine on uvloop where available (a faster loop for the client).

    SIGTERM ends it as Ctrl-C does: it cancels the coroutine, so every `finally` on the
    way out runs (the rollout file synced, verifier workers and launched servers
    stopped), and only then takes its course: the CLI's handler (exit status 143), else
    Python's default (the process ends). A second SIGTERM does not cut that short.
    """
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous in (
        signal.SIG_IGN,
        None,  # a handler installed outside Python: leave it alone
    ):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(coro)
    terminated = False

    async def cancelled_by_sigterm() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            nonlocal terminated
            if not terminated:
                terminated = True
                loop.call_soon_threadsafe(task.cancel)

        signal.signal(signal.SIGTERM, on_sigterm)
        return await coro

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(cancelled_by_sigterm())
    finally:
        signal.signal(signal.SIGTERM, previous)
        if terminated:
            signal.raise_signal(signal.SIGTERM)
