"""The wording shared by every error message: a place as a path, a value as its JSON type and text."""

from __future__ import annotations

from typing import Any

import pytest

from batchinfer.wire.messages import describe, json_type, loc_path, quote, safe


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        ((), ""),
        (("model",), "model"),
        (("messages", 0, "content"), "messages[0].content"),
        (["inputs", 0, "data", 3], "inputs[0].data[3]"),
        (("models", "x", "n_ctx"), "models.x.n_ctx"),
    ],
)
def test_loc_path_writes_indices_in_brackets_and_names_with_dots(loc: Any, path: str) -> None:
    assert loc_path(loc) == path


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "boolean true"),
        (17, "integer 17"),
        (1.5, "number 1.5"),
        ("10", 'string "10"'),
        ([1, "a"], 'array [1, "a"]'),
        ({"a": None}, 'object {"a": null}'),
        ("x" * 100, 'string "' + "x" * 56 + "..."),
        ("a\ud800", 'string "a\\ud800"'),
        (float("inf"), "number inf (out of range)"),
        (float("-inf"), "number -inf (out of range)"),
        (b"\x00", "bytes b'\\x00'"),
    ],
)
def test_describe_gives_the_json_type_and_the_value_shortened(value: Any, text: str) -> None:
    assert describe(value) == text


def test_json_type_names_json_types_and_else_the_python_one() -> None:
    assert [json_type(v) for v in (None, False, 0, 0.0, "", [], {}, (1,))] == [
        "null",
        "boolean",
        "integer",
        "number",
        "string",
        "array",
        "object",
        "tuple",
    ]


def test_quote_shows_spaces_and_case_and_escapes_surrogates() -> None:
    assert quote("Model A ") == "'Model A '"
    assert quote("x" * 70) == "'" + "x" * 57 + "...'"
    assert quote("id\udc80") == "'id\\udc80'"


def test_safe_escapes_only_what_utf8_cannot_carry() -> None:
    assert safe("caf\u00e9 \ud83d") == "caf\u00e9 \\ud83d"
