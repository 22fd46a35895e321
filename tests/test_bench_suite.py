"""Suite files: what a valid one becomes, and one sentence naming the field for a bad one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.bench.suite import OverheadCase, ProbeCase, load_suite
from autotune.errors import UsageError
from tests.helpers import REPO, autotune


def write_suite(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


def test_the_projects_ci_suite_loads() -> None:
    suite = load_suite(REPO / "benchmarks" / "suite.yaml")
    sim, overhead = suite.cases
    assert isinstance(sim, ProbeCase) and isinstance(overhead, OverheadCase)
    assert sim.collect.target.base_url is None and sim.launch is None  # the embedded simulator
    assert "--time-scale" in sim.collect.target.sim_args
    assert (sim.repetitions, sim.warmup, suite.alpha) == (5, 1, 0.01)


def test_a_recommendation_supplies_parallelism_and_server_flags(tmp_path: Path) -> None:
    # The shape `autotune sweep` writes (autotune.recommend), trimmed to what bench reads.
    (tmp_path / "recommendation.json").write_text(
        json.dumps({"simulated": False, "server": {"max_num_seqs": 64, "block-size": 32},
                    "recommended": {"parallelism": 48, "predicted_throughput": 91.5}})
    )  # fmt: skip
    suite = load_suite(
        write_suite(
            tmp_path,
            """
repetitions: 3
threshold: 0.1
cases:
  - name: tuned
    recommendation: recommendation.json
    target: {launch: [vllm, serve, /models/m, --port, "{port}"], startup_timeout_s: 900}
  - name: tuned-on-sim
    recommendation: recommendation.json
    parallelism: 8
    warmup: 0
""",
        )
    )
    launched, simulated = suite.cases
    assert isinstance(launched, ProbeCase) and isinstance(simulated, ProbeCase)
    assert launched.collect.parallelism == 48
    assert launched.launch == (
        "vllm", "serve", "/models/m", "--port", "{port}", "--max-num-seqs", "64", "--block-size",
        "32",
    )  # fmt: skip
    assert launched.startup_timeout_s == 900
    assert (launched.repetitions, launched.threshold) == (3, 0.1)
    assert simulated.collect.parallelism == 8  # the case's own value wins
    assert simulated.collect.target.sim_args == ("--max-num-seqs", "64", "--block-size", "32")
    assert simulated.warmup == 0
    assert simulated.settings()["recommendation"] == "recommendation.json"


ONE = "cases: [{name: a, parallelism: 1"  # ... and the case's other fields, then "}]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cases: []", "cases must be a list of at least one case, not []."),
        ("cases: [{name: a, parallelism: 0}]",
         "cases[0].parallelism must be a whole number of at least 1, not 0."),
        ("cases: [{name: a, paralellism: 8}]",
         "cases[0].paralellism is not a field of a probe case; the fields are name, kind,"),
        ("cases: [{name: a, kind: overhead, parallelism: 8}]",
         "cases[0].parallelism is not a field of an overhead case"),
        ("cases: [{name: a, kind: sweep}]",
         "cases[0].kind must be probe or overhead, not 'sweep'."),
        ("cases: [{name: 'a b', parallelism: 1}]", "cases[0].name must be letters, digits"),
        ("cases: [{name: a, parallelism: 1}, {name: a, parallelism: 2}]",
         "two cases are named 'a'"),
        (f"repetitions: 50\n{ONE}}}]",
         "repetitions must be a whole number of at least 1 and at most 20, not 50."),
        (f"threshold: 5\n{ONE}}}]", "threshold must be a number above 0 and below 1, not 5."),
        (f"{ONE}, target: {{base_url: 'http://h/v1', launch: [x, '{{port}}']}}}}]",
         "cases[0].target.launch must be absent when base_url is given"),
        (f"{ONE}, target: {{launch: [vllm, serve, m]}}}}]",
         "cases[0].target.launch must be a command with {port} where the server's port goes"),
        (f"{ONE}, target: {{base_url: 'http://h/v1', sim_args: [--x]}}}}]",
         "cases[0].target.sim_args must be absent unless the case runs on the embedded"),
        (f"{ONE}, target: {{bse_url: 'http://h/v1'}}}}]",
         "cases[0].target.bse_url is not a field of a target"),
        (f"{ONE}, workload: {{input: missing.jsonl}}}}]",
         "cases[0].workload.input must be a task JSONL file (relative to the suite), "
         "not 'missing.jsonl'."),
        (f"{ONE}, workload: {{output_tokens: [1, 2, 3]}}}}]",
         "cases[0].workload.output_tokens must be a token count or [mean, std]"),
        (f"{ONE}, probe: {{min_s: 5, max_s: 2}}}}]",
         "cases[0].probe.max_s must be at least min_s (5), not 2.0."),
        ("cases: [{name: a, recommendation: nope.json}]", "the recommendation"),
        (ONE, "is not valid YAML"),
    ],
)  # fmt: skip
def test_a_bad_suite_is_one_sentence_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write_suite(tmp_path, text)
    with pytest.raises(UsageError) as raised:
        load_suite(path)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_selecting_cases_and_overriding_repetitions(tmp_path: Path) -> None:
    path = write_suite(tmp_path, "cases: [{name: a, parallelism: 1}, {name: b, kind: overhead}]")
    suite = load_suite(path).select(["b"], repetitions=2, warmup=0)
    assert [(c.name, c.repetitions, c.warmup) for c in suite.cases] == [("b", 2, 0)]
    with pytest.raises(UsageError, match=r"--case 'c' is not in .*; its cases are a, b\."):
        load_suite(path).select(["c"])


def test_the_cli_reports_a_bad_suite_with_exit_2(tmp_path: Path) -> None:
    path = write_suite(tmp_path, "cases: [{name: a, parallelism: -3}]")
    result = autotune("bench", "run", str(path), "--output-dir", str(tmp_path / "r"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"autotune: error: {path}: cases[0].parallelism must be a whole number of at least 1, "
        "not -3."
    ]
    assert not (tmp_path / "r" / "results.json").exists()
