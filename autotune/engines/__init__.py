"""The engines autotune launches, reads and pauses (vLLM, SGLang, TensorRT-LLM), each a
description: its launch line and knob spellings, metric names, request dialect and RL
endpoints. Why: docs/engines.md.
"""

from autotune.engines.description import Call, Control, Dialect, Engine, Metrics
from autotune.engines.known import ENGINE_NAMES, ENGINES, engine_named

__all__ = [
    "ENGINES", "ENGINE_NAMES", "Call", "Control", "Dialect", "Engine", "Metrics", "engine_named",
]  # fmt: skip
