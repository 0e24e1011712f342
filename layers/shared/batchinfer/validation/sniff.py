"""What an input file is when it is not JSON Lines, and why a line is not JSON: the checks before a
line's envelope, shared by the upload's quick look (`jsonl_format_problem`) and `FileValidator`."""

from __future__ import annotations

import orjson

from batchinfer.wire import strict_json
from batchinfer.wire.strict_json import JsonError, JsonErrorKind

__all__ = [
    "FORMAT_CHECK_LINES",
    "TOO_DEEP",
    "containers",
    "foreign_encoding",
    "has_long_number",
    "json_reason",
    "jsonl_format_problem",
    "starts_array_of_objects",
]


# orjson parses a line ~4x faster than `strict_json` (Python's `json`), and whatever it accepts
# `strict_json` parses to the same value, except integers beyond 64 bits (orjson makes them floats):
# lines with 19 digits in a row go to `strict_json`. Whatever orjson rejects (NaN, 1e400, lone
# surrogates, bad UTF-8, a BOM, ...) also goes to `strict_json`, which accepts it or explains the error.
_DIGITS_ONLY = bytes(
    0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256)
)  # digits to "0", the rest to " "


def containers(data: bytes) -> int:
    """An upper bound of the nesting depth of the JSON text `data`: its count of `[` and `{` bytes."""
    return data.count(b"[") + data.count(b"{")


TOO_DEEP = f"it is {strict_json.TOO_DEEP}"


def json_reason(error: JsonError) -> str:
    """Why a line is not JSON, in the words these messages have always used."""
    if error.kind is JsonErrorKind.SYNTAX:
        return f"{error.msg} at column {error.colno}"
    if error.kind is JsonErrorKind.NOT_A_NUMBER:
        return f"{error.token} is not valid JSON (RFC 8259 has no NaN or Infinity)"
    if error.kind is JsonErrorKind.TOO_DEEP:
        return TOO_DEEP
    return error.msg


def has_long_number(data: bytes) -> bool:
    """Whether `data` has 19 digits in a row: an integer orjson may not parse as `strict_json` does."""
    return b"0000000000000000000" in data.translate(_DIGITS_ONLY)


def foreign_encoding(data: bytes) -> str | None:
    """Why `data` (the first non-blank line) is not UTF-8 text but UTF-16/32, or None."""
    boms = (
        (b"\xff\xfe\x00\x00", "a UTF-32 little-endian byte order mark (FF FE 00 00)"),
        (b"\x00\x00\xfe\xff", "a UTF-32 big-endian byte order mark (00 00 FE FF)"),
        (b"\xff\xfe", "a UTF-16 little-endian byte order mark (FF FE)"),
        (b"\xfe\xff", "a UTF-16 big-endian byte order mark (FE FF)"),
    )
    for bom, name in boms:
        if data.startswith(bom):
            return f"it starts with {name}"
    if b"\x00" in data:
        # ASCII text in UTF-16/32 interleaves NUL bytes; UTF-8 JSON never has a raw NUL.
        return "it has NUL bytes between characters, as UTF-16 or UTF-32 text does"
    return None


def starts_array_of_objects(data: bytes) -> bool:
    """Whether a first line opens a JSON array of objects: `[` alone (an indented array) or `[{...`."""
    head = data.strip(b" \t\r").removeprefix(b"\xef\xbb\xbf").lstrip(b" \t")
    return head == b"[" or (head[:1] == b"[" and head[1:].lstrip(b" \t")[:1] == b"{")


# How many non-blank lines `jsonl_format_problem` looks at.
FORMAT_CHECK_LINES = 5


def jsonl_format_problem(content: bytes, lines: int = FORMAT_CHECK_LINES) -> str | None:
    """Why `content` (a whole uploaded file, or its start) is not JSON Lines at all, or None.

    A quick check at upload (OpenAI answers "Invalid file format for Batch API. Must be .jsonl"):
    the file is UTF-16/32, its first non-blank line opens a JSON array of objects, or none of its
    first `lines` non-blank lines is a JSON object. A JSON Lines file with some bad lines passes:
    prepare reports each of those with its line number.
    """
    seen = 0
    first_reason = ""
    for number, raw in enumerate(content.split(b"\n", lines * 4), start=1):
        data = raw.removeprefix(b"\xef\xbb\xbf") if number == 1 else raw
        if not data.strip(b" \t\r"):
            continue
        if seen == 0:
            if reason := foreign_encoding(data):
                return f"the file is not UTF-8: {reason}. Save it as UTF-8 JSON Lines."
            if starts_array_of_objects(data):
                return (
                    "it is a JSON array; this must be JSON Lines (one request object per line), "
                    "without [ ] or commas."
                )
        seen += 1
        try:
            if type(orjson.loads(data)) is dict:
                return None
            first_reason = first_reason or f"line {number} is not a JSON object"
        except orjson.JSONDecodeError:
            first_reason = first_reason or f"line {number} is not valid JSON"
        if seen == lines:
            break
    if seen == 0:
        return None  # empty: prepare says so (`empty_file`)
    return (
        f"none of its first {seen} line(s) is a JSON object ({first_reason}); this must be JSON Lines "
        "(one request object per line)."
    )
