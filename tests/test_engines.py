"""The three engines as a user meets them: the same diagnosis whatever the dialect, a study
of an SGLang or TensorRT-LLM server run end to end, the RL loop on SGLang's endpoints, and a
server of an engine autotune does not know (docs/engines.md)."""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml

from autotune.diagnose.classify import MISSING_SERVER_EVIDENCE
from autotune.engines import ENGINES, Engine
from autotune.engines.description import PREEMPTIONS
from autotune.processes.event_loop import run_async
from autotune.servers.engine_servers import EngineServer
from autotune.servers.launcher import ServerSpec
from autotune.telemetry.prometheus import parse_prometheus
from tests.browser import render
from tests.helpers import autotune, free_port, one_sentence_error, server_process

SIM = (sys.executable, "-m", "autotune.servers.sim")
FAST = ("--min-s", "1.5", "--max-s", "8", "--synthetic", "400", "--output-tokens", "128,16")
SCENARIOS = {"batching server": None, "few slots": 2}  # max_num_seqs, None: the default


def _diagnosis(tmp_path: Path, engine: Engine, slots: int | None) -> dict[str, object]:
    args = [f"--sim-arg=--engine={engine.name}"]
    if slots is not None:
        args.append(f"--sim-arg={engine.flag('max_num_seqs')}={slots}")
    out = tmp_path / engine.name
    result = autotune("diagnose", *FAST, *args, "--output-dir", str(out), timeout=180)
    assert result.returncode == 0, result.stderr
    saved: dict[str, object] = orjson.loads((out / "diagnose.json").read_bytes())
    return saved


# The server's own figures every dialect serves, as autotune's quantities (vLLM's names).
SERVER_FIGURES = (
    "server/vllm:num_requests_running",
    "server/vllm:num_requests_waiting",
    "server/vllm:kv_cache_usage_perc",
    "server/vllm:generation_tokens_total",
)


# The server's checks one engine may not serve the metric of (TensorRT-LLM: preemptions).
CHECK_OF = {PREEMPTIONS: "server preemptions during the probe"}


@pytest.mark.slow
@pytest.mark.measures
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_dialect_gets_the_same_verdict_from_the_same_server_evidence(
    tmp_path: Path, scenario: str
) -> None:
    """One simulated server in vLLM's, SGLang's and TensorRT-LLM's dialect: the verdict,
    the checks it cites, and the server's own figures behind them are the same."""
    rows = {}
    for engine in ENGINES.values():
        saved = _diagnosis(tmp_path, engine, SCENARIOS[scenario])
        verdict = saved["verdict"]
        assert isinstance(verdict, dict)
        evidence = {e["name"]: e for e in verdict["evidence"]}
        probes = saved["probes"]
        assert isinstance(probes, list)
        assert {probe["server_engine"] for probe in probes} == {engine.name}
        for probe in probes:
            assert probe["telemetry_unavailable"].get("server") is None
            assert all(figure in probe["telemetry"] for figure in SERVER_FIGURES), engine
        high = probes[-1]["telemetry"]
        running, waiting = (
            high[f"server/vllm:num_requests_{s}"]["mean"] for s in ("running", "waiting")
        )
        rows[engine.name] = (verdict["verdict"], sorted(evidence), evidence)
        decided = f"{verdict['verdict']} ×{verdict['speedup']:.2f}"
        print(f"{scenario} | {engine.title} | {decided} | {sorted(evidence)} | "
              f"high probe: running {running:.1f}, waiting {waiting:.1f}")  # fmt: skip
    expected = "parallelism-bound" if SCENARIOS[scenario] is None else "model-bound"
    assert {verdict for verdict, _, _ in rows.values()} == {expected}, rows
    cited = rows["vllm"][1]
    for name, (_, names, _) in rows.items():  # a check of a metric the engine lacks is not cited
        lacks = set(cited) - set(names)
        served = ENGINES[name].metrics.names
        assert lacks == {c for q, c in CHECK_OF.items() if q not in served and c in cited}, rows
        assert set(names) <= set(cited), rows
    if SCENARIOS[scenario] is not None:  # the queue at the few slots, cited in each dialect
        for _, _, evidence in rows.values():
            assert evidence["server requests waiting (mean)"]["met"], evidence


def _study(tmp_path: Path, engine: Engine) -> Path:
    study = {
        "name": f"on-{engine.name}",
        "target": {
            "kind": engine.name,
            "model": "llama-3.1-8b",
            "command": [*SIM, "--engine", engine.name],
            "args": ["--time-scale", "0.02"],
        },
        "workload": {"synthetic": {"num_tasks": 200, "output_tokens": [64, 8]}},
        "search_space": {
            "parallelism": {"low": 4, "high": 64},
            "max_num_seqs": {"choices": [8, 32]},
            "enable_prefix_caching": {"choices": [True, False]},
        },
        "probe": {"min_s": 0.8, "max_s": 3},
        "budget": {"trials": 3, "validate_rollouts": 100},
    }
    path = tmp_path / f"{engine.name}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sglang", "trtllm"])
def test_a_study_of_an_sglang_or_tensorrt_llm_server_runs_end_to_end(
    tmp_path: Path, name: str
) -> None:
    """`kind: sglang` / `kind: trtllm` launched (on the simulator, which reads the engine's
    own launch line), searched, recommended in the engine's own flags, reported."""
    engine = ENGINES[name]
    result = autotune(
        "sweep", str(_study(tmp_path, engine)), "--output-dir", str(tmp_path / "out"),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    recommendation = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    snippets = recommendation["snippets"]
    assert snippets["engine"] == name
    line = snippets["serve"]
    model = [engine.model_flag, "llama-3.1-8b"] if engine.model_flag else ["llama-3.1-8b"]
    assert line.startswith(" ".join([*engine.command, *model]))
    seqs = recommendation["server"]["max_num_seqs"]
    assert f"{engine.flag('max_num_seqs')} {seqs}" in line and "--max-num-seqs" not in line
    if name == "sglang":
        assert "--enable-metrics" in line
        assert set(snippets["frameworks"]) == {"slime", "verl", "areal"}
        assert f"--sglang-max-running-requests {seqs}" in snippets["frameworks"]["slime"]
    else:
        options = yaml.safe_load(snippets["options"])
        assert options["return_perf_metrics"] is True
        caching = recommendation["server"]["enable_prefix_caching"]
        assert options["kv_cache_config"]["enable_block_reuse"] is caching
    page = render(tmp_path / "out" / "index.html", tmp_path / "sweep.png")
    assert page.console_errors == [] and engine.title in page.text


def _dialect(name: str = "sglang") -> EngineServer:
    """The simulator launched from the engine's own launch line (its dialect)."""
    command = [*SIM, "--engine", name, "--time-scale", "0.01"]
    return EngineServer(
        ENGINES[name], "llama-3.2-1b", {"max_num_seqs": 16}, command=command, port=free_port()
    )


@pytest.mark.parametrize(
    ("mode", "pause"), [("sync", "abort"), ("async", "keep"), ("async", "retract")]
)
def test_the_loop_pauses_and_updates_weights_through_sglangs_endpoints(
    tmp_path: Path, mode: str, pause: str
) -> None:
    """Each sync is SGLang's pause_generation, update_weights_from_disk and
    continue_generation: the simulator's own counters count one of each a step. The
    cache is flushed only where SGLang allows it (after an abort, the engine idle): keep
    (its in_place, the default) and retract leave it to the weight update's own flush."""
    steps = 3
    with _dialect() as server:
        assert server.base_url is not None
        result = autotune(
            "loop", "--base-url", server.base_url, "--num-repeats", "2", "--batch-groups",
            "2", "--steps", str(steps), "--mode", mode, "--train-s", "0.05",
            "--sync-via-server", "--pause-mode", pause, "--output-tokens", "16,0",
            "--output-dir", str(tmp_path), "--json", "--quiet",
        )  # fmt: skip
        with urllib.request.urlopen(server.base_url.removesuffix("/v1") + "/metrics") as page:
            counters = parse_prometheus(page.read().decode())
    assert result.returncode == 0, result.stderr
    summary = orjson.loads(result.stdout)
    assert summary["pause_source"] == "server" and summary["mode"] == mode
    assert counters["autotune_pauses_total"] == steps
    assert counters["autotune_weight_updates_total"] == steps
    assert counters["sglang:num_running_reqs"] == 0  # every pause was continued


def test_a_pause_mode_sglang_lacks_is_refused_in_one_sentence(tmp_path: Path) -> None:
    with _dialect() as server:
        assert server.base_url is not None
        result = autotune(
            "loop", "--base-url", server.base_url, "--num-repeats", "2", "--steps", "1",
            "--pause-mode", "wait", "--output-dir", str(tmp_path),
        )  # fmt: skip
    line = one_sentence_error(result)
    assert "--pause-mode wait is not one SGLang has" in line and "in_place" not in line


def test_a_server_of_an_unknown_engine_still_gets_a_verdict_naming_what_was_missing(
    tmp_path: Path,
) -> None:
    """A plain OpenAI-compatible server with no /metrics (the null server): a verdict from
    the client's timings, and a note naming the server's evidence it went without."""
    with server_process(ServerSpec.null()) as base_url:
        result = autotune(
            "diagnose", "--base-url", base_url, "--synthetic", "200", "--min-s", "0.5",
            "--max-s", "3", "--output-dir", str(tmp_path), timeout=120,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("verdict:")
    saved = orjson.loads((tmp_path / "diagnose.json").read_bytes())
    notes = saved["verdict"]["notes"]
    assert any(note.startswith("server: no server telemetry") for note in notes), notes
    assert MISSING_SERVER_EVIDENCE in notes
    assert all(probe["server_engine"] is None for probe in saved["probes"])


def test_a_weight_update_the_server_lacks_is_refused_before_the_first_step(
    tmp_path: Path,
) -> None:
    """A server with no RL endpoints (the null server): `--sync-via-server` is one sentence
    before any rollout, not a failure at the sync."""
    with server_process(ServerSpec.null()) as base_url:
        result = autotune(
            "loop", "--base-url", base_url, "--num-repeats", "2", "--steps", "1",
            "--sync-via-server", "--output-dir", str(tmp_path),
        )  # fmt: skip
    line = one_sentence_error(result)
    assert "--sync-via-server needs the server's weight update" in line
    assert (
        not (tmp_path / "rollouts.jsonl").exists() or not (tmp_path / "rollouts.jsonl").read_text()
    )


def test_the_loop_updates_tensorrt_llms_weights_and_pauses_from_the_client(
    tmp_path: Path,
) -> None:
    """TensorRT-LLM serves no HTTP pause: a sync stops new requests on the client's side,
    and `--sync-via-server` is its own /update_weights, one a step."""
    steps = 2
    with _dialect("trtllm") as server:
        assert server.base_url is not None
        result = autotune(
            "loop", "--base-url", server.base_url, "--num-repeats", "2", "--batch-groups",
            "2", "--steps", str(steps), "--train-s", "0.05", "--sync-via-server",
            "--output-tokens", "16,0", "--output-dir", str(tmp_path), "--json", "--quiet",
        )  # fmt: skip
        metrics = server.base_url.removesuffix("/v1") + "/prometheus/metrics"
        with urllib.request.urlopen(metrics) as page:
            counters = parse_prometheus(page.read().decode())
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["pause_source"] == "client"
    assert counters["autotune_weight_updates_total"] == steps
    assert counters["autotune_pauses_total"] == 0


def test_tensorrt_llms_options_file_lives_only_while_its_server_may_run(tmp_path: Path) -> None:
    """Written beside the launch line, named in it, removed at the stop, whether the server
    ran or never started; a line refused before it is written leaves none."""
    before = set(Path(tempfile.gettempdir()).glob("autotune-trtllm-*.yaml"))
    with _dialect("trtllm") as server:
        assert server.options_file is not None and server.options_file.exists()
        assert str(server.options_file) in server.cmd
        assert yaml.safe_load(server.options_file.read_text())["return_perf_metrics"] is True
    assert not server.options_file.exists()
    never = _dialect("trtllm")
    assert never.options_file is not None
    run_async(never.stop())
    assert not never.options_file.exists()
    with pytest.raises(ValueError, match="has no gpu_memory_utilization"):
        EngineServer(ENGINES["trtllm"], "m", {"gpu_memory_utilization": 0.9}, command=["x"], port=1)
    assert set(Path(tempfile.gettempdir()).glob("autotune-trtllm-*.yaml")) == before
