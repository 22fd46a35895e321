"""Reading any saved result back: the kinds a results folder can hold and `load_result`."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UsageError
from autotune.results.codec import SCHEMA_VERSION, ResultFormatError, read_json
from autotune.results.diagnosis import DiagnoseResult
from autotune.results.doctor import DoctorResult
from autotune.results.runs import CollectResult, LoopResult
from autotune.results.trials import SweepResult

Saved = DiagnoseResult | SweepResult | CollectResult | LoopResult | DoctorResult


SAVED_KINDS: dict[str, type[Saved]] = {
    "diagnose": DiagnoseResult,
    "sweep": SweepResult,
    "collect": CollectResult,
    "loop": LoopResult,
    "doctor": DoctorResult,
}


SAVED_FILES = {kind: f"{kind}.json" for kind in SAVED_KINDS}


def load_result(path: Path) -> Saved:
    """A saved diagnose, sweep, collect, loop or doctor result (the JSON file, or the
    directory holding it)."""
    files = ", ".join(SAVED_FILES.values())
    if path.is_dir():
        found = [path / name for name in SAVED_FILES.values() if (path / name).exists()]
        if not found:
            raise UsageError(f"{path} holds none of {files}; pass a report directory.")
        path = found[0]
    data = read_json(path)
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in SAVED_KINDS:
        raise ResultFormatError(
            f"{path} is not a saved autotune result (no diagnose, sweep, collect, loop or "
            f"doctor kind); pass the {files.replace(', doctor', ' or doctor')} a job wrote."
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultFormatError(
            f"{path} was saved with result schema version {version}, and this autotune reads "
            f"version {SCHEMA_VERSION}; rerun the job to save it anew, or read it with the "
            "autotune version that wrote it."
        )
    try:
        return SAVED_KINDS[kind].from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ResultFormatError(
            f"{path} is not a complete {kind} result ({type(error).__name__}: {error}); "
            "rerun the job to save it anew."
        ) from None
