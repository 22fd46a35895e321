"""The README documents every field of a study file (its JSON Schema is the truth)."""

from __future__ import annotations

from typing import Any

from autotune.config import Study
from tests.helpers import REPO


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
        if not any(
            f"`{dotted}`" in row or (section and f"`{section}." in row and f"{field}`" in row)
            for row in rows
        ):
            missing.append(dotted)
    assert missing == [], f"study fields the README's table does not document: {missing}"
