"""Imported first by the verifier pool's forkserver (see lifeline): it dies with autotune,
every process it forks (a pool worker) dies with it, and it ignores SIGINT.
Why: docs/design/processes.md.
"""

from __future__ import annotations

import os
import signal

from autotune.processes.lifeline import die_with_parent

_forking = 0  # the pid of the process forking, noted before each fork


def _note_forking() -> None:
    global _forking
    _forking = os.getpid()


def _die_with_forking_parent() -> None:
    die_with_parent()
    if os.getppid() != _forking:  # the parent ended before the line above
        os._exit(1)


signal.signal(signal.SIGINT, signal.SIG_IGN)
die_with_parent()
os.register_at_fork(before=_note_forking, after_in_child=_die_with_forking_parent)
