"""The one converter between a server knob's field name and its flag, vLLM's spelling
(`max_model_len` ↔ `--max-model-len`): knobs become argv only where a process starts or a
command line is written for a person; a study's fixed args are read back by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autotune.engines.description import flag_value

RESERVED_FLAGS = ("--model", "--port", "--host")  # set by the launcher itself


def field_name(flag: str) -> str:
    """`--max-model-len=8`, `max-model-len` or `max_model_len` → `max_model_len`."""
    return flag.partition("=")[0].lstrip("-").replace("-", "_")


def flag_name(knob: str) -> str:
    """`max_num_seqs` (or `--max-num-seqs`) → `--max-num-seqs`."""
    return "--" + knob.lstrip("-").replace("_", "-")


def server_flags(knobs: Mapping[str, object]) -> list[str]:
    """`{"max_num_seqs": 64}` → `--max-num-seqs 64`; True → `--enable-prefix-caching`;
    False → `--no-enable-prefix-caching`; None leaves the flag out."""
    flags: list[str] = []
    for name, value in knobs.items():
        flag = flag_name(name)
        if flag in RESERVED_FLAGS:
            raise ValueError(f"{flag} is set by autotune; leave it out of the server flags")
        if value is None:
            continue
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + flag[2:])
        else:
            flags += [flag, flag_value(value)]
    return flags


def flag_values(args: Sequence[str]) -> dict[str, str]:
    """`--max-model-len 2048` and `--block-size=32` in fixed args, by field name."""
    values: dict[str, str] = {}
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, equals, value = arg[2:].partition("=")
        if not equals and index + 1 < len(args) and not args[index + 1].startswith("--"):
            value = args[index + 1]
        if value:
            values[field_name(name)] = value
    return values
