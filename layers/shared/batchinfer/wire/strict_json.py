"""Strict JSON (RFC 8259): the one loader of request bodies and batch input lines.

Python's `json` accepts more than RFC 8259 and fails in ways that are not parse errors:
- the literals `NaN`, `Infinity` and `-Infinity` parse as floats (§6 has no such numbers), and a
  number beyond a double's range (`1e999`) as infinity, which no JSON writer can send on;
- an integer of more than 4300 digits raises a plain `ValueError` (CPython's limit on int-string
  conversion, `sys.get_int_max_str_digits()`), deep nesting a `RecursionError`;
- bytes are decoded by guessing UTF-16/32 and stripping a BOM (§8.1: JSON exchanged between systems
  MUST be UTF-8).
`loads` turns each of these into a `JsonError` and also refuses values nested deeper than
`MAX_JSON_DEPTH` (§9 lets a parser limit nesting).

Why not a library: orjson (the batch validator's fast path) is strict but rejects lone surrogate
escapes (`"\\ud800"`), which are valid JSON that one batch line may carry without failing the file,
and it gives no line and column; other parsers are either lax in the same ways as `json` or slower.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable
from enum import StrEnum
from functools import cache
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JsonError", "JsonErrorKind", "loads", "nested_deeper_than"]

# JSON values nested deeper than this are refused: far beyond any real request (an OpenAI body with a
# deep `response_format` schema is ~30 levels), and far below Python's recursion limit, which the code
# that walks or serialises a value (pydantic messages, `json.dumps`, the token protocol's checks)
# would otherwise hit at ~1000 levels.
MAX_JSON_DEPTH = 128
TOO_DEEP = f"nested too deeply (more than {MAX_JSON_DEPTH} levels)"
_BOM = "\ufeff"


class JsonErrorKind(StrEnum):
    """Which rule a text broke."""

    SYNTAX = "syntax"  # not JSON at all (json's own errors, a byte order mark)
    ENCODING = "encoding"  # bytes that are not UTF-8
    NOT_A_NUMBER = "not_a_number"  # NaN, Infinity, -Infinity
    NOT_FINITE = "not_finite"  # a number beyond a double's range, e.g. 1e999
    LONG_NUMBER = "long_number"  # an integer beyond Python's int-string conversion limit
    TOO_DEEP = "too_deep"  # more than MAX_JSON_DEPTH nested arrays/objects


class JsonError(ValueError):
    """A text that is not strict JSON.

    `msg` says why (`Expecting value`, `NaN is not a JSON number`, `a number has more than 4300
    digits`, `nested too deeply (more than 128 levels)`, the UTF-8 codec's sentence); `kind` is the
    rule; `pos` is where, when there is one place: the character offset of a syntax error (then
    `lineno` and `colno`, 1-based, too) or the byte offset of invalid UTF-8. `token` is the literal of
    a `NOT_A_NUMBER` error. `str()` is `msg`, followed by `: line L column C (char P)` for a syntax
    error, as `json.JSONDecodeError` says it.
    """

    def __init__(
        self,
        msg: str,
        kind: JsonErrorKind,
        pos: int | None = None,
        *,
        lineno: int | None = None,
        colno: int | None = None,
        token: str | None = None,
    ) -> None:
        where = f": line {lineno} column {colno} (char {pos})" if lineno is not None else ""
        super().__init__(msg + where)
        self.msg, self.kind, self.pos = msg, kind, pos
        self.lineno, self.colno, self.token = lineno, colno, token


def _reject_constant(literal: str) -> Any:
    raise JsonError(f"{literal} is not a JSON number", JsonErrorKind.NOT_A_NUMBER, token=literal)


def _reject_overflow(literal: str) -> Any:
    raise JsonError(
        f"the number {literal[:40]} is beyond the range of a double (it would be infinity)",
        JsonErrorKind.NOT_FINITE,
        token=literal[:40],
    )


@cache
def _decoder(non_finite: Callable[[str], Any] | None) -> json.JSONDecoder:
    # One decoder per option: `json.loads(text, parse_constant=...)` would build one per call.
    on_overflow = non_finite or _reject_overflow

    def finite_float(literal: str) -> Any:
        value = float(literal)
        return value if math.isfinite(value) else on_overflow(literal)

    return json.JSONDecoder(parse_constant=non_finite or _reject_constant, parse_float=finite_float)


def loads(data: str | bytes, *, non_finite: Callable[[str], Any] | None = None) -> Any:
    """The value of the JSON text `data` (bytes must be UTF-8), or `JsonError`.

    NaN/Infinity literals raise `JsonError(NOT_A_NUMBER)` and numbers beyond a double's range
    `JsonError(NOT_FINITE)`, unless `non_finite` is given: then each such literal parses as
    `non_finite(literal)` (a marker, so the caller can name the field holding it).
    """
    if isinstance(data, (bytes, bytearray)):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonError(str(exc), JsonErrorKind.ENCODING, exc.start) from None
    else:
        text = data
    if text.startswith(_BOM):  # what `json.loads` says; `JSONDecoder.decode` would say "Expecting value"
        raise JsonError(
            "Unexpected UTF-8 BOM (decode using utf-8-sig)", JsonErrorKind.SYNTAX, 0, lineno=1, colno=1
        )
    try:
        value = _decoder(non_finite).decode(text)
    except JsonError:
        raise
    except json.JSONDecodeError as exc:
        raise JsonError(exc.msg, JsonErrorKind.SYNTAX, exc.pos, lineno=exc.lineno, colno=exc.colno) from None
    except RecursionError:
        raise JsonError(TOO_DEEP, JsonErrorKind.TOO_DEEP) from None
    except ValueError:  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        raise JsonError(
            f"a number has more than {sys.get_int_max_str_digits()} digits", JsonErrorKind.LONG_NUMBER
        ) from None
    # The count of brackets bounds the depth: only a text with many of them needs the walk.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and nested_deeper_than(value):
        raise JsonError(TOO_DEEP, JsonErrorKind.TOO_DEEP)
    return value


def nested_deeper_than(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the parsed JSON `value` has more than `limit` arrays/objects nested in one another.

    `[]` and `{}` are 1 level, `[[1]]` is 2, a scalar is 0. Iterative: any depth is safe to check.
    """
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
