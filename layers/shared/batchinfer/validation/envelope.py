"""The request envelope of a batch input line: `{"custom_id", "method": "POST", "url", "body"}`
(OpenAI batch input format; unknown top-level keys are ignored), and the words of its errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from batchinfer.wire.chat import NonEmptyStr
from batchinfer.wire.line_errors import LineError, line_errors
from batchinfer.wire.messages import quote
from batchinfer.wire.openai import CHAT_ENDPOINT

__all__ = [
    "ENVELOPE_EXPECTED",
    "PLAIN_ENVELOPE_FIELDS",
    "SHOWN_KEYS",
    "Envelope",
    "envelope_errors",
    "plain_envelope",
]


class Envelope(BaseModel):
    """A request line of the OpenAI batch input format; unknown top-level keys are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    custom_id: NonEmptyStr
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


ENVELOPE_EXPECTED = {
    "custom_id": "a non-empty string",
    "method": '"POST"',
    "url": f'a string such as "{CHAT_ENDPOINT}"',
    "body": "a JSON object",
}
# The fields `plain_envelope` checks: every field of `Envelope` (tests/unit/validation/test_fast_path.py).
PLAIN_ENVELOPE_FIELDS = frozenset({"custom_id", "method", "url", "body"})
# A line's unexpected keys named in its message, at most (the rest counted): messages stay short.
SHOWN_KEYS = 5


def plain_envelope(obj: dict[str, Any]) -> bool:
    """True only for a line that `Envelope` accepts (False says nothing)."""
    custom_id, method = obj.get("custom_id"), obj.get("method")
    return (
        type(custom_id) is str
        and custom_id != ""
        and type(method) is str
        and method == "POST"
        and type(obj.get("url")) is str
        and type(obj.get("body")) is dict
    )


def envelope_errors(obj: dict[str, Any], n: int) -> list[LineError]:
    """The errors of line `n`'s envelope `obj` (empty when `Envelope` accepts it). A missing `body`
    names the line's other keys: a body written at the top level is the usual cause."""
    try:
        Envelope.model_validate(obj)
    except ValidationError as exc:
        errors = line_errors(exc, n, "", ENVELOPE_EXPECTED)
    else:
        return []
    other = set(obj) - set(ENVELOPE_EXPECTED)
    if "body" in obj or not other:
        return errors
    named = sorted(other)
    keys = ", ".join(quote(k) for k in named[:SHOWN_KEYS])
    if len(named) > SHOWN_KEYS:
        keys += f" and {len(named) - SHOWN_KEYS:,} more"
    return [
        error.model_copy(update={"message": f"{error.message[:-1]} (the line has {keys})."})
        if error.param == "body"
        else error
        for error in errors
    ]
