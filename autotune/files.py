"""Writing a file whole: a reader, or a kill midway, sees the old file or the new one,
never part of either."""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it and one rename; the
    temporary file is removed if the write fails."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
