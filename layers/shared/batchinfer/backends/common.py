"""Checks every backend applies to a request body before sending it anywhere."""

from __future__ import annotations

from typing import Any

from batchinfer.backends.base import BackendError


def unencodable_path(value: Any, path: str = "") -> str | None:
    """The OpenAI-style path (`messages[0].content`) of the first string in `value` that is not valid
    Unicode, or None when every string (keys included) encodes as UTF-8.

    Such strings hold lone surrogates (`"\\ud800"`), which `json.loads` accepts from `\\u` escapes
    but which no UTF-8 encoder, tokenizer or HTTP body can carry.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "(body)"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            key_path = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and unencodable_path(key, key_path) is not None:
                return key_path
            found = unencodable_path(item, key_path)
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = unencodable_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def require_utf8(body: dict[str, Any]) -> None:
    """Raise `BackendError(400, code="invalid_encoding", param=<path>)` when a string of `body`
    cannot be encoded as UTF-8 (a lone surrogate); return None otherwise."""
    path = unencodable_path(body)
    if path is not None:
        raise BackendError(
            400,
            f"Invalid value at '{path}': the string contains a lone UTF-16 surrogate and is not valid "
            "Unicode text.",
            code="invalid_encoding",
            param=path,
        )
