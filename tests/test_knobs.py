"""A server knob is declared once (config/knobs.ServerKnobs): the search space, the
simulator's flags and the simulated engine read that declaration, and a configuration's
knobs reach the engine typed, spelled as flags only where a process starts."""

from __future__ import annotations

import pytest

from autotune.config.flags import field_name, flag_name, flag_values, server_flags
from autotune.config.knobs import KNOBS, SERVER_KNOBS, SearchSpace, ServerKnobs
from autotune.engine_model.state import engine_config
from autotune.hardware.deployment import SimArgs, SimConfig, SimConfigError, build_parser


def test_every_knob_is_a_search_space_field_and_a_simulator_flag_with_its_default() -> None:
    spaces = list(SearchSpace.model_fields)
    assert spaces[1 : 1 + len(SERVER_KNOBS)] == list(SERVER_KNOBS)  # after parallelism
    parser = build_parser()
    for name in SERVER_KNOBS:
        action = next(a for a in parser._actions if a.dest == name)
        assert flag_name(name) in action.option_strings
        assert action.default == getattr(KNOBS, name)


def test_a_knobs_space_follows_its_type() -> None:
    with pytest.raises(ValueError):  # a flag's space lists its values
        SearchSpace.model_validate({"enable_prefix_caching": {"low": 0, "high": 1}})
    with pytest.raises(ValueError):  # tensor parallelism must divide: values only
        SearchSpace.model_validate({"tensor_parallel_size": {"low": 1, "high": 8}})
    space = SearchSpace.model_validate({"max_model_len": {"low": 1024, "high": 4096}})
    assert space.server_knobs()["max_model_len"].high == 4096


def test_one_converter_between_field_names_and_flags() -> None:
    for name in SERVER_KNOBS:
        assert field_name(flag_name(name)) == name
    assert field_name("--max-model-len=2048") == "max_model_len"
    assert flag_values(["--gpu", "h200", "--max-model-len=2048", "--enable-prefix-caching"]) == {
        "gpu": "h200",
        "max_model_len": "2048",
    }
    assert server_flags({"max_model_len": 2048.0, "enable_prefix_caching": False}) == [
        "--max-model-len",
        "2048",
        "--no-enable-prefix-caching",
    ]


def test_typed_knobs_set_over_the_fixed_args_reach_the_engine() -> None:
    fixed = SimArgs.parse(["--model", "llama-3.1-8b", "--max-model-len", "4096"])
    config = SimConfig.of(fixed.with_knobs({"max_model_len": 2048, "max_num_seqs": 32.0}))
    assert config.max_model_len == 2048  # the knob over the fixed flag
    assert config.max_num_seqs == 32 and isinstance(config.max_num_seqs, int)
    assert engine_config(config).max_num_seqs == 32
    # The same as the process that parses its own command line would get.
    argv = ["--model", "llama-3.1-8b", "--max-model-len", "4096", *server_flags(
        {"max_model_len": 2048, "max_num_seqs": 32})]  # fmt: skip
    assert SimConfig.from_args(argv) == config


def test_a_knob_the_simulator_does_not_model_is_ignored_as_its_flag_would_be() -> None:
    config = SimConfig.of(SimArgs.parse([]).with_knobs({"kv_cache_dtype": "fp8"}))
    assert config.ignored_flags == ("--kv-cache-dtype", "fp8")
    assert config.ignored_flags == SimConfig.from_args(["--kv-cache-dtype", "fp8"]).ignored_flags


def test_a_refused_knob_is_the_simulators_sentence() -> None:
    with pytest.raises(SimConfigError, match="max_model_len"):
        SimConfig.of(SimArgs.parse([]).with_knobs({"max_model_len": 10**7}))
    assert ServerKnobs.model_fields["max_model_len"].default == KNOBS.max_model_len
