"""The simulator's command line in SGLang's or TensorRT-LLM's spelling: the flags each engine
takes beyond the knobs, and TensorRT-LLM's KV cache share and options file read as the
vLLM-style settings the simulator models. Why: docs/design/simulator.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.config.flags import field_name
from autotune.engines import Engine
from autotune.hardware.memory import weights_bytes_per_gpu
from autotune.hardware.profiles import GiB, GpuProfile, ModelProfile

# TensorRT-LLM sizes its KV cache as a share of the memory the weights leave free, by this
# flag or this key of its options file, which wins (tensorrt_llm/commands/serve.py).
KV_SHARE_FLAG = "--kv_cache_free_gpu_memory_fraction"
KV_SHARE_KEY = "kv_cache_config.free_gpu_memory_fraction"
DEFAULT_KV_SHARE = 0.9


class OptionsError(ValueError):
    """An options file the simulator cannot read; str() says why in one sentence."""


def add_dialect_flags(parser: argparse.ArgumentParser, engine: Engine) -> None:
    """The flags `engine` is launched with besides the knobs: those autotune always adds
    (accepted, not modelled), and TensorRT-LLM's KV share and options file."""
    accepted = f"accepted, as autotune launches {engine.title} with it (nothing to simulate)"
    for flag, value in _pairs(engine.always):
        if value is None:
            parser.add_argument(flag, action="store_true", help=accepted)
        else:
            parser.add_argument(flag, default=value, help=accepted)
    if engine.options_flag is None:
        return
    parser.add_argument(
        KV_SHARE_FLAG,
        type=float,
        default=DEFAULT_KV_SHARE,
        metavar="SHARE",
        help="share of the memory the weights leave free that holds the KV cache",
    )
    parser.add_argument(
        engine.options_flag,
        default=None,
        metavar="FILE",
        help=f"YAML of LLM API options: {KV_SHARE_KEY} (over {KV_SHARE_FLAG}) and "
        f"{', '.join(engine.option_knobs.values())} are read, other keys ignored",
    )


def _pairs(flags: tuple[str, ...]) -> Iterator[tuple[str, str | None]]:
    """(flag, its value or None for a switch) of a command line's flags."""
    for index, word in enumerate(flags):
        if word.startswith("--"):
            following = flags[index + 1] if index + 1 < len(flags) else "--"
            yield word, None if following.startswith("--") else following


@dataclass(frozen=True, slots=True)
class OptionsSettings:
    """What an engine's command line and options file set that the simulator models."""

    gpu_memory_utilization: float  # the vLLM-style share of the memory its KV share gives
    enable_prefix_caching: bool
    ignored: tuple[str, ...]  # the file's keys the simulator does not model, `FILE:dotted.key`


def options_settings(
    engine: Engine,
    values: Mapping[str, Any],
    gpu: GpuProfile,
    model: ModelProfile,
    tp: int,
) -> OptionsSettings:
    """The settings of an engine with an options file (TensorRT-LLM's) from its parsed
    flags `values`; raises OptionsError. A prefix-caching knob set over the flags wins over
    the file, as autotune writes it there."""
    assert engine.options_flag is not None
    path = values[field_name(engine.options_flag)]
    options = _read(path) if path is not None else {}
    known = {*engine.option_knobs.values(), *engine.always_options, KV_SHARE_KEY}
    share = options.get(KV_SHARE_KEY, values[field_name(KV_SHARE_FLAG)])
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise OptionsError(
            f"the KV cache's share of free memory must be within (0, 1], not {share!r}"
        )
    caching = values["enable_prefix_caching"]
    if caching is None:
        caching = options.get(engine.option_knobs["enable_prefix_caching"], True)
    if not isinstance(caching, bool):
        raise OptionsError(f"{engine.option_knobs['enable_prefix_caching']} must be true or false")
    return OptionsSettings(
        gpu_memory_utilization=utilization_of_kv_share(share, gpu, model, tp),
        enable_prefix_caching=caching,
        ignored=tuple(f"{path}:{key}" for key in options if key not in known),
    )


def utilization_of_kv_share(share: float, gpu: GpuProfile, model: ModelProfile, tp: int) -> float:
    """A KV share of the memory the weights leave free, as the share of the whole memory
    that weights and KV cache take together (vLLM's gpu_memory_utilization)."""
    memory, weights = gpu.memory_bytes, weights_bytes_per_gpu(model, tp)
    if weights >= memory:
        raise OptionsError(
            f"{model.name}'s weights need {weights / GiB:.1f} GiB per GPU, more than "
            f"{gpu.name}'s {memory / GiB:.0f} GiB: raise the tensor-parallel size"
        )
    return (weights + share * (memory - weights)) / memory


def _read(path: str) -> dict[str, Any]:
    """An options file's keys, nested ones dotted (`kv_cache_config.enable_block_reuse`)."""
    try:
        tree = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise OptionsError(f"{path} cannot be read ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise OptionsError(f"{path} is not YAML ({error})") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise OptionsError(f"{path} must hold a mapping of LLM API options")
    return dict(_flatten(tree))


def _flatten(tree: Mapping[str, Any], above: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        dotted = f"{above}{key}"
        if isinstance(value, dict) and value:
            yield from _flatten(value, dotted + ".")
        else:
            yield dotted, value
