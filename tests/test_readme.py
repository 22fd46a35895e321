"""The README and the pages under docs/ hold the docs to the code: together they document
every field of a study file (its JSON Schema is the truth) and every flag; each of their
shell blocks runs as written (those that cannot run here say why, in a
`<!-- no-run: ... -->` comment above them); the README stays short; and every relative
link, and every file of the checkout they name, exists."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
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
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 300


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def _all_text() -> str:
    return "\n".join(page.read_text() for page in PAGES)


def test_the_docs_are_the_readme_and_the_pages_under_docs() -> None:
    assert len(PAGES) > 1, "no page under docs/"


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail to docs/"
    )


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


def test_every_study_field_is_in_a_table_of_the_docs() -> None:
    rows = [line.split("|")[1] for line in _all_text().splitlines() if line.startswith("| `")]
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
    assert missing == [], f"study fields no table of README.md or docs/ documents: {missing}"


# -- every flag, and every shell block run as a newcomer would run it ---------------------

NO_RUN = "no-run:"
# A fenced block, with the HTML comment right above it if there is one.
BLOCK = re.compile(
    r"(?:<!-- (?P<mark>[^\n]*?) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.S | re.M
)
COMMAND_WORDS = ("autotune ", "make ", "pip ", "python ", "vllm ")


@dataclass(frozen=True)
class Block:
    page: str
    lang: str
    mark: str
    body: str
    line: int

    @property
    def runs(self) -> bool:
        return self.lang == "sh" and not self.mark.startswith(NO_RUN)

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"

    @property
    def writes(self) -> list[str]:
        """The paths its `# writes: A B` comments say it writes."""
        return [
            path
            for line in self.body.splitlines()
            if line.startswith("# writes:")
            for path in line.removeprefix("# writes:").split()
        ]


def _blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [
        Block(
            _name(page),
            m["lang"],
            m["mark"] or "",
            m["body"],
            text.count("\n", 0, m.start("body")) + 1,
        )
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


def test_every_flag_is_in_the_docs() -> None:
    text = _all_text()
    missing = [
        option
        for option in _options()
        if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)
    ]
    assert missing == [], f"flags neither README.md nor docs/ mentions: {missing}"


def test_the_docs_hold_enough_command_blocks() -> None:
    blocks = [block for page in PAGES for block in _blocks(page)]
    assert len([b for b in blocks if b.lang == "sh"]) >= 8
    assert len([b for b in blocks if b.runs]) >= 5


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_command_block_is_fenced_and_every_skipped_one_says_why(page: Path) -> None:
    blocks = _blocks(page)
    for block in blocks:
        if block.lang == "sh" and block.mark.startswith(NO_RUN):
            assert len(block.mark.removeprefix(NO_RUN).strip()) > 10, block.where
        if block.lang != "sh":
            assert not block.body.startswith(COMMAND_WORDS), f"{block.where}: fence it sh"
    # A command outside a fence would escape the run below.
    indented = re.findall(r"\n\n((?:    .*\n)+)", page.read_text())
    commands = [b for b in indented if b.lstrip().startswith(COMMAND_WORDS)]
    assert commands == [], f"{_name(page)}: indented command blocks, fence them ```sh: {commands}"


def _benches(block: Block) -> bool:
    return "bench run" in block.body


def _runnable_parts() -> list[Any]:
    """Each page's blocks to run, in two parts: those that run `autotune bench run` go
    `alone` (the bench refuses a machine busy enough to delay its repetitions, as the
    tests beside it would make it: CI's refused 31 of them), each standing on its own in
    a fresh folder; the rest run in order beside other tests. The README's blocks take
    about two minutes, its bench 17 s: only the bench needs the machine to itself."""
    params = []
    for page in PAGES:
        runnable = [block for block in _blocks(page) if block.runs]
        if any(not _benches(block) for block in runnable):
            params.append(pytest.param(page, False, id=_name(page)))
        if any(_benches(block) for block in runnable):
            params.append(
                pytest.param(page, True, id=f"{_name(page)}:bench", marks=pytest.mark.alone)
            )
    return params


@pytest.mark.slow
@pytest.mark.parametrize(("page", "benches"), _runnable_parts())
def test_every_runnable_command_block_runs_and_writes_what_it_says(
    page: Path, benches: bool, tmp_path: Path
) -> None:
    """In a fresh folder (the checkout's studies, examples and benchmarks copied in), in
    the page's order, against the simulator wherever a block names a server on port 8000;
    a `<!-- file: NAME -->` block is saved first, as the text tells a reader to."""
    for folder in ("examples", "studies", "benchmarks"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.db"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("NO_COLOR", None)
    blocks = _blocks(page)
    to_run = [block for block in blocks if block.runs and _benches(block) == benches]
    ran = 0
    with server_process(ServerSpec.sim(SIM_FAST)) as base_url:
        host = base_url.removeprefix("http://").removesuffix("/v1")
        for block in blocks:
            body = block.body.replace("localhost:8000", host)
            if block.mark.startswith("file:"):
                (tmp_path / block.mark.removeprefix("file:").strip()).write_text(body)
                continue
            if block not in to_run:
                continue
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", body],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert result.returncode == 0, f"{block.where}:\n{result.stderr[-2000:]}"
            assert "Traceback" not in result.stderr, block.where
            missing = [path for path in block.writes if not (tmp_path / path).exists()]
            assert missing == [], f"{block.where} says it writes {missing}"
            ran += 1
    assert ran == len(to_run) > 0


# -- links, and the files of the checkout the docs name -----------------------------------

FENCE = re.compile(r"^```.*?^```$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def _prose(text: str) -> str:
    """The text without its fenced blocks and code spans (a `[x](y)` there is code)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped,
    spaces as hyphens, `-1`, `-2`, ... after a repeat."""
    seen: Counter[str] = Counter()
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_leads_to_a_file_and_its_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert broken == [], f"{_name(page)}: broken links: {broken}"


# A path of the checkout (`autotune/rollout/engine.py`), or a module's file named as its
# package's docs name it (`rollout/engine.py`, `engine.py` under its package's heading).
CHECKOUT_PATH = re.compile(
    r"(?<![\w./-])((?:autotune|benchmarks|scripts|tests|studies|examples)/[\w./-]*?"
    r"\.(?:py|sh|yaml|jsonl|json|md))(?![\w-])"
)
PY_FILE = re.compile(r"`([\w/]+\.py)`")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_file_of_the_checkout_the_docs_name_exists(page: Path) -> None:
    text = page.read_text()
    package = REPO / "autotune"
    modules = {path.relative_to(package).as_posix() for path in package.glob("**/*.py")}
    missing = {path for path in CHECKOUT_PATH.findall(text) if not (REPO / path).exists()}
    missing |= {
        name
        for name in PY_FILE.findall(text)
        if not (REPO / name).exists()
        and not any(module == name or module.endswith(f"/{name}") for module in modules)
    }
    assert sorted(missing) == [], f"{_name(page)} names files that do not exist: {missing}"
