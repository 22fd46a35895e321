"""A calibrated simulator profile: the step model's coefficients fitted to measured runs
(`autotune sim calibrate`), with the simulator's error at each measured point.
The file's format: docs/design/hardware.md.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from autotune.files import write_whole
from autotune.hardware.profiles import (
    GPUS,
    GpuProfile,
    ModelProfile,
    StepCoefficients,
    find_model,
)

FORMAT = "autotune-sim-profile/1"


class ProfileError(ValueError):
    """A profile file that cannot be used; str() is one sentence."""


@dataclass(frozen=True, slots=True)
class PointError:
    """One measured point beside what the calibrated simulator gives there."""

    tp: int
    concurrency: int
    measured_tokens_per_s_per_gpu: float
    simulated_tokens_per_s_per_gpu: float
    measured_tpot_s: float
    simulated_tpot_s: float

    @property
    def throughput_error(self) -> float:
        return self.simulated_tokens_per_s_per_gpu / self.measured_tokens_per_s_per_gpu - 1

    @property
    def tpot_error(self) -> float:
        return self.simulated_tpot_s / self.measured_tpot_s - 1


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """Median and worst absolute relative error over a profile's points."""

    points: int
    throughput_median: float
    throughput_worst: float
    tpot_median: float
    tpot_worst: float

    @classmethod
    def of(cls, points: Sequence[PointError]) -> ErrorSummary:
        throughput = [abs(p.throughput_error) for p in points]
        tpot = [abs(p.tpot_error) for p in points]
        return cls(
            len(points),
            statistics.median(throughput),
            max(throughput),
            statistics.median(tpot),
            max(tpot),
        )


@dataclass(frozen=True, slots=True)
class CalibratedProfile:
    """The GPU and model profiles, the fitted coefficients and where they came from."""

    gpu: GpuProfile
    model: ModelProfile
    coefficients: StepCoefficients
    table: str  # the table's file name
    key: dict[str, str]  # the configuration of the table it was fitted to (every TP)
    points: tuple[PointError, ...] = ()

    def summary(self) -> ErrorSummary:
        return ErrorSummary.of(self.points)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "gpu": self.gpu.name,
            "model": self.model.name,
            "coefficients": dataclasses.asdict(self.coefficients),
            "calibrated_on": {"table": self.table, "key": self.key},
            "points": [dataclasses.asdict(point) for point in self.points],
        }

    def save(self, path: Path) -> None:
        write_whole(path, orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2))


def load_profile(path: Path) -> CalibratedProfile:
    """The profile in `path`; a file that is missing, not one, or names an unknown GPU or
    model is one ProfileError sentence."""
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as error:
        raise ProfileError(f"cannot read --profile {path} ({error.strerror})") from None
    except orjson.JSONDecodeError as error:
        raise ProfileError(f"--profile {path} is not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(
            f'--profile {path} is not a simulator profile (no "format": "{FORMAT}"); '
            "make one with `autotune sim calibrate`"
        )
    gpu = GPUS.get(str(data.get("gpu")))
    model = find_model(str(data.get("model")))
    if gpu is None or model is None:
        raise ProfileError(
            f"--profile {path} names GPU {data.get('gpu')!r} and model {data.get('model')!r}; "
            f"this autotune knows GPUs {', '.join(GPUS)}"
        )
    try:
        coefficients = StepCoefficients(**data["coefficients"])
        points = tuple(PointError(**point) for point in data.get("points", []))
        calibrated_on = data["calibrated_on"]
        table, key = str(calibrated_on["table"]), dict(calibrated_on["key"])
    except (KeyError, TypeError) as error:
        raise ProfileError(f"--profile {path} is incomplete or damaged ({error!r})") from None
    if not all(value > 0 for value in dataclasses.astuple(coefficients)):
        raise ProfileError(f"--profile {path} has a coefficient that is not above 0")
    return CalibratedProfile(gpu, model, coefficients, table, key, points)
