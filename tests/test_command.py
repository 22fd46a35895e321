"""`kind: command`: diagnosing a user's own collector, with a stand-in for NeMo Gym's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from autotune.errors import CollectionError, UsageError
from autotune.probe.command_probe import ROLLOUTS_PER_SLOT, CommandProbe, run_command_probe
from autotune.results.diagnosis import DiagnoseResult
from autotune.results.saved import load_result
from autotune.servers.command import command_argv
from tests.helpers import COLLECTOR_TEMPLATE, autotune, read_rows

TEMPLATE = COLLECTOR_TEMPLATE


def test_placeholders_are_filled_and_other_braces_kept(tmp_path: Path) -> None:
    argv = command_argv(
        "ng_collect_rollouts '+output_jsonl_fpath={output}' +limit={limit} "
        "+num_samples_in_parallel={parallelism} '+extra={a: 1}'",
        8,
        tmp_path / "out file.jsonl",
        40,
    )
    assert argv == [
        "ng_collect_rollouts",
        f"+output_jsonl_fpath={tmp_path / 'out file.jsonl'}",
        "+limit=40",
        "+num_samples_in_parallel=8",
        "+extra={a: 1}",
    ]


@pytest.mark.parametrize("missing", ["{parallelism}", "{output}"])
def test_a_template_without_a_needed_placeholder_is_refused(missing: str) -> None:
    with pytest.raises(UsageError, match=f"no {missing}"):
        command_argv(TEMPLATE.replace(missing, "x"), 2, Path("o"), 1)


async def test_probe_times_the_rows_as_they_land(tmp_path: Path) -> None:
    probe = await run_command_probe(f"{TEMPLATE} --latency 0.1", 4, 40, tmp_path)
    assert probe.stop_reason == "rows timed"
    # Steady state: the rows up to the first poll that saw the 4th are warm-up.
    assert 0 < probe.completed <= 36
    assert probe.rollouts_per_s == pytest.approx(probe.completed / probe.measured_s)
    assert probe.rollouts_per_s_ci[0] <= probe.rollouts_per_s <= probe.rollouts_per_s_ci[1]
    assert probe.warmup_s > 0 and probe.measured_s > 0
    assert probe.error_rate == 0 and probe.token_check is None
    rows = read_rows(tmp_path / "rollouts-p4.jsonl")
    assert sorted(r["_ng_task_index"] for r in rows) == list(range(40))


async def test_each_run_makes_ten_rollouts_a_slot_unless_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default keeps the high probe's run as many waves long as the low one's, so
    both steady windows hold rows; a --limit too small for a run's slots is warned about."""
    probe = CommandProbe(f"{TEMPLATE} --latency 0.01", None, tmp_path)
    for parallelism in (2, 6):
        await probe.measure(parallelism)
        rows = read_rows(tmp_path / f"rollouts-p{parallelism}.jsonl")
        assert len(rows) == ROLLOUTS_PER_SLOT * parallelism
    assert "rollouts a slot" not in caplog.text
    await CommandProbe(f"{TEMPLATE} --latency 0.01", 12, tmp_path).measure(6)
    assert len(read_rows(tmp_path / "rollouts-p6.jsonl")) == 12
    assert "--limit 12 gives parallelism 6 only 2.0 rollouts a slot" in caplog.text


async def test_a_failing_command_ends_in_its_own_error_line(tmp_path: Path) -> None:
    with pytest.raises(CollectionError) as caught:
        await run_command_probe(f"{TEMPLATE} --fail", 2, 4, tmp_path)
    message = str(caught.value)
    assert "status 1" in message and "the collector's config has no model server" in message
    assert str(tmp_path / "command-p2.log") in message


async def test_cancelling_the_probe_stops_the_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    probe = asyncio.create_task(
        run_command_probe(f"{TEMPLATE} --latency 30 --pid-file {pid_file}", 2, 4, tmp_path)
    )
    while not pid_file.exists() or not pid_file.read_text():
        await asyncio.sleep(0.05)
    pid = int(pid_file.read_text())
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
@pytest.mark.parametrize(("capacity", "verdict"), [(0, "parallelism-bound"), (2, "model-bound")])
def test_diagnose_a_collector_command(tmp_path: Path, capacity: int, verdict: str) -> None:
    """Scales when nothing behind it limits it; flat behind a server of 2 slots."""
    report = tmp_path / "report"
    result = autotune(
        "diagnose",
        "--command",
        f"{TEMPLATE} --latency 0.05 --capacity {capacity}",
        "--low",
        "2",
        "--high",
        "8",
        "--limit",
        "240",
        "--output-dir",
        str(report),
    )
    assert result.returncode == 0, result.stderr
    diagnosis = load_result(report / "diagnose.json")
    assert isinstance(diagnosis, DiagnoseResult)
    assert diagnosis.verdict.verdict == verdict, diagnosis.verdict.evidence
    assert diagnosis.target.command is not None
    assert diagnosis.target.command.endswith(f"--capacity {capacity}")
    low, high = diagnosis.probes
    assert (low.parallelism, high.parallelism) == (2, 8)
    assert (report / "index.html").exists()


def test_diagnose_reports_a_broken_command_in_one_sentence(tmp_path: Path) -> None:
    result = autotune("diagnose", "--command", f"{TEMPLATE} --fail", "--limit", "4")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "the command exited with status 1 at parallelism 5" in result.stderr
