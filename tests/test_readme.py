"""The README documents every field of a study file (its JSON Schema is the truth) and
every flag, and each of its shell blocks runs as written (those that cannot run here say
why, in a `<!-- no-run: ... -->` comment above them)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from autotune.config.knobs import SERVER_KNOBS
from autotune.config.study import Study
from autotune.servers.launcher import ServerSpec
from tests.helpers import REPO, SIM_FAST, server_process

README = REPO / "README.md"


def _fields() -> list[str]:
    """Every top-level field, and every field of each section, as `section.field`."""
    schema = Study.model_json_schema()
    definitions = schema["$defs"]

    def section(prop: dict[str, Any]) -> dict[str, Any] | None:
        refs = [prop, *prop.get("anyOf", []), *prop.get("allOf", [])]
        for candidate in refs:
            if "$ref" in candidate:
                return definitions[candidate["$ref"].rsplit("/", 1)[-1]]
        return None

    names = []
    for name, prop in schema["properties"].items():
        inner = section(prop)
        if inner is None or "properties" not in inner:
            names.append(name)
        else:
            names += [f"{name}.{field}" for field in inner["properties"]]
    return names


def test_every_study_field_is_in_the_readme_table() -> None:
    rows = [
        line.split("|")[1]
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    missing = []
    for dotted in _fields():
        section, _, field = dotted.rpartition(".")
        if section == "search_space" and field in SERVER_KNOBS:
            dotted = "search_space.<knob>"  # one row for every knob of the table
        if not any(
            f"`{dotted}`" in row or (section and f"`{section}." in row and f"{field}`" in row)
            for row in rows
        ):
            missing.append(dotted)
    assert missing == [], f"study fields the README's table does not document: {missing}"


# -- every flag, and every shell block run as a newcomer would run it ---------------------

NO_RUN = "no-run:"
# A fenced block, with the HTML comment right above it if there is one.
BLOCK = re.compile(
    r"(?:<!-- (?P<mark>[^\n]*?) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.S | re.M
)
COMMAND_WORDS = ("autotune ", "make ", "pip ", "python ", "vllm ")


@dataclass(frozen=True)
class Block:
    lang: str
    mark: str
    body: str
    line: int

    @property
    def writes(self) -> list[str]:
        """The paths its `# writes: A B` comments say it writes."""
        return [
            path
            for line in self.body.splitlines()
            if line.startswith("# writes:")
            for path in line.removeprefix("# writes:").split()
        ]


def _blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(m["lang"], m["mark"] or "", m["body"], text.count("\n", 0, m.start("body")) + 1)
        for m in BLOCK.finditer(text)
    ]


def _options() -> list[str]:
    """Every option string of every command and subcommand, and of the simulator's."""
    from autotune.cli import build_parser
    from autotune.hardware.deployment import build_parser as sim_parser

    def walk(parser: argparse.ArgumentParser) -> Iterator[str]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)
            else:
                yield from action.option_strings

    return sorted({*walk(build_parser()), *walk(sim_parser())})


def test_every_flag_is_in_the_readme() -> None:
    text = README.read_text()
    missing = [
        option
        for option in _options()
        if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)
    ]
    assert missing == [], f"flags the README does not mention: {missing}"


def test_every_command_block_is_fenced_and_every_skipped_one_says_why() -> None:
    blocks = _blocks()
    shell = [b for b in blocks if b.lang == "sh"]
    assert len(shell) >= 8
    for block in shell:
        if block.mark.startswith(NO_RUN):
            assert len(block.mark.removeprefix(NO_RUN).strip()) > 10, block.line
    for block in blocks:
        if block.lang != "sh":
            assert not block.body.startswith(COMMAND_WORDS), f"line {block.line}: fence it sh"
    # A command outside a fence would escape the run below.
    indented = re.findall(r"\n\n((?:    .*\n)+)", README.read_text())
    commands = [b for b in indented if b.lstrip().startswith(COMMAND_WORDS)]
    assert commands == [], f"indented command blocks: fence them ```sh: {commands}"


@pytest.mark.slow
def test_every_runnable_command_block_runs_and_writes_what_it_says(tmp_path: Path) -> None:
    """In a fresh folder (the checkout's studies, examples and benchmarks copied in), in
    README order, against the simulator wherever a block names a server on port 8000; a
    `<!-- file: NAME -->` block is saved first, as the text tells a reader to."""
    for folder in ("examples", "studies", "benchmarks"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.db"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("NO_COLOR", None)
    ran = 0
    with server_process(ServerSpec.sim(SIM_FAST)) as base_url:
        host = base_url.removeprefix("http://").removesuffix("/v1")
        for block in _blocks():
            body = block.body.replace("localhost:8000", host)
            if block.mark.startswith("file:"):
                (tmp_path / block.mark.removeprefix("file:").strip()).write_text(body)
                continue
            if block.lang != "sh" or block.mark.startswith(NO_RUN):
                continue
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", body],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert result.returncode == 0, f"README line {block.line}:\n{result.stderr[-2000:]}"
            assert "Traceback" not in result.stderr
            missing = [path for path in block.writes if not (tmp_path / path).exists()]
            assert missing == [], f"README line {block.line} says it writes {missing}"
            ran += 1
    assert ran >= 5
