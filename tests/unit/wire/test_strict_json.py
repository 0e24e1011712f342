"""The one strict JSON loader: RFC 8259 or a `JsonError` saying which rule broke, and where."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from batchinfer.wire.strict_json import MAX_JSON_DEPTH, JsonError, JsonErrorKind, loads, nested_deeper_than

# The deepest value accepted: MAX_JSON_DEPTH arrays in one another.
DEEPEST = functools.reduce(lambda value, _: [value], range(MAX_JSON_DEPTH - 1), [])


def error(data: str | bytes, **options: Any) -> JsonError:
    with pytest.raises(JsonError) as caught:
        loads(data, **options)
    return caught.value


@pytest.mark.parametrize(
    ("data", "value"),
    [
        ('{"a": [1, 2.5, "x", null, true]}', {"a": [1, 2.5, "x", None, True]}),
        (b'{"caf\xc3\xa9": "\\ud800"}', {"caf\u00e9": "\ud800"}),  # a lone surrogate escape is valid JSON
        ("1" * 4300, int("1" * 4300)),
        ("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, DEEPEST),
    ],
)
def test_json_parses_as_python_json_does(data: str | bytes, value: Any) -> None:
    assert loads(data) == value


SYNTAX, ENCODING, NAN, LONG, DEEP = (
    JsonErrorKind.SYNTAX,
    JsonErrorKind.ENCODING,
    JsonErrorKind.NOT_A_NUMBER,
    JsonErrorKind.LONG_NUMBER,
    JsonErrorKind.TOO_DEEP,
)
BAD_BYTE = "'utf-8' codec can't decode byte 0xff in position {}: invalid start byte"
TOO_DEEP = "nested too deeply (more than 128 levels)"


OVERFLOW = "the number {} is beyond the range of a double (it would be infinity)"


@pytest.mark.parametrize(
    ("data", "kind", "msg", "pos", "text"),
    [
        ("[1,", SYNTAX, "Expecting value", 3, "Expecting value: line 1 column 4 (char 3)"),
        ('{"a":\n x}', SYNTAX, "Expecting value", 7, "Expecting value: line 2 column 2 (char 7)"),
        (
            "\ufeff{}",
            SYNTAX,
            "Unexpected UTF-8 BOM (decode using utf-8-sig)",
            0,
            "Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)",
        ),
        (b'{"a": "\xff"}', ENCODING, BAD_BYTE.format(7), 7, BAD_BYTE.format(7)),
        # UTF-16 is not guessed: JSON exchanged between systems is UTF-8.
        (b"\xff\xfe{\x00}\x00", ENCODING, BAD_BYTE.format(0), 0, BAD_BYTE.format(0)),
        ('{"a": NaN}', NAN, "NaN is not a JSON number", None, "NaN is not a JSON number"),
        ("[-Infinity]", NAN, "-Infinity is not a JSON number", None, "-Infinity is not a JSON number"),
        ("[1e999]", JsonErrorKind.NOT_FINITE, OVERFLOW.format("1e999"), None, OVERFLOW.format("1e999")),
        (
            '{"t": -2.5E+400}',
            JsonErrorKind.NOT_FINITE,
            OVERFLOW.format("-2.5E+400"),
            None,
            OVERFLOW.format("-2.5E+400"),
        ),
        ("1" * 4301, LONG, "a number has more than 4300 digits", None, "a number has more than 4300 digits"),
        ("[" * 129 + "]" * 129, DEEP, TOO_DEEP, None, TOO_DEEP),
        ("[" * 100_000 + "]" * 100_000, DEEP, TOO_DEEP, None, TOO_DEEP),  # beyond the recursion limit
    ],
)
def test_what_is_not_strict_json_is_a_json_error(
    data: str | bytes, kind: JsonErrorKind, msg: str, pos: int | None, text: str
) -> None:
    found = error(data)

    assert (found.kind, found.msg, found.pos, str(found)) == (kind, msg, pos, text)
    assert isinstance(found, ValueError)


def test_a_syntax_error_has_its_line_and_column() -> None:
    found = error('{\n  "a": 1,\n  }')

    assert (found.lineno, found.colno, found.pos) == (3, 3, 14)


def test_a_not_a_number_error_names_the_literal() -> None:
    assert error('{"t": Infinity}').token == "Infinity"


def test_non_finite_parses_the_literals_as_the_caller_says() -> None:
    value = loads('{"a": [NaN, -Infinity, 1e999, 1e308]}', non_finite=lambda literal: f"<{literal}>")

    assert value == {"a": ["<NaN>", "<-Infinity>", "<1e999>", 1e308]}


def test_nested_deeper_than_counts_arrays_and_objects() -> None:
    assert nested_deeper_than(1, 0) is False
    assert nested_deeper_than([], 0) is True
    assert nested_deeper_than({"a": [[1]]}, 2) is True
    assert nested_deeper_than({"a": [[1]]}, 3) is False
