"""Unit tests of `batchinfer.endpoints.chat` (its body checks are in tests/unit/validation/test_file.py)."""

from __future__ import annotations

import pytest

from batchinfer.endpoints.base import Usage
from batchinfer.endpoints.chat import ChatCompletions

CHAT = ChatCompletions()


@pytest.mark.parametrize(
    ("body", "model"), [({"model": "m"}, "m"), ({"model": ""}, None), ({"model": 3}, None), ({}, None)]
)
def test_the_model_is_body_model_when_a_non_empty_string(body: dict[str, object], model: str | None) -> None:
    match = CHAT.pattern.fullmatch("/v1/chat/completions")
    assert match is not None

    assert CHAT.model_of(match, body) == model


@pytest.mark.parametrize(
    ("result", "usage"),
    [
        ({"usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}, Usage(3, 2)),
        ({"usage": {"prompt_tokens": 4}}, Usage(4, 0)),
        ({"usage": None}, Usage(0, 0)),
        ({}, Usage(0, 0)),
    ],
)
def test_usage_counts_prompt_and_completion_tokens(result: dict[str, object], usage: Usage) -> None:
    assert CHAT.usage(result) == usage


def test_a_chat_backend_is_its_own_server() -> None:
    backend = object()

    assert CHAT.server(backend) is backend
