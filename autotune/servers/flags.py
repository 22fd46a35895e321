"""One spelling of server knobs as command-line flags, vLLM's.

Used to launch a server (vLLM, the simulator) and to write the recommended `vllm serve`
line, so the command that was measured and the one recommended can never differ.
"""

from __future__ import annotations

from collections.abc import Mapping

RESERVED_FLAGS = ("--model", "--port", "--host")  # set by the launcher itself


def flag_name(knob: str) -> str:
    """`max_num_seqs` (or `--max-num-seqs`) → `--max-num-seqs`."""
    return "--" + knob.lstrip("-").replace("_", "-")


def flag_value(value: object) -> str:
    """A whole float is written as an integer (`64.0` → `64`) for integer flags."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


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
