"""GPU utilisation, memory and power from NVML, when there is a GPU.
Why: docs/design/telemetry.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

_GIB = float(1 << 30)


def _init_nvml() -> tuple[ModuleType | None, str | None]:
    """(pynvml, None) with NVML initialised, or (None, why not) — never raises."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"no GPU telemetry: the nvidia-ml-py package is not installed ({exc})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"no GPU telemetry: NVML is not available ({exc})"
    return pynvml, None


def _text(value: str | bytes) -> str:
    """Older NVML bindings return bytes."""
    return value.decode() if isinstance(value, bytes) else value


def _read(nvml: ModuleType, call: Callable[[Any], Any], handle: Any) -> Any:
    """One NVML reading, or None where the device cannot give it (or fell off the bus)."""
    try:
        return call(handle)
    except nvml.NVMLError:
        return None


def gpu_count() -> int:
    """How many GPUs NVML sees; 0 without NVML."""
    nvml, _ = _init_nvml()
    if nvml is None:
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError:
        return 0
    finally:
        nvml.nvmlShutdown()


def gpu_inventory() -> list[dict[str, Any]]:
    """Each GPU's index, name, memory_total_gib and driver_version, for result records."""
    nvml, _ = _init_nvml()
    if nvml is None:
        return []
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        inventory = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            inventory.append(
                {
                    "index": index,
                    "name": _text(nvml.nvmlDeviceGetName(handle)),
                    "memory_total_gib": nvml.nvmlDeviceGetMemoryInfo(handle).total / _GIB,
                    "driver_version": driver,
                }
            )
        return inventory
    except nvml.NVMLError:
        return []
    finally:
        nvml.nvmlShutdown()


class GpuSampler:
    """Per-GPU `gpu{i}_util_pct`, `gpu{i}_util_samples`, `gpu{i}_mem_used_gib`,
    `gpu{i}_power_w`, plus `gpu_util_pct_mean`, `gpu_mem_used_gib_total` and
    `gpu_power_w_total`.

    Utilisation is the mean of every sample the driver took since the previous reading
    (`gpu{i}_util_samples` of them), so a window's readings cover all of it, not one
    instant each; where the driver keeps no samples, the current rate (one sample). A
    reading a device does not support (power on some boards, utilisation on MIG slices)
    is left out rather than faked as zero.
    """

    name = "gpu"

    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = None
        self._handles: list[Any] = []
        self._seen: list[int] = []  # each GPU's newest driver sample read, NVML's clock
        self._nvml, self.reason = _init_nvml()
        if self._nvml is None:
            return
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._nvml.NVMLError as exc:
            self.reason = f"no GPU telemetry: NVML cannot list the GPUs ({exc})"
        if not self._handles:
            self.reason = self.reason or "no GPU telemetry: NVML sees no GPU"
            self._shutdown()
            return
        self._seen = [0] * len(self._handles)
        for i in range(len(self._handles)):  # the driver's history before now is no window's
            self._driver_samples(i)
        self.available = True

    async def sample(self) -> dict[str, float] | None:
        nvml = self._nvml
        if nvml is None:
            return None
        values: dict[str, float] = {}
        utils: list[float] = []
        mems: list[float] = []
        powers: list[float] = []
        for i, handle in enumerate(self._handles):
            if (util := self._utilisation(i)) is not None:
                values[f"gpu{i}_util_pct"] = util[0]
                values[f"gpu{i}_util_samples"] = float(util[1])
                utils.append(util[0])
            if (memory := _read(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)) is not None:
                values[f"gpu{i}_mem_used_gib"] = memory.used / _GIB
                mems.append(memory.used / _GIB)
            if (milliwatts := _read(nvml, nvml.nvmlDeviceGetPowerUsage, handle)) is not None:
                values[f"gpu{i}_power_w"] = milliwatts / 1000
                powers.append(milliwatts / 1000)
        if utils:
            values["gpu_util_pct_mean"] = sum(utils) / len(utils)
        if mems:
            values["gpu_mem_used_gib_total"] = sum(mems)
        if powers:
            values["gpu_power_w_total"] = sum(powers)
        return values or None

    def _utilisation(self, i: int) -> tuple[float, int] | None:
        """GPU i's mean utilisation since the previous reading, and from how many of the
        driver's samples; None where it reports none."""
        nvml, handle = self._nvml, self._handles[i]
        assert nvml is not None
        if samples := self._driver_samples(i):
            return sum(samples) / len(samples), len(samples)
        rates = _read(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
        return None if rates is None else (float(rates.gpu), 1)

    def _driver_samples(self, i: int) -> list[int]:
        """The utilisation samples (%) the driver took on GPU i since the newest one read;
        none where it keeps none or has none newer (NVML says NotFound)."""
        nvml = self._nvml
        assert nvml is not None
        try:
            _, samples = nvml.nvmlDeviceGetSamples(
                self._handles[i], nvml.NVML_GPU_UTILIZATION_SAMPLES, self._seen[i]
            )
        except nvml.NVMLError:
            return []
        fresh = [s for s in samples if s.timeStamp > self._seen[i]]
        if fresh:
            self._seen[i] = max(s.timeStamp for s in fresh)
        return [s.sampleValue.uiVal for s in fresh]

    async def aclose(self) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            with contextlib.suppress(nvml.NVMLError):  # NVML counts inits: nothing leaks
                nvml.nvmlShutdown()
