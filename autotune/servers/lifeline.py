"""Every process autotune starts ends with it, even when autotune is killed with SIGKILL.

On Linux a process can ask the kernel for a signal when its parent ends
(PR_SET_PDEATHSIG; elsewhere `die_with_parent` does nothing). A launched server asks
for SIGTERM before it execs (servers.launcher), so it still shuts down cleanly. The
verifier pool's workers are not autotune's children but its forkserver's, and the
forkserver lives as long as any worker while a worker waits forever on a call queue
whose writer died: so the forkserver imports `autotune.servers._forkserver` first
(`forkserver_context`), which makes it die with autotune and each worker die with it.
Python's resource tracker then exits by itself, its last client gone.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from multiprocessing.context import BaseContext

_PR_SET_PDEATHSIG = 1
FORKSERVER_PRELOAD = "autotune.servers._forkserver"


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
