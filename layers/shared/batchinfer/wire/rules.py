"""The words of a pydantic model's field rules, for error messages ("`top_k` must be <rule>").

A rule is stated once, as the field's type and constraints; `rules(model)` words each field from
them: `bool` "a boolean", `int` with bounds "an integer in (0, 2147483647]", `float` "a number
greater than 0" or "a number in (1e-06, 1.0]", `str` with lengths "a string of 1 to 256
characters", a `Literal` its value, a list "an array" ("an array of exactly 1" with equal length
bounds), a nested model "an object" ("an object with name, shape, datatype and data": its required
fields). What a constraint cannot say (what a pattern allows, what a list holds) is a `Words`
annotation beside it, where `{rule}` stands for the derived words and `{interval}` for the bounds.
Keys are field paths with list indices elided: `inputs[].data[]`.

    seed: Annotated[int, Field(gt=0, le=UINT64_MAX), Words("{rule} or null")] | None = None
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = ["Words", "rules"]

_BOUNDS = ("gt", "ge", "lt", "le", "min_length", "max_length")


class Words:
    """A field's rule in words where its constraints cannot say it all (an annotation pydantic ignores):
    `text` may hold `{rule}` (the derived words) and `{interval}` (the bounds, "(0, 3600]")."""

    def __init__(self, text: str) -> None:
        self.text = text


def _unwrap(annotation: Any) -> tuple[Any, dict[str, Any], str | None]:
    """(the type without `None` and `Annotated`, its bounds, its description)."""
    bounds: dict[str, Any] = {}
    description = None
    while True:
        origin = typing.get_origin(annotation)
        if origin in (Union, types.UnionType):
            annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
        elif origin is Annotated:
            annotation, *metadata = typing.get_args(annotation)
            more, described = _constraints(metadata)
            bounds.update(more)
            description = description or described
        else:
            return annotation, bounds, description


def _constraints(metadata: list[Any]) -> tuple[dict[str, Any], str | None]:
    bounds: dict[str, Any] = {}
    description = None
    for item in metadata:
        if isinstance(item, Words):
            description = item.text
            continue
        if isinstance(item, FieldInfo):
            more, described = _constraints(item.metadata)
            bounds.update(more)
            description = description or described
            continue
        bounds.update(
            {name: getattr(item, name) for name in _BOUNDS if getattr(item, name, None) is not None}
        )
    return bounds, description


def _interval(bounds: dict[str, Any]) -> str:
    low = f"({bounds['gt']!r}" if "gt" in bounds else f"[{bounds['ge']!r}"
    high = f"{bounds['lt']!r})" if "lt" in bounds else f"{bounds['le']!r}]"
    return f"{low}, {high}"


def _number(noun: str, bounds: dict[str, Any]) -> str:
    has_low, has_high = bool({"gt", "ge"} & set(bounds)), bool({"lt", "le"} & set(bounds))
    if has_low and has_high:
        return f"{noun} in {_interval(bounds)}"
    if "gt" in bounds and not has_high:
        return f"{noun} greater than {bounds['gt']!r}"
    return noun


def _object(model: type[BaseModel]) -> str:
    required = [name for name, field in model.model_fields.items() if field.is_required()]
    if not required:
        return "an object"
    if len(required) == 1:
        return f"an object with a {required[0]}"
    return f"an object with {', '.join(required[:-1])} and {required[-1]}"


def _derived(kind: Any, bounds: dict[str, Any]) -> str | None:
    origin = typing.get_origin(kind)
    if kind is bool:
        return "a boolean"
    if kind is int:
        return _number("an integer", bounds)
    if kind is float:
        return _number("a number", bounds)
    if kind is str and "min_length" in bounds and "max_length" in bounds:
        return f"a string of {bounds['min_length']} to {bounds['max_length']} characters"
    if origin is Literal:
        return " or ".join(f'"{value}"' for value in typing.get_args(kind))
    if origin is list:
        if bounds.get("min_length") is not None and bounds.get("min_length") == bounds.get("max_length"):
            return f"an array of exactly {bounds['min_length']}"
        return "an array"
    if origin is dict or (isinstance(kind, type) and issubclass(kind, BaseModel)):
        return _object(kind) if origin is None else "an object"
    return None


def _word(kind: Any, bounds: dict[str, Any], description: str | None) -> str | None:
    rule = _derived(kind, bounds)
    if description is None:
        return rule
    interval = _interval(bounds) if {"gt", "ge"} & set(bounds) and {"lt", "le"} & set(bounds) else ""
    return description.format(rule=rule, interval=interval)


def rules(model: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """The words of every field of `model` and of the models and lists inside it, keyed by path
    (`parameters.top_k`, `inputs[].name`, `inputs[].data[]`); fields of type `Any` have none."""
    found: dict[str, str] = {}
    for name, field in model.model_fields.items():
        kind, bounds, description = _unwrap(field.annotation)
        more, described = _constraints(field.metadata)
        bounds.update(more)
        _add(found, f"{prefix}{name}", kind, bounds, described or description)
    return found


def _add(
    found: dict[str, str], path: str, kind: Any, bounds: dict[str, Any], description: str | None
) -> None:
    if (rule := _word(kind, bounds, description)) is not None:
        found[path] = rule
    if typing.get_origin(kind) is list:
        item, item_bounds, item_description = _unwrap(typing.get_args(kind)[0])
        _add(found, f"{path}[]", item, item_bounds, item_description)
    elif isinstance(kind, type) and issubclass(kind, BaseModel):
        found.update(rules(kind, f"{path}."))
