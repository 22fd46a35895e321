"""Every module docstring under autotune/ is at most five lines and says what the module is
for; the why (design reasons, rules, algorithms, examples) lives in docs/design/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "autotune"
MAX_LINES = 5


def _docstrings() -> list[tuple[str, int, str]]:
    """(module, lines from the opening to the closing quotes, text) of every module docstring."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        if not body or not isinstance(body[0], ast.Expr):
            continue
        node = body[0]
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            found.append((path.relative_to(REPO).as_posix(), lines, node.value.value))
    return found


def test_module_docstrings_are_at_most_five_lines() -> None:
    too_long = [f"{name}: {lines} lines" for name, lines, _ in _docstrings() if lines > MAX_LINES]
    assert not too_long, (
        f"module docstrings over {MAX_LINES} lines (move the why to docs/design/):\n"
        + "\n".join(too_long)
    )


def test_design_pages_named_in_module_docstrings_exist() -> None:
    missing = [
        f"{name}: {page}"
        for name, _, text in _docstrings()
        for page in re.findall(r"docs/[\w./-]*\w\.md", text)
        if not (REPO / page).is_file()
    ]
    assert not missing, "module docstrings name pages that do not exist:\n" + "\n".join(missing)
