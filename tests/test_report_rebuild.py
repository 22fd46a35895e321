"""`autotune report DIR` rebuilds every output of a job from its saved JSON alone, and
refuses a file it cannot read (another schema version, a foreign or truncated JSON) in one
sentence, without a traceback and without writing anything.

index.html embeds no build time (report.html.page writes none, and the plots are saved
without a Software chunk), so a rebuilt file must equal the original byte for byte.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import orjson
import pytest
import yaml

from autotune.results.codec import SCHEMA_VERSION, to_json
from autotune.results.diagnosis import DiagnoseResult
from tests.helpers import autotune, one_sentence_error, sweep

DIAGNOSE = ("--synthetic", "40", "--low", "2", "--high", "4", "--min-s", "0.2", "--max-s", "1")
SAVED = {"diagnose": "diagnose.json", "sweep": "sweep.json"}
OUTPUTS = {
    "diagnose": {"diagnose.json", "index.html"},
    "sweep": {
        "sweep.json",
        "trials.csv",
        "recommendation.json",
        "recommendation.yaml",
        "index.html",
    },
}


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The report directory of a finished diagnose and of a finished sweep (simulated)."""
    root = tmp_path_factory.mktemp("finished")
    diagnosed = autotune("diagnose", *DIAGNOSE, "--output-dir", str(root / "diagnose"), timeout=180)
    assert diagnosed.returncode == 0, diagnosed.stderr
    study = root / "rebuild.yaml"
    marker = f"sim/rebuild-{uuid.uuid4().hex[:8]}"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "rebuild",
                "target": {
                    "kind": "sim",
                    "args": ["--time-scale", "0.02", "--served-model-name", marker],
                },
                "workload": {"synthetic": {"num_tasks": 100, "output_tokens": [64, 8]}},
                "search_space": {
                    "parallelism": {"low": 4, "high": 32},
                    "max_num_seqs": {"choices": [8, 32]},
                },
                "probe": {"min_s": 0.5, "max_s": 2},
                "budget": {"trials": 2},
            }
        )
    )
    swept = sweep(study, root)
    assert swept.returncode == 0, swept.stderr
    return {"diagnose": root / "diagnose", "sweep": root / "reports" / "rebuild"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["diagnose", "sweep"])
def test_report_rebuilds_every_output_from_the_saved_json(
    finished: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    directory = tmp_path / kind
    shutil.copytree(finished[kind], directory)
    original = _files(directory)
    assert set(original) == OUTPUTS[kind]
    for name in original:
        if name != SAVED[kind]:
            (directory / name).unlink()
    assert _files(directory).keys() == {SAVED[kind]}

    rebuilt = autotune("report", str(directory))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "Traceback" not in rebuilt.stderr
    assert rebuilt.stdout.strip() == str(directory / "index.html")
    again = _files(directory)
    assert again.keys() == original.keys()
    for name, content in original.items():
        assert again[name] == content, f"{name} differs once rebuilt"

    # From the JSON file into another directory: the same files again.
    elsewhere = tmp_path / "elsewhere"
    moved = autotune("report", str(directory / SAVED[kind]), "--output-dir", str(elsewhere))
    assert moved.returncode == 0, moved.stderr
    assert _files(elsewhere) == original


def test_an_unbounded_interval_reads_back_unbounded_and_rebuilds(
    finished: dict[str, Path], tmp_path: Path
) -> None:
    """A probe of one batch has no upper bound: its interval is saved as "Infinity", not as
    the null JSON writes for a non-finite number, so the report rebuilds from it."""
    path, data = _saved_copy(finished, "diagnose", tmp_path)
    data["probes"][0]["rollouts_per_s_ci"][1] = math.inf
    path.write_bytes(to_json(data))
    assert b'"Infinity"' in path.read_bytes()
    rebuilt = autotune("report", str(path.parent))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (path.parent / "index.html").is_file()
    assert b'"Infinity"' in path.read_bytes()  # the rewritten JSON keeps the infinity
    loaded = DiagnoseResult.from_dict(orjson.loads(path.read_bytes()))
    assert math.isinf(loaded.probes[0].rollouts_per_s_ci[1])


def test_trials_csv_and_the_pages_trials_table_are_one_table(finished: dict[str, Path]) -> None:
    directory = finished["sweep"]
    with (directory / "trials.csv").open(newline="") as handle:
        csv_rows = list(csv.reader(handle))
    page = (directory / "index.html").read_text()
    table = page.split("<h2>Trials</h2>")[1].split("</table>")[0]
    headers = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", table)
    assert [h.replace("<wbr>", "") for h in headers] == csv_rows[0]  # <wbr>: may wrap there
    assert csv_rows[0][:4] == ["trial", "state", "copy_of", "max_num_seqs"]
    assert len(re.findall(r"<tr><td", table)) == len(csv_rows) - 1
    assert len([row for row in csv_rows[1:] if not row[2]]) == 2  # the budget; copies apart


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal prints; nothing else on stderr, no traceback."""
    line = one_sentence_error(result)
    assert result.stderr.strip() == line
    return line


def _saved_copy(finished: dict[str, Path], kind: str, tmp_path: Path) -> tuple[Path, dict]:
    """A directory holding only a copy of the saved JSON, and its content parsed."""
    directory = tmp_path / "saved"
    directory.mkdir()
    path = directory / SAVED[kind]
    shutil.copyfile(finished[kind] / SAVED[kind], path)
    return path, orjson.loads(path.read_bytes())


@pytest.mark.parametrize("kind", ["diagnose", "sweep"])
@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1])
def test_another_schema_version_is_refused_in_one_sentence(
    finished: dict[str, Path], tmp_path: Path, kind: str, version: int
) -> None:
    path, data = _saved_copy(finished, kind, tmp_path)
    path.write_bytes(orjson.dumps({**data, "schema_version": version}))
    line = _refused(autotune("report", str(path.parent)))
    assert f"saved with result schema version {version}" in line
    assert f"reads version {SCHEMA_VERSION}" in line
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # nothing written


@pytest.mark.parametrize("content", [{"a": 1}, [1, 2], "text", {"kind": "rollouts"}])
def test_a_foreign_json_is_refused_in_one_sentence(tmp_path: Path, content: object) -> None:
    path = tmp_path / "diagnose.json"
    path.write_bytes(orjson.dumps(content))
    line = _refused(autotune("report", str(path)))
    assert f"{path} is not a saved autotune result" in line
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize(
    ("kind", "cut", "missing"),
    [
        ("diagnose", ("probes",), "probes"),
        ("diagnose", ("verdict", "next_step"), "next_step"),
        ("sweep", ("trials",), "trials"),
        ("sweep", ("trials", 0, "knobs"), "knobs"),
    ],
    ids=["diagnose-probes", "diagnose-verdict-next-step", "sweep-trials", "sweep-trial-knobs"],
)
def test_a_truncated_result_is_refused_in_one_sentence(
    finished: dict[str, Path],
    tmp_path: Path,
    kind: str,
    cut: tuple[str | int, ...],
    missing: str,
) -> None:
    path, data = _saved_copy(finished, kind, tmp_path)
    holder = data
    for step in cut[:-1]:
        holder = holder[step]
    del holder[cut[-1]]
    path.write_bytes(orjson.dumps(data))
    line = _refused(autotune("report", str(path.parent)))
    assert f"{path} is not a complete {kind} result" in line and repr(missing) in line
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_cut_off_file_is_refused_in_one_sentence(
    finished: dict[str, Path], tmp_path: Path
) -> None:
    path, _ = _saved_copy(finished, "diagnose", tmp_path)
    content = path.read_bytes()
    path.write_bytes(content[: len(content) // 2])  # a copy interrupted halfway
    line = _refused(autotune("report", str(path)))
    assert f"{path} is not valid JSON" in line
