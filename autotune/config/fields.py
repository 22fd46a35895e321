"""The field types that a flag, a study file and a bench suite share, each spelling its bad
values one way ("must be a whole number of at least 1, not 0"), the sentence a validation
error becomes (`spec_problem`), and `Option`, the flag a field declares.
Why: docs/design/config.md.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

Api = Literal["chat", "completions"]


def base_url_problem(url: str) -> str | None:
    """What keeps `url` from being a server's base URL ("needs http:// ..."), else None."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number raises ValueError
    except ValueError as error:
        return f"is not a valid URL ({error})"
    if parts.scheme not in ("http", "https"):
        return "needs http:// or https://"
    if not parts.hostname:
        return "needs a host"
    return None


def problem(expected: str, value: Any, field: str = "") -> PydanticCustomError:
    """`must be EXPECTED, not VALUE`: of the field being validated, or of `field` inside it
    (a model validator's finding about one of its fields)."""
    return sentence(f"must be {expected}, not {value!r}", field, expected=expected)


def sentence(
    text: str, field: str = "", message: str = "", expected: str = ""
) -> PydanticCustomError:
    """A validation error whose `text` is one finished phrase about the field (or `field`
    inside it); spec_problem puts the field's name before it, a study error shows
    `message` (default: the field's name and the text). `expected` (what a `must be`
    sentence asks for) lets a flag say it of the text as typed."""
    message = message or (f"{field} {text}" if field else text)
    return PydanticCustomError(
        "autotune",
        "{message}",
        {"message": message, "sentence": text, "field": field, "expected": expected},
    )


def must_be(expected: str, *, inner: bool = True) -> WrapValidator:
    """Every failure of the field reads `must be EXPECTED, not VALUE`; with inner=False only
    the field's own (a list's length), not those of the mappings inside it."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as error:
            if not inner and any(e["loc"] for e in error.errors()):
                raise
            raise problem(expected, value) from None

    return WrapValidator(check)


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("blank")
    return text


def _words(value: Any) -> Any:
    """A list of strings; numbers (`--time-scale, 0.1`) become strings."""
    if isinstance(value, list | tuple) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    return value


def _tokens(value: Any) -> tuple[int, int]:
    """`256` or `[256, 64]` tokens → (mean, std); one number means a std of a quarter."""
    parts = list(value) if isinstance(value, list | tuple) else [value]
    if not 1 <= len(parts) <= 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in parts
    ):
        raise problem("a token count or [mean, std]", value)
    if parts[0] < 1:
        raise problem("at least 1 token", value)
    return parts[0], parts[1] if len(parts) == 2 else parts[0] // 4


def _duration(value: Any) -> tuple[str, float, float]:
    """`2`, `normal:MEAN,SD` or `uniform:LOW,HIGH` seconds → (kind, a, b)."""
    expected = "seconds: a number, normal:MEAN,SD or uniform:LOW,HIGH"
    if isinstance(value, tuple) and len(value) == 3:  # validated once already (a flag's)
        kind, a, b = value
        return _duration(a) if kind == "fixed" else _duration(f"{kind}:{a},{b}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        if not (math.isfinite(number) and number >= 0):
            raise problem(expected, value)
        return ("fixed", number, 0.0)
    if not isinstance(value, str):
        raise problem(expected, value)
    kind, _, numbers = value.partition(":")
    try:
        parts = [float(part) for part in (numbers or kind).split(",")]
    except ValueError:
        raise problem(expected, value) from None
    if not numbers and len(parts) == 1:
        return _duration(parts[0])
    if kind not in ("normal", "uniform") or len(parts) != 2 or min(parts) < 0:
        raise problem(expected, value)
    if kind == "uniform" and parts[0] > parts[1]:
        raise problem(expected + " (LOW at most HIGH)", value)
    return (kind, parts[0], parts[1])


Count = Annotated[int, Strict(), Field(ge=1), must_be("a whole number of at least 1")]


Count0 = Annotated[int, Strict(), Field(ge=0), must_be("a whole number of at least 0")]


Positive = Annotated[float, Strict(), Field(gt=0), must_be("a number above 0")]


NonNegative = Annotated[float, Strict(), Field(ge=0), must_be("a number of at least 0")]


Share = Annotated[float, Strict(), Field(gt=0, lt=1), must_be("a number above 0 and below 1")]


Text = Annotated[str, Strict(), AfterValidator(_not_blank), must_be("a non-empty string")]


Flag = Annotated[bool, Strict(), must_be("true or false")]


Words = Annotated[tuple[str, ...], BeforeValidator(_words), must_be("a list of strings")]


Tokens = Annotated[tuple[int, int], BeforeValidator(_tokens)]  # a count, or [mean, std]


Duration = Annotated[tuple[str, float, float], BeforeValidator(_duration)]


ApiChoice = Annotated[Api, must_be("chat or completions")]


class SpecModel(BaseModel):
    """A mapping of a spec file: unknown fields are errors, values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str] = "a mapping"  # names it in "x is not a field of a target"


def unwrap(node: Any) -> Any:
    """A field's type without Annotated metadata and without `| None`."""
    while True:
        origin = get_origin(node)
        if origin is Annotated:
            node = get_args(node)[0]
            continue
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(node) if a is not type(None)]
            if len(members) == 1:
                node = members[0]
                continue
        return node


def _tag(member: Any) -> str | None:
    """The tag of one member of a tagged union (`Annotated[ProbeCase, Tag("probe")]`)."""
    tags = [m.tag for m in getattr(member, "__metadata__", ()) if isinstance(m, Tag)]
    return tags[0] if tags else None


def _tags(union: Any) -> list[str]:
    """The tags of a tagged union's members (`kind: probe`, `kind: overhead`)."""
    return [tag for tag in map(_tag, get_args(union)) if tag is not None]


def _locate(
    model: type[SpecModel], loc: Sequence[int | str]
) -> tuple[str, type[SpecModel] | None, Any]:
    """(`cases[0].target.launch`, the model holding the last field, the type found there)."""
    where: str = ""
    holder: type[SpecModel] | None = None  # the model the last field was looked up in
    node: Any = model  # the type at the location so far
    for part in loc:
        node = unwrap(node)
        if isinstance(part, int):
            where += f"[{part}]"
            args = get_args(node)
            node = args[0] if args else None
        elif isinstance(node, type) and issubclass(node, SpecModel):
            holder, where = node, f"{where}.{part}" if where else part
            info = node.model_fields.get(part)
            node = info.annotation if info is not None else None
        elif get_origin(node) in (Union, types.UnionType) and part in _tags(node):
            # A tagged union puts the tag it picked in the location; the file never says it.
            node = next(get_args(m)[0] for m in get_args(node) if _tag(m) == part)
        else:
            where, node = f"{where}.{part}" if where else part, None
    return where, holder, node


def spec_problem(model: type[SpecModel], error: ValidationError) -> str:
    """The first problem (a typo'd field before any value) as one sentence, no full stop:
    `cases[0].parallelism must be a whole number of at least 1, not 0`."""
    errors = error.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where, holder, node = _locate(model, first["loc"])
    kind, ctx, value = first["type"], first.get("ctx") or {}, first.get("input")
    if kind == "extra_forbidden" and holder is not None:
        fields = ", ".join(holder.model_fields)
        return f"{where} is not a field of {holder.what}; the fields are {fields}"
    if kind == "autotune":
        inside = ctx.get("field") or ""
        where = f"{where}.{inside}" if where and inside else where or inside
        return f"{where or 'the file'} {ctx['sentence']}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tagged = value.get("kind") if isinstance(value, dict) else None
        tags = " or ".join(_tags(unwrap(node)))
        return f"{where}.kind must be {tags}, not {tagged!r}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{where or 'the file'} must be a mapping of fields, not {value!r}"
    if kind == "missing":
        return f"{where} is missing; add it"
    return f"{where or 'the file'}: {first['msg'].removeprefix('Value error, ')}"


@dataclass(frozen=True, slots=True)
class Option:
    """How a spec field is spelled on the command line. The CLI (cli/options.py) adds the
    flag with the field's own default and checks its text with the field's own validation,
    so a flag, a study field and a suite field never differ in default, range or sentence."""

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    # The flag's text → the value the field validates (default: a number when it reads as
    # one, else the text); `256,64` → [256, 64] for a token count.
    text: Callable[[str], Any] | None = None
    switch: bool = False  # a `--no-X` flag: present means False (a flag without `--no-`


def _numbers(text: str) -> Any:
    """`256` → 256, `256,64` → [256, 64]; anything else stays text (and fails validation)."""
    try:
        parts = [int(part) for part in text.split(",")]
    except ValueError:
        return text
    return parts[0] if len(parts) == 1 else parts


def option(field: FieldInfo) -> Option | None:
    """The flag a spec field declares, if any."""
    return next((meta for meta in field.metadata if isinstance(meta, Option)), None)
