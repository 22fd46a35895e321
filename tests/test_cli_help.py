"""`--help` works on every command and subcommand and says each flag's default; the
simulator's own help comes through `autotune sim serve`."""

from __future__ import annotations

import argparse
import select
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from autotune import __version__
from autotune.cli import build_parser, main
from autotune.hardware.deployment import build_parser as sim_parser
from autotune.helpformat import default_text
from tests.helpers import HANG_S, autotune, free_port


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the tree with the words that reach it: (), ("bench", "run"), ..."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = [path for path, _ in _commands(build_parser())]


def _help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--help"])
    assert exited.value.code in (0, None), path
    return " ".join(capsys.readouterr().out.split())


def _defaults(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(flag, default as --help should say it) for every flag that has one."""
    for action in parser._actions:
        shown = default_text(action.default)
        says_its_own = "default" in (action.help or "")
        if action.option_strings and action.nargs != 0 and shown is not None and not says_its_own:
            yield action.option_strings[0], shown


def test_the_tree_has_every_command() -> None:
    assert {" ".join(path) for path in COMMANDS} >= {
        "", "collect", "diagnose", "sweep", "report", "merge", "bench", "bench run",
        "bench compare", "bench ab", "bench update-baseline", "sim", "sim serve",
    }  # fmt: skip


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "autotune")
def test_help_of_every_command_exits_0_and_says_each_default(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(path, capsys)
    parser = dict(_commands(build_parser()))[path]
    if path == ("sim", "serve"):  # its flags are the simulator's, parsed by its own parser
        assert text.startswith("usage: autotune sim serve")
        parser = sim_parser()
    assert text.startswith("usage:")
    for flag, shown in _defaults(parser):
        assert f"(default: {shown})" in text, f"{' '.join(path)} {flag}"


def test_every_flag_that_takes_a_value_has_help() -> None:
    bare = [
        (" ".join(path), action.option_strings)
        for path, parser in [*_commands(build_parser()), (("sim", "serve"), sim_parser())]
        for action in parser._actions
        if action.option_strings and not action.help
    ]
    assert bare == []


def test_the_defaults_a_newcomer_asked_for_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(("diagnose",), capsys)
    for expected in ("--low LOW low probe parallelism (default: 5)", "(default: 20)"):
        assert expected in text
    assert "per-request timeout (default: 600)" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"autotune {__version__}"


@pytest.mark.parametrize("words", [("--help",), ("--", "--help")])
def test_sim_serve_help_as_a_user_types_it(words: tuple[str, ...]) -> None:
    result = autotune("sim", "serve", *words, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: autotune sim serve")
    assert "--max-num-seqs" in result.stdout


def test_sim_serve_takes_host() -> None:
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "autotune", "sim", "serve", "--host", "127.0.0.1", "--port",
         str(port), "--time-scale", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:  # fmt: skip
        try:
            assert server.stdout is not None
            ready, _, _ = select.select([server.stdout], [], [], 30)  # its first line, or EOF
            line = server.stdout.readline() if ready else "(nothing within 30 s)"
            assert f"listening on http://127.0.0.1:{port}" in line, line
        finally:
            server.terminate()
    assert server.returncode == 0


def test_sim_serve_quiet_serves_without_its_start_up_lines() -> None:
    """`-q`: the server answers, and prints nothing but warnings and errors."""
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "autotune", "sim", "serve", "-q", "--port", str(port),
         "--time-scale", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:  # fmt: skip
        try:
            deadline = time.monotonic() + HANG_S
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        break
                except OSError:
                    assert server.poll() is None, server.communicate()
                    assert time.monotonic() < deadline, f"no /health answer within {HANG_S:g} s"
                    time.sleep(0.1)
        finally:
            server.terminate()
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0 and out == "" and err == ""
