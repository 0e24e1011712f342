"""How error messages name a place and show a value, the same way in every message of the service.

loc_path(("messages", 0, "content"))   # 'messages[0].content': the `param` style of OpenAI errors
describe(17), describe("10")           # 'integer 17', 'string "10"': JSON type and text, shortened
quote("Model A ")                      # "'Model A '": spaces and case show
unknown_model("smollm", ["smollm2"])   # "model 'smollm' is not served ...; did you mean 'smollm2'? ..."
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["SHOWN_CHARS", "closest", "describe", "json_type", "loc_path", "quote", "safe", "unknown_model"]

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


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice `name` most likely meant: one equal but for case, else difflib's closest with a
    similarity ratio of at least 0.6 (`difflib.get_close_matches`' default); None when none is close."""
    choices = list(choices)
    folded = [c for c in choices if c.casefold() == name.casefold()]
    if folded:
        return folded[0]
    found = difflib.get_close_matches(name, choices, n=1)
    return found[0] if found else None


def unknown_model(model: str, served: Iterable[str]) -> str:
    """The sentence of `model_not_found`: the name, the closest served name if one is close, and
    where the served names are listed (`GET /v1/models`)."""
    best = closest(model, served)
    hint = f"did you mean {quote(best)}? " if best else ""
    return f"model {quote(model)} is not served by this deployment; {hint}GET /v1/models lists the models."
