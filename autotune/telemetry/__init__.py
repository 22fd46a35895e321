"""What is sampled while a probe runs: the client's health, the server's /metrics, the GPUs.

    async with TelemetryRecorder([ClientSampler(), PrometheusSampler(session, url),
                                  GpuSampler()]) as recorder:
        ...  # run the probe
    stats = summarise(recorder.samples, start, end)  # {"server/vllm:...": {"mean", ...}}

A source that cannot be read (no GPU, no /metrics) is skipped with a one-sentence reason
in `recorder.unavailable`; telemetry never fails a probe.
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
