"""Every process autotune starts ends with it, even when autotune is killed with SIGKILL.
How: docs/design/processes.md.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from multiprocessing.context import BaseContext

_PR_SET_PDEATHSIG = 1
FORKSERVER_PRELOAD = "autotune.processes._forkserver"


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when the thread that started it ends."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))


def forkserver_context() -> BaseContext:
    """multiprocessing's forkserver context, its server dying with autotune (see above).

    The pool must start the forkserver from a thread that lives as long as the pool
    (the event loop's: it submits the warm-up calls); it is restarted if it has died.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", FORKSERVER_PRELOAD])
    return context
