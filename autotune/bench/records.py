"""Saved benchmark results: frozen, versioned, plain JSON; a baseline is one of them, and
changes only on purpose. Why: docs/design/bench.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from autotune.bench.fingerprint import Fingerprint
from autotune.errors import UsageError
from autotune.files import write_whole
from autotune.results.codec import to_json

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Metric:
    """One figure of a case, one value a measured repetition (higher is better)."""

    unit: str
    samples: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What one case measured, or why it could not run (`error`, then no metric)."""

    name: str
    kind: str  # probe | overhead
    threshold: float  # the fall in median that counts as a regression, e.g. 0.05
    settings: dict[str, Any]  # the configuration under test, recorded
    fingerprint: Fingerprint | None
    metrics: dict[str, Metric]
    details: tuple[dict[str, Any], ...]  # per measured repetition, for a reader
    warmup: int
    wall_s: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BenchResults:
    """One `autotune bench run` (or a baseline made from one)."""

    suite: str
    created_at: float
    alpha: float  # significance level the suite asks for
    machine: dict[str, Any]
    cases: tuple[CaseResult, ...]
    baseline: dict[str, Any] | None = None  # {reason, written_at, source} once a baseline
    kind: str = "bench"
    schema_version: int = SCHEMA_VERSION

    def case(self, name: str) -> CaseResult | None:
        return next((c for c in self.cases if c.name == name), None)

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if c.error is not None]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResults:
        cases = tuple(
            CaseResult(
                name=str(c["name"]),
                kind=str(c["kind"]),
                threshold=float(c["threshold"]),
                settings=dict(c["settings"]),
                fingerprint=Fingerprint.from_dict(c["fingerprint"]) if c["fingerprint"] else None,
                metrics={
                    name: Metric(str(m["unit"]), tuple(_sample(v) for v in m["samples"]))
                    for name, m in c["metrics"].items()
                },
                details=tuple(c["details"]),
                warmup=int(c["warmup"]),
                wall_s=float(c["wall_s"]),
                error=c.get("error"),
            )
            for c in data["cases"]
        )
        return cls(
            suite=str(data["suite"]),
            created_at=float(data["created_at"]),
            alpha=float(data["alpha"]),
            machine=dict(data["machine"]),
            cases=cases,
            baseline=data.get("baseline"),
        )


def _sample(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"a sample must be a positive number, not {value!r}")
    return number


def load(path: Path) -> BenchResults:
    """A saved results (or baseline) file; UsageError, one sentence, for anything else."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist; pass a file `bench run` wrote.") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder; pass the results JSON file.") from None
    except orjson.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(data, dict) or data.get("kind") != "bench":
        raise UsageError(f"{path} is not an autotune bench results file.")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(
            f"{path} has results format {data.get('schema_version')}, this autotune reads "
            f"format {SCHEMA_VERSION}; run the suite again with this version."
        )
    try:
        return BenchResults.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UsageError(f"{path} is not a complete bench results file ({error}).") from None


def save(results: BenchResults, path: Path) -> Path:
    """Write atomically; never over a baseline (that takes `update-baseline`)."""
    refuse_baseline(path)
    return _write(results, path)


def refuse_baseline(path: Path) -> None:
    """UsageError if `path` holds a baseline: checked before a run, and again at saving."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return
    if isinstance(data, dict) and data.get("baseline") is not None:
        raise UsageError(
            f"{path} is a baseline; write results elsewhere, and replace a baseline only "
            "with `autotune bench update-baseline`."
        )


def _write(results: BenchResults, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, to_json(results.to_dict()) + b"\n")
    return path


def write_baseline(source: Path, baseline: Path, reason: str) -> BenchResults:
    """Make the results in `source` the baseline at `baseline`, on purpose; returns it.

    Refused for results where a case could not run: a baseline must have every case.
    """
    results = load(source)
    if not results.cases:
        raise UsageError(f"{source} holds no case; run a suite with at least one case.")
    if results.failed:
        names = ", ".join(c.name for c in results.failed)
        raise UsageError(
            f"{source} has cases that could not run ({names}); a baseline needs every case, "
            "so fix them and run the suite again."
        )
    record = {"reason": reason, "written_at": time.time(), "source": str(source)}
    commit = _head_commit()
    if commit is not None:  # what `bench ab --baseline-ref-from` measures again
        record["commit"] = commit
    stamped = replace(results, baseline=record)
    _write(stamped, baseline)
    return stamped


def _head_commit() -> str | None:
    """The commit checked out here (the code that measured the results), if in git."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None
