"""Saved results as plain, versioned JSON: `Record` dataclasses encoded by `to_json` and
decoded by their own type hints, written whole by `save`. Why: docs/design/results.md.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import orjson

from autotune.errors import UsageError

SCHEMA_VERSION = 2


R = TypeVar("R", bound="Record")


class ResultFormatError(UsageError):
    """A saved file is not a result this version of autotune can read."""


def _decode(kind: Any, value: Any) -> Any:
    """`value` (parsed JSON) as the annotated type `kind`: nested records, lists, tuples."""
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        options = [option for option in get_args(kind) if option is not type(None)]
        return _decode(options[0], value) if len(options) == 1 else value
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_dict(value)
    if origin in (list, Sequence):
        (item,) = get_args(kind)
        return [_decode(item, v) for v in _expect(value, list)]
    if origin is tuple:
        items, args = _expect(value, list), get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in items)
        if len(args) == len(items):
            return tuple(_decode(arg, v) for arg, v in zip(args, items, strict=True))
        return tuple(items)
    if origin in (dict, Mapping):
        _, item = get_args(kind)
        return {str(k): _decode(item, v) for k, v in _expect(value, dict).items()}
    if kind is float:
        if value is None:  # written for NaN
            return math.nan
        if isinstance(value, int) or value in _INFINITIES:
            return float(value)
    return value


def _expect(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


class Record:
    """Mixin of the result dataclasses: `to_dict` for the writer, `from_dict` for the reader."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Raises KeyError or TypeError on a malformed dict (load_result turns them into
        one sentence)."""
        hints = get_type_hints(cls)
        renamed: Mapping[str, str] = getattr(cls, "renamed", {})
        data = {renamed.get(key, key): value for key, value in data.items()}
        values = {}
        for item in dataclasses.fields(cls):  # type: ignore[arg-type]
            if item.name in data:
                values[item.name] = _decode(hints[item.name], data[item.name])
            elif (
                item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
            ):
                raise KeyError(item.name)
        return cls(**values)


_INFINITIES = ("Infinity", "-Infinity")


def _finite_or_named(value: Any) -> Any:
    """`value` with every infinity as the string JSON has no number for: an unbounded
    interval must read back unbounded, not as the null orjson writes for it."""
    if isinstance(value, float) and math.isinf(value):
        return _INFINITIES[value < 0]
    if isinstance(value, dict):
        return {k: _finite_or_named(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_named(v) for v in value]
    return value


def to_json(value: Record | Mapping[str, Any]) -> bytes:
    """The one JSON writer of saved files: indented, UTF-8, NaN written as null and an
    infinity as "Infinity" or "-Infinity" (read back as floats)."""
    data = value.to_dict() if isinstance(value, Record) else value
    return orjson.dumps(
        _finite_or_named(data), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
    )


def save(value: Record | Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(to_json(value))
    return path


def read_json(path: Path) -> Any:
    """A JSON file's content; a missing or malformed file is one sentence."""
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist; check the path.") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; pass the JSON file.") from None
    except orjson.JSONDecodeError as error:
        raise UsageError(
            f"{path} is not valid JSON ({error}); pass a file autotune saved."
        ) from None


def machine_identity() -> dict[str, str]:
    """Where a result was measured (reports show it; bench compares its own fingerprint)."""
    import platform

    from autotune import __version__

    return {"host": platform.node(), "python": platform.python_version(), "autotune": __version__}
