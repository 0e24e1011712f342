"""How error messages name a place and show a value, the same way in every message of the service.

loc_path(("messages", 0, "content"))   # 'messages[0].content': the `param` style of OpenAI errors
describe(17), describe("10")           # 'integer 17', 'string "10"': JSON type and text, shortened
quote("Model A ")                      # "'Model A '": spaces and case show
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["SHOWN_CHARS", "describe", "json_type", "loc_path", "quote", "safe"]

_JSON_TYPES: dict[type, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}
# Longest text of a value shown in a message; longer ones end in "...".
SHOWN_CHARS = 60


def json_type(value: Any) -> str:
    """The JSON type of a parsed value (`integer`, `array`, ...), else its Python type's name."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def safe(text: str) -> str:
    """`text` with lone surrogates escaped (`\\ud800`): messages end up in UTF-8 JSON, which cannot
    carry them."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _shorten(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def loc_path(loc: Iterable[int | str]) -> str:
    """A pydantic error location as a path: ("messages", 0, "content") -> `messages[0].content`
    (indices in brackets, names joined by dots; the `param` of OpenAI's errors)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(value: Any) -> str:
    """`integer 17`, `string "10"`, `boolean true`, `null`, ...: the JSON type and value, shortened to
    `SHOWN_CHARS`, surrogates escaped. A float beyond JSON's range (`1e400` parses as infinity) is
    `number inf (out of range)`; a value that is not JSON shows as its `repr`."""
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return f"number {value} (out of range)"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return f"{json_type(value)} {safe(_shorten(text))}"


def quote(text: str) -> str:
    """A string for a message: quoted so that spaces and case show, shortened, surrogates escaped."""
    return safe(repr(_shorten(text)))
