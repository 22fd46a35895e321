"""Progress as a person sees it: a live bar in a real terminal (tmux), plain lines in a
log, nothing with --quiet; the bar's rate is the summary's."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from autotune.report.sweep_report import REPORT_VALIDATION, validated_text
from autotune.report.terminal import TERMINAL_VALIDATION, Progress, _Status
from autotune.results.trials import Validation
from autotune.sweep.recommend import recommendation
from tests.helpers import REPO
from tests.test_recommend import KNOBS, sweep, trial, usl_curve

COLLECT = (
    "collect", "--synthetic", "160", "--output-tokens", "64,8", "--parallelism", "16",
    "--no-output",
)  # fmt: skip
DIAGNOSE = ("diagnose", "--synthetic", "200", "--output-tokens", "64,8", "--max-s", "3")
# A live bar mid-run: count, share, rate, ETA.
LIVE_BAR = re.compile(r"\d+/160 rollouts +\d+% \S+ +[\d.]+ rollouts/s .*ETA \d+:\d\d")
FINAL_BAR = re.compile(r"160/160 rollouts 100% \S+ +([\d.]+) rollouts/s +elapsed")
SUMMARY_RATE = re.compile(r"throughput +([\d.,]+) rollouts/s")


def _autotune_line(*args: str) -> str:
    return " ".join([sys.executable, "-m", "autotune", *args])


@contextmanager
def _tmux(command: str, env: dict[str, str]) -> Iterator[Callable[[bool], str]]:
    """`command` in a detached 120×40 tmux terminal on a private server; yields
    `screen(escapes)`, the visible text (with colour escapes when asked)."""
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux (apt-get install tmux)")
    socket = f"autotune-test-{os.getpid()}-{time.monotonic_ns()}"
    tmux = ["tmux", "-L", socket]
    script = f"cd {REPO} && {command}; echo EXIT=$?; sleep 600"
    # Without COLUMNS and LINES (pytest's own), autotune sees the terminal's real width.
    settings = "-u COLUMNS -u LINES " + " ".join(f"{k}={v!r}" for k, v in env.items())
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "120", "-y", "40", f"env {settings} bash -c {script!r}"],
        check=True,
    )

    def screen(escapes: bool = False) -> str:
        flags = ["-e"] if escapes else []
        return subprocess.run(
            [*tmux, "capture-pane", "-p", *flags], capture_output=True, text=True, check=True
        ).stdout

    try:
        yield screen
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


def _until(look: Callable[[], str], done: Callable[[str], bool], within_s: float) -> str:
    """Look every 50 ms until `done` says so; the last look either way."""
    deadline = time.monotonic() + within_s
    seen = look()
    while not done(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = look()
    return seen


@pytest.mark.slow
def test_collect_on_a_terminal_draws_one_live_bar_with_rate_and_eta() -> None:
    with _tmux(_autotune_line(*COLLECT), {"TERM": "xterm-256color"}) as screen:
        mid = _until(screen, lambda s: bool(LIVE_BAR.search(s)) or "EXIT=" in s, 90)
        final = _until(screen, lambda s: "EXIT=" in s, 90)
        coloured = screen(True)
    assert LIVE_BAR.search(mid), mid
    assert "EXIT=0" in final, final
    bars = [line for line in final.splitlines() if "rollouts/s  elapsed" in line]
    assert len(bars) == 1, final  # redrawn in place: one line, not one per frame
    bar_rate = float(FINAL_BAR.search(bars[0])[1])  # type: ignore[index]
    summary_rate = float(SUMMARY_RATE.search(final)[1].replace(",", ""))  # type: ignore[index]
    assert bar_rate == pytest.approx(summary_rate, rel=0.02)  # one quantity, timed alike
    assert "\x1b[32m" in coloured  # the bar is green on a terminal...


@pytest.mark.slow
def test_no_color_leaves_the_bar_uncoloured() -> None:
    env = {"TERM": "xterm-256color", "NO_COLOR": "1"}
    with _tmux(_autotune_line(*COLLECT), env) as screen:
        final = _until(screen, lambda s: "EXIT=" in s, 90)
        coloured = screen(True)
    assert "EXIT=0" in final and FINAL_BAR.search(final), final
    assert "\x1b[32m" not in coloured  # ...and plain with NO_COLOR set


@pytest.mark.slow
def test_diagnose_on_a_terminal_shows_each_probe_as_it_goes() -> None:
    with _tmux(_autotune_line(*DIAGNOSE), {"TERM": "xterm-256color"}) as screen:
        seen = set()

        def look() -> str:
            text = screen()
            seen.update(re.findall(r"block [1-4]/4 at parallelism \d+: (warm-up|measuring)", text))
            return text

        final = _until(look, lambda s: "EXIT=" in s, 120)
    assert "EXIT=0" in final, final
    assert seen >= {"measuring"}, seen
    assert "verdict:" in final
    assert "block 4/4 at parallelism" not in final  # erased once the result is printed


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """`autotune ARGS` with stdout and stderr going to files (a log), not a terminal."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        cwd=REPO,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_collect_piped_into_a_log_writes_plain_progress_lines() -> None:
    result = _run(*COLLECT)
    assert result.returncode == 0, result.stderr
    log = result.stderr.decode()
    assert "\r" not in log and "\x1b" not in log
    assert re.search(r"^0/160 rollouts +0% +0\.00 rollouts/s", log, re.M), log
    finals = re.findall(r"^160/160 rollouts 100% +[\d.]+ rollouts/s +elapsed", log, re.M)
    assert len(finals) == 1, log


@pytest.mark.slow
def test_diagnose_piped_into_a_log_names_each_probe_phase() -> None:
    result = _run(*DIAGNOSE)
    assert result.returncode == 0, result.stderr
    log = result.stderr.decode()
    assert "\r" not in log and "\x1b" not in log
    for index, parallelism in ((1, 5), (2, 20), (3, 5), (4, 20)):
        for phase in ("warm-up", "measuring", "drain"):
            assert f"block {index}/4 at parallelism {parallelism}: {phase}" in log, log
    assert re.search(r": drain .*; [\d.,]+ rollouts/s \(wall clock\) ±[\d.]+%", log), log


@pytest.mark.parametrize("command", [COLLECT, DIAGNOSE], ids=["collect", "diagnose"])
@pytest.mark.slow
def test_quiet_prints_only_the_result(command: tuple[str, ...]) -> None:
    result = _run(*command, "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    out = result.stdout.decode()
    assert out.startswith("SIMULATED")
    assert ("throughput" if command is COLLECT else "verdict:") in out


def test_a_narrow_terminal_keeps_the_figures_and_drops_the_bar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("NO_COLOR", "1")
    stream = io.StringIO()
    progress = Progress(_Status(stream, live=True), "rollout")
    progress.set_total(1000)
    for _ in range(250):
        progress.rollout_done({}, 0)
    # 10 s later by the clock the progress reads: a rate and an ETA to show, exactly
    now = progress.started + 10
    monkeypatch.setattr("autotune.report.terminal.time.monotonic", lambda: now)
    progress._status.show(progress.text())  # type: ignore[union-attr]
    frame = stream.getvalue().rsplit("\r\x1b[K", 1)[-1]
    assert len(frame) <= 59 and "█" not in frame
    assert frame.startswith("250/1,000 rollouts  25%  25.00 rollouts/s")
    assert "ETA 0:30" in frame


def test_the_summary_and_the_report_read_one_validation_each_in_its_own_words() -> None:
    """One function reads the validation runs for the sweep's closing summary and its
    report (sweep_report.validated_text); each output keeps its wording and numbers."""
    unvalidated = recommendation(sweep(trial(0, 30.0, KNOBS, curve=usl_curve(lam=2.0))))
    assert unvalidated is not None
    run = Validation(
        trial=0, knobs=KNOBS, parallelism=40, rollouts=500, completed=498, throughput=1234.5,
        throughput_ci=None, predicted_throughput=1300.0, predicted_interval=None,
        error_rate=0.0123, max_error_rate=0.05, p50_latency_s=None, p95_latency_s=None,
        latency_dispersion=None, dispersion_limit=None, probe_s=10.0, passed=True, problems=[],
    )  # fmt: skip
    held = dataclasses.replace(unvalidated, validated=True, validations=[run])
    failed_run = dataclasses.replace(run, passed=False, problems=["too slow", "{not a field}"])
    failed = dataclasses.replace(unvalidated, validated=False, validations=[failed_run])
    figures = "498 rollouts at parallelism 40: {}, error rate 1.2%"
    terminal, report = figures.format("1.23e+03"), figures.format("1,234")
    assert [validated_text(r, TERMINAL_VALIDATION) for r in (unvalidated, held, failed)] == [
        "no validation run (budget.validate_rollouts: 0)",
        f"yes ({terminal})",
        f"NO ({terminal}: too slow; {{not a field}})",
    ]
    assert [validated_text(r, REPORT_VALIDATION) for r in (unvalidated, held, failed)] == [
        "not validated (budget.validate_rollouts: 0)",
        f"yes — {report}",
        f"no — {report}; too slow; {{not a field}}",
    ]
