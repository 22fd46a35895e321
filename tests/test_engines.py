"""The three engines as a user meets them: the same diagnosis whatever the dialect, a study
of an SGLang or TensorRT-LLM server run end to end, the RL loop on SGLang's endpoints, and a
server of an engine autotune does not know (docs/engines.md)."""

from __future__ import annotations

from pathlib import Path

import orjson

from autotune.diagnose.classify import MISSING_SERVER_EVIDENCE
from autotune.servers.launcher import ServerSpec
from tests.helpers import autotune, server_process


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
