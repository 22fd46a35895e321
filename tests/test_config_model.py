"""The one configuration model: a flag, a study field and a bench-suite field that mean the
same thing have one default and one error sentence, all read from autotune.config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from autotune.bench.suite import ProbeCaseSpec, load_suite
from autotune.cli import build_parser
from autotune.config.collection import (
    ProbeSpec,
    RequestFields,
    ServerFields,
    SyntheticSpec,
    VerifierFields,
    WorkloadSpec,
)
from autotune.config.fields import SpecModel, option, unwrap
from autotune.config.knobs import KNOBS, SERVER_KNOBS, SearchSpace
from autotune.config.rl_specs import BatchSpec, LoopSpec
from autotune.config.study import Study, load_study
from autotune.errors import UsageError
from autotune.hardware.deployment import build_parser as build_sim_parser

# Every spec field that declares a flag: the command that has it, and where a study file
# and a bench suite's probe case spell it (None: that file has no such field).
SHARED: dict[tuple[type[SpecModel], str], tuple[str, str | None, str | None]] = {
    (SyntheticSpec, "num_tasks"): ("collect", "workload.synthetic.num_tasks", "workload.synthetic"),
    (SyntheticSpec, "prompt_tokens"): (
        "collect",
        "workload.synthetic.prompt_tokens",
        "workload.prompt_tokens",
    ),
    (SyntheticSpec, "output_tokens"): (
        "collect",
        "workload.synthetic.output_tokens",
        "workload.output_tokens",
    ),
    (SyntheticSpec, "seed"): ("collect", "workload.synthetic.seed", "workload.seed"),
    (WorkloadSpec, "input"): ("collect", "workload.input", "workload.input"),
    (WorkloadSpec, "limit"): ("collect", "workload.limit", "workload.limit"),
    (WorkloadSpec, "num_repeats"): ("collect", "workload.num_repeats", None),
    (VerifierFields, "verifier"): ("collect", "workload.verifier", "verifier"),
    (VerifierFields, "verifier_workers"): (
        "collect",
        "workload.verifier_workers",
        "verifier_workers",
    ),
    (VerifierFields, "verifier_cost_ms"): (
        "collect",
        "workload.verifier_cost_ms",
        "verifier_cost_ms",
    ),
    (RequestFields, "api"): ("collect", "workload.api", "target.api"),
    (RequestFields, "stream"): ("collect", "workload.stream", "target.stream"),
    (RequestFields, "timeout_s"): ("collect", "workload.timeout_s", "target.timeout_s"),
    (RequestFields, "max_retries"): ("collect", "workload.max_retries", "target.max_retries"),
    (ServerFields, "model"): ("collect", "target.model", "target.model"),
    (ServerFields, "api_key_env"): ("collect", "target.api_key_env", "target.api_key_env"),
    (ProbeSpec, "min_s"): ("diagnose", "probe.min_s", "probe.min_s"),
    (ProbeSpec, "max_s"): ("diagnose", "probe.max_s", "probe.max_s"),
    **{
        (BatchSpec, name): ("collect", f"workload.batch.{name}", None)
        for name in BatchSpec.model_fields
    },
    **{(LoopSpec, name): ("loop", f"workload.loop.{name}", None) for name in LoopSpec.model_fields},
}


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


def _flag_default(command: str, flags: tuple[str, ...]) -> Any:
    action = next(a for a in _subparser(command)._actions if flags[0] in a.option_strings)
    return True if action.const is False else action.default  # a --no-X switch: on


def _file_default(model: type[SpecModel], dotted: str) -> Any:
    """The default a file's field at `dotted` takes when the file leaves it out."""
    *above, name = dotted.split(".")
    node: Any = model
    for part in above:
        node = unwrap(node.model_fields[part].annotation)
    return node.model_fields[name].get_default(call_default_factory=True)


def _declared_fields() -> set[tuple[type[SpecModel], str]]:
    specs = (
        SyntheticSpec,
        WorkloadSpec,
        VerifierFields,
        RequestFields,
        ServerFields,
        ProbeSpec,
        BatchSpec,
        LoopSpec,
    )
    declared = set()
    for spec in specs:
        for name, field in spec.model_fields.items():
            if option(field) is not None:
                owner = next(
                    base
                    for base in reversed(spec.__mro__)
                    if isinstance(base, type)
                    and issubclass(base, SpecModel)
                    and name in getattr(base, "__annotations__", {})
                )
                declared.add((owner, name))
    return declared


def test_every_field_with_a_flag_is_in_the_table() -> None:
    assert _declared_fields() == set(SHARED)


@pytest.mark.parametrize(("spec", "name"), list(SHARED), ids=lambda v: getattr(v, "__name__", v))
def test_flag_study_and_suite_defaults_are_the_models(spec: type[SpecModel], name: str) -> None:
    command, study_path, suite_path = SHARED[(spec, name)]
    field = spec.model_fields[name]
    declared = option(field)
    assert declared is not None
    expected = field.default
    assert _flag_default(command, declared.flags) == expected
    if study_path is not None:
        assert _file_default(Study, study_path) == expected
    if suite_path is not None:
        assert _file_default(ProbeCaseSpec, suite_path) == expected


def _flag_error(capsys: pytest.CaptureFixture[str], command: str, *words: str) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, *words])
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "study", "suite", "expected"),
    [
        ("--synthetic", "0", "workload: {synthetic: {num_tasks: 0}}",
         "workload: {synthetic: 0}", "must be a whole number of at least 1"),
        ("--max-retries", "-1", "workload: {max_retries: -1}",
         "target: {max_retries: -1}", "must be a whole number of at least 0"),
        ("--verifier-cost-ms", "-2", "workload: {verifier_cost_ms: -2.0}",
         "verifier_cost_ms: -2.0", "must be a number of at least 0"),
        ("--output-tokens", "1,2,3", "workload: {synthetic: {output_tokens: [1, 2, 3]}}",
         "workload: {output_tokens: [1, 2, 3]}", "must be a token count or [mean, std]"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_sentence_in_a_flag_a_study_and_a_suite(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    flag: str,
    value: str,
    study: str,
    suite: str,
    expected: str,
) -> None:
    assert f"argument {flag}: {expected}, not {value!r}" in _flag_error(
        capsys, "collect", flag, value
    )
    study_file = tmp_path / "s.yaml"
    study_file.write_text(f"name: s\ntarget: {{kind: sim}}\n{study}\n")
    with pytest.raises(UsageError, match=rf": {_escaped(expected)}, not "):
        load_study(study_file)
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(f"cases: [{{name: a, parallelism: 4, {suite}}}]\n")
    with pytest.raises(UsageError, match=rf" {_escaped(expected)}, not "):
        load_suite(suite_file)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


# -- server knobs: the simulator's flag, a study's search space and a suite's server_args --


@pytest.mark.parametrize("name", SERVER_KNOBS)
def test_every_server_knob_has_one_default_a_space_and_a_checked_value(
    name: str, tmp_path: Path
) -> None:
    default = getattr(KNOBS, name)
    flag = next(a for a in build_sim_parser()._actions if a.dest == name)
    assert flag.default == default  # the simulator starts with the table's default
    assert name in SearchSpace.model_fields  # a study can search it
    study = Study.model_validate(
        {"name": "s", "target": {"kind": "sim"}, "search_space": {name: {"choices": [default]}}}
    )
    assert name in study.search_space.server_knobs()
    suite_file = tmp_path / "suite.yaml"
    bad = "-1" if not isinstance(default, bool) else "'yes'"
    suite_file.write_text(f"cases: [{{name: a, parallelism: 4, server_args: {{{name}: {bad}}}}}]\n")
    with pytest.raises(UsageError, match=rf"cases\[0\]\.server_args\.{name} must be "):
        load_suite(suite_file)
