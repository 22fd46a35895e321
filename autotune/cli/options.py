"""Flags read from the one configuration model (autotune.config): a spec field's `Option`
becomes a flag with its default and validation, and `spec_of` builds the spec back.
Why: docs/design/cli.md.
"""

from __future__ import annotations

import argparse
from typing import Annotated, Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from autotune.config.fields import Option, SpecModel, option, spec_problem
from autotune.config.flags import field_name
from autotune.errors import UsageError

Spec = TypeVar("Spec", bound=SpecModel)


def _dest(flags: tuple[str, ...]) -> str:
    """The namespace key argparse itself would give the first long flag."""
    long = next(flag for flag in flags if flag.startswith("--"))
    return field_name(long)


def _declared(spec: type[SpecModel], name: str) -> tuple[FieldInfo, Option]:
    field = spec.model_fields[name]
    declared = option(field)
    if declared is None:
        raise TypeError(f"{spec.__name__}.{name} declares no command-line flag")
    return field, declared


def _parser(field: FieldInfo, declared: Option) -> Any:
    """An argparse type: the flag's text, validated as the field validates its value."""
    annotated: Any = Annotated[(field.annotation, *field.metadata)]
    adapter: TypeAdapter[Any] = TypeAdapter(annotated)

    def parse(text: str) -> Any:
        candidates = [text] if declared.text is None else []
        candidates.append(_number(text) if declared.text is None else declared.text(text))
        for value in candidates:
            try:
                return adapter.validate_python(value)
            except ValidationError as error:
                failure = error
        first = failure.errors()[0]
        ctx = first.get("ctx") or {}
        if ctx.get("expected"):
            raise argparse.ArgumentTypeError(f"must be {ctx['expected']}, not {text!r}")
        raise argparse.ArgumentTypeError(first["msg"].removeprefix("Value error, "))

    return parse


def _number(text: str) -> Any:
    """`5` → 5, `0.5` → 0.5, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def add_options(group: argparse._ActionsContainer, spec: type[SpecModel], *names: str) -> None:
    """The flags of `spec`'s fields `names`, in that order, defaults from the spec."""
    for name in names:
        field, declared = _declared(spec, name)
        if declared.switch:  # --no-X turns a True default off; --X turns a False one on
            action = "store_false" if field.default else "store_true"
            group.add_argument(*declared.flags, dest=name, action=action, help=declared.help)
            continue
        group.add_argument(
            *declared.flags,
            type=_parser(field, declared),
            default=field.default,
            metavar=declared.metavar,
            help=declared.help,
        )


def spec_of(args: argparse.Namespace, spec: type[Spec]) -> Spec:
    """`spec` built from all its flags, checked together; a problem is one sentence."""
    try:
        return spec(**values_of(args, spec, *spec.model_fields))
    except ValidationError as error:
        raise UsageError(spec_problem(spec, error).removeprefix("the file: ") + ".") from None


def values_of(args: argparse.Namespace, spec: type[SpecModel], *names: str) -> dict[str, Any]:
    """{field: the parsed flag} of `spec`'s fields `names`."""
    values = {}
    for name in names:
        _, declared = _declared(spec, name)
        values[name] = getattr(args, name if declared.switch else _dest(declared.flags))
    return values
