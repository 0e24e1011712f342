"""Unit tests of `batchinfer.wire.rules`: a model's field rules in words, from its constraints."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints

from batchinfer.wire.rules import Words, rules


class _Inner(BaseModel):
    name: str
    size: int
    note: str | None = None


class _Outer(BaseModel):
    flag: bool | None = None
    count: Annotated[int, Field(gt=0, le=10)] | None = None
    level: Annotated[int, Field(ge=1, le=5)]
    ratio: Annotated[float, Field(gt=0)] = 1.0
    share: Annotated[float, Field(gt=1e-6, le=1.0)] = 1.0
    label: Annotated[str, StringConstraints(min_length=1, max_length=8)]
    kind: Literal["A"]
    seconds: Annotated[int, Field(gt=0, le=60), Words("an integer number of seconds in {interval}")] = 1
    items: Annotated[list[_Inner], Field(min_length=1, max_length=1), Words("{rule} item")]
    ids: list[Annotated[int, Field(ge=0, le=9), Words("an id, {rule}")]]
    extra: dict[str, Any] | None = None
    anything: Any = None


def test_rules_word_each_field_from_its_type_and_bounds() -> None:
    assert rules(_Outer) == {
        "flag": "a boolean",
        "count": "an integer in (0, 10]",
        "level": "an integer in [1, 5]",
        "ratio": "a number greater than 0",
        "share": "a number in (1e-06, 1.0]",
        "label": "a string of 1 to 8 characters",
        "kind": '"A"',
        "seconds": "an integer number of seconds in (0, 60]",
        "items": "an array of exactly 1 item",
        "items[]": "an object with name and size",
        "items[].size": "an integer",
        "ids": "an array",
        "ids[]": "an id, an integer in [0, 9]",
        "extra": "an object",
    }
