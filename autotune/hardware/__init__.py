"""The GPUs and the models: what the simulator simulates on and what the sweep checks a
configuration against before launching it, kept apart from both so neither imports the
other. No I/O but NVML's memory reading and a local model's config.json.
Why: docs/design/hardware.md.
"""

from __future__ import annotations

from autotune.hardware.deployment import SimConfig, SimConfigError, build_parser
from autotune.hardware.fit import (
    GpuMemory,
    Split,
    gpu_bytes,
    model_profile,
    tp_problem,
    vllm_fit,
    weights_fit,
)
from autotune.hardware.memory import (
    InsufficientMemory,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    weights_bytes_per_gpu,
)
from autotune.hardware.profiles import GPUS, MODELS, GiB, GpuProfile, ModelProfile, find_model
from autotune.hardware.roofline import Roofline, roofline

__all__ = [
    "GPUS",
    "MODELS",
    "GiB",
    "GpuMemory",
    "GpuProfile",
    "InsufficientMemory",
    "ModelProfile",
    "Roofline",
    "SimConfig",
    "SimConfigError",
    "Split",
    "build_parser",
    "find_model",
    "gpu_bytes",
    "kv_bytes_per_token_per_gpu",
    "kv_capacity_tokens",
    "model_profile",
    "roofline",
    "tp_problem",
    "vllm_fit",
    "weights_bytes_per_gpu",
    "weights_fit",
]
