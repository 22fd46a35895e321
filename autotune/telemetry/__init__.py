"""What is sampled while a probe runs: the client's health, the server's /metrics, the GPUs.
A source that cannot be read is skipped with a reason; telemetry never fails a probe.
Why: docs/design/telemetry.md.
"""

from autotune.telemetry.client import ClientSampler
from autotune.telemetry.gpu import GpuSampler, gpu_count, gpu_inventory
from autotune.telemetry.prometheus import PrometheusSampler, parse_prometheus
from autotune.telemetry.recorder import Sample, Sampler, TelemetryRecorder
from autotune.telemetry.summary import summarise

__all__ = [
    "ClientSampler",
    "GpuSampler",
    "PrometheusSampler",
    "Sample",
    "Sampler",
    "TelemetryRecorder",
    "gpu_count",
    "gpu_inventory",
    "parse_prometheus",
    "summarise",
]
