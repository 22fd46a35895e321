"""autotune's launch lines for SGLang and TensorRT-LLM, read by the engines' own parsers.

SGLang: the argparse parser `python -m sglang.launch_server` builds
(`ServerArgs.add_cli_args`, sglang 0.5.23), run in a subprocess by the venv that
scripts/setup_engine_parsers.sh makes and caches (under $AUTOTUNE_CACHE, default
~/.cache/autotune): every launch line is parsed in one run, and the fields it fills must
hold the values autotune was given. These tests are marked `engine_parsers`;
`AUTOTUNE_ENGINE_PARSERS=0` skips them on a developer's machine; under CI=true they run.

TensorRT-LLM cannot be installed without pypi.nvidia.com (its PyPI package is a stub that
downloads the real wheel from there), so its launch lines are read against trtllm-serve's
options as written down from its serve.py (tests/data/trtllm_serve_options.json, which
names the commits), by the small reader below that follows click's rules for them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from typing import Any

import pytest

from autotune.engines import ENGINES
from tests.helpers import REPO, stack_setup

PARSE_TIMEOUT_S = 300
SGLANG = ENGINES["sglang"]
TRTLLM = ENGINES["trtllm"]
MODEL = "/models/tiny-llama"
HOST, PORT = "127.0.0.1", 30123
OPTIONS_FILE = "/tmp/autotune-trtllm-options.yaml"
TRTLLM_OPTIONS = json.loads((REPO / "tests" / "data" / "trtllm_serve_options.json").read_text())

# A value for each knob with an SGLang flag, none of them the parser's default.
SGLANG_KNOBS: dict[str, object] = {
    "tensor_parallel_size": 2,
    "data_parallel_size": 2,
    "gpu_memory_utilization": 0.82,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 4096,
    "max_model_len": 2048,
}
# Settings a study's search space may add beside the knobs, in autotune's spelling.
SGLANG_EXTRAS: dict[str, object] = {
    "schedule_policy": "lpm",
    "schedule_conservativeness": 0.5,
    "enable_mixed_chunk": True,
}
TRTLLM_KNOBS: dict[str, object] = {
    "tensor_parallel_size": 2,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 4096,
    "max_model_len": 2048,
}

# The parser, for a JSON list of argvs on stdin: the fields each fills, or the error it
# gives (argparse's message, instead of its exit), as the last line of stdout.
PARSE = """
import argparse, importlib.util, json, sys
from sglang.srt.server_args import ServerArgs

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)

results = {"launch_server": importlib.util.find_spec("sglang.launch_server") is not None}
for name, argv in json.load(sys.stdin).items():
    parser = Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    try:
        results[name] = {"fields": vars(parser.parse_args(argv))}
    except ValueError as error:
        results[name] = {"error": str(error)}
print()
print(json.dumps(results, default=str))
"""


def sglang_line(knobs: Mapping[str, object]) -> list[str]:
    return SGLANG.launch_line(SGLANG.command, MODEL, knobs, port=PORT, host=HOST)


def dest(flag: str) -> str:
    """The ServerArgs field an SGLang flag fills (argparse's dest)."""
    return flag.removeprefix("--").replace("-", "_")


SWITCH_CASES = [(name, value) for name in SGLANG.switches for value in (True, False)]
SGLANG_LINES = {
    "knobs": sglang_line(SGLANG_KNOBS),
    "extras": sglang_line(SGLANG_EXTRAS),
    "false extra": sglang_line({"enable_mixed_chunk": False}),
    **{f"{name}={value}": sglang_line({name: value}) for name, value in SWITCH_CASES},
}


@pytest.fixture(scope="module")
def sglang_python() -> str:
    """The Python of the venv holding SGLang's parser (set up once, then cached)."""
    printed = stack_setup("setup_engine_parsers.sh", "AUTOTUNE_ENGINE_PARSERS", "engine-parser")
    return printed["ENGINE_PARSERS_PYTHON"]


@pytest.fixture(scope="module")
def sglang_parsed(sglang_python: str) -> dict[str, Any]:
    """Every line of SGLANG_LINES (the arguments after the command) through SGLang's
    parser, in one run: by case, `{"fields": ...}` or `{"error": ...}`."""
    command = len(SGLANG.command)
    argvs = {name: line[command:] for name, line in SGLANG_LINES.items()}
    run = subprocess.run(
        [sglang_python, "-W", "ignore", "-c", PARSE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=PARSE_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    parsed: dict[str, Any] = json.loads(run.stdout.splitlines()[-1])
    return parsed


def fields_of(parsed: Mapping[str, Any], case: str) -> dict[str, Any]:
    result = parsed[case]
    assert "error" not in result, f"SGLang refuses {SGLANG_LINES[case]}: {result['error']}"
    fields: dict[str, Any] = result["fields"]
    return fields


@pytest.mark.engine_parsers
def test_sglang_command_is_its_launch_module(sglang_parsed: dict[str, Any]) -> None:
    assert SGLANG.command == ("python", "-m", "sglang.launch_server")
    assert all(line[:3] == list(SGLANG.command) for line in SGLANG_LINES.values())
    assert sglang_parsed["launch_server"], "sglang has no sglang.launch_server module"


@pytest.mark.engine_parsers
def test_sglang_parses_every_knob_and_what_autotune_always_adds(
    sglang_parsed: dict[str, Any],
) -> None:
    assert set(SGLANG_KNOBS) == set(SGLANG.knob_flags), "give each SGLang knob a value here"
    fields = fields_of(sglang_parsed, "knobs")
    for knob, flag in SGLANG.knob_flags.items():
        assert fields[dest(flag)] == SGLANG_KNOBS[knob], (knob, flag)
    assert (fields["tp_size"], fields["dp_size"], fields["max_running_requests"]) == (2, 2, 64)
    assert fields["mem_fraction_static"] == 0.82
    assert (fields["chunked_prefill_size"], fields["context_length"]) == (4096, 2048)
    assert (fields["model_path"], fields["host"], fields["port"]) == (MODEL, HOST, PORT)
    assert SGLANG.always == ("--enable-metrics",)
    for flag in SGLANG.always:
        assert fields[dest(flag)] is True, flag
    assert fields["disable_radix_cache"] is False  # no switch given: the cache stays on


@pytest.mark.engine_parsers
@pytest.mark.parametrize(("name", "value"), SWITCH_CASES)
def test_sglang_parses_each_switch_both_ways(
    sglang_parsed: dict[str, Any], name: str, value: bool
) -> None:
    fields = fields_of(sglang_parsed, f"{name}={value}")
    on, off = SGLANG.switches[name]
    if on is not None:
        assert fields[dest(on)] is value, (name, on)
    if off is not None:
        assert fields[dest(off)] is (not value), (name, off)
    if name == "enable_prefix_caching":
        assert fields["disable_radix_cache"] is (not value)


@pytest.mark.engine_parsers
def test_sglang_parses_search_space_extras(sglang_parsed: dict[str, Any]) -> None:
    fields = fields_of(sglang_parsed, "extras")
    assert fields["schedule_policy"] == "lpm"
    assert fields["schedule_conservativeness"] == 0.5
    assert fields["enable_mixed_chunk"] is True


@pytest.mark.engine_parsers
def test_sglang_parses_an_extra_switched_off(sglang_parsed: dict[str, Any]) -> None:
    # SGLang's store_true flags have no --no- form: a switched-off extra is left out.
    line = SGLANG_LINES["false extra"]
    assert not any(arg.endswith("enable-mixed-chunk") for arg in line), line
    assert fields_of(sglang_parsed, "false extra")["enable_mixed_chunk"] is False


# TensorRT-LLM: trtllm-serve's options as written down from its source.


def trtllm_parse(
    argv: list[str], options: list[dict[str, Any]]
) -> tuple[list[str], dict[str, Any]]:
    """`argv` (after `trtllm-serve`) as click reads it against `options`: the positional
    arguments, and each option's value by its first name; ValueError for an option it
    does not know, a value it cannot take, or a flag given a value."""
    by_name = {name: option for option in options for name in option["names"]}
    positional: list[str] = []
    values: dict[str, Any] = {}
    tokens = iter(argv)
    for token in tokens:
        if not token.startswith("-"):
            positional.append(token)
            continue
        name, equals, given = token.partition("=")
        if name not in by_name:
            raise ValueError(f"no such option: {name}")
        option = by_name[name]
        takes = option["takes"]
        if takes == "flag":
            if equals:
                raise ValueError(f"{name} is a flag: it takes no value")
            values[option["names"][0]] = True
            continue
        value = given if equals else next(tokens, None)
        if value is None:
            raise ValueError(f"{name} needs a value")
        if isinstance(takes, list):
            if value not in takes:
                raise ValueError(f"{name} is one of {takes}, not {value!r}")
            values[option["names"][0]] = value
        else:
            values[option["names"][0]] = {"int": int, "float": float, "str": str}[takes](value)
    return positional, values


def dotted(tree: Mapping[str, Any], parent: str = "") -> set[str]:
    """The dotted keys of a nested options file."""
    keys: set[str] = set()
    for key, value in tree.items():
        path = f"{parent}{key}"
        keys |= dotted(value, path + ".") if isinstance(value, Mapping) else {path}
    return keys


@pytest.mark.parametrize(
    "version", TRTLLM_OPTIONS["versions"], ids=lambda version: version["commit"][:7]
)
def test_trtllm_options_read_every_knob(version: dict[str, Any]) -> None:
    options = version["options"]
    first = {name: option["names"][0] for option in options for name in option["names"]}
    assert set(TRTLLM_KNOBS) == set(TRTLLM.knob_flags), "give each TensorRT-LLM knob a value here"
    # The memory share it has instead of gpu_memory_utilization (missing_knobs says so).
    extra = {"kv_cache_free_gpu_memory_fraction": 0.85}
    knobs = {**TRTLLM_KNOBS, **extra, "enable_prefix_caching": False}
    line = TRTLLM.launch_line(
        TRTLLM.command, MODEL, knobs, port=PORT, host=HOST, options_file=OPTIONS_FILE
    )
    assert line[0] == "trtllm-serve" and TRTLLM.command == ("trtllm-serve",)
    positional, values = trtllm_parse(line[1:], options)
    assert positional == [MODEL]  # its one argument, and not the name of another command
    assert MODEL not in version.get("commands", ())
    for knob, flag in TRTLLM.knob_flags.items():
        assert values[first[flag]] == TRTLLM_KNOBS[knob], (knob, flag)
    assert values[first["--kv_cache_free_gpu_memory_fraction"]] == 0.85
    assert values[first["--backend"]] == "pytorch"
    assert TRTLLM.options_flag is not None
    assert values[first[TRTLLM.options_flag]] == OPTIONS_FILE
    assert (values["--host"], values["--port"]) == (HOST, PORT)
    assert "--enable_block_reuse" not in line  # an options-file knob, not a flag


def test_trtllm_options_file_holds_llm_api_options() -> None:
    known = set(TRTLLM_OPTIONS["llm_api_options"]["keys"])
    written = TRTLLM.options({"enable_prefix_caching": False, "max_num_seqs": 64})
    assert dotted(written) <= known, dotted(written) - known
    assert written["kv_cache_config"] == {"enable_block_reuse": False}
    assert written["return_perf_metrics"] is True and written["enable_iter_perf_stats"] is True


def test_trtllm_reader_refuses_what_click_would() -> None:
    options = TRTLLM_OPTIONS["versions"][0]["options"]
    for argv in (["m", "--tp-size", "2"], ["m", "--tp_size"], ["m", "--backend", "vllm"],
                 ["m", "--trust_remote_code=1"], ["m", "--tp_size", "two"]):  # fmt: skip
        with pytest.raises(ValueError):
            trtllm_parse(argv, options)
    assert trtllm_parse(["m", "--tp_size=2"], options) == (["m"], {"--tensor_parallel_size": 2})


def test_trtllm_options_name_their_source() -> None:
    for version in TRTLLM_OPTIONS["versions"]:
        assert version["repo"] == "NVIDIA/TensorRT-LLM"
        assert version["path"] == "tensorrt_llm/commands/serve.py"
        assert len(version["commit"]) == 40
