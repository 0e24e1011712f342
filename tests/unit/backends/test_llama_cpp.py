"""The embedded backend's request checks, before any model runs (generation: tests/integration/backends)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchinfer.backends import BackendError, ModelRegistry

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2() -> Any:
    # Building the backend resolves the GGUF but loads nothing: these requests fail validation first.
    return ModelRegistry.from_dict({"models": {SMOLLM2: {"backend": "llama_cpp"}}}).backend(SMOLLM2)


def _user(text: str = "hi") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    ("body", "status", "code", "param", "message"),
    [
        ({}, 400, "missing_required_parameter", "messages", "Missing required parameter: 'messages'."),
        (
            {"messages": []},
            400,
            "invalid_value",
            "messages",
            "Invalid value for 'messages': List should have at least 1 item after validation, not 0.",
        ),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            400,
            "invalid_value",
            "messages[0].role",
            (
                "Invalid value for 'messages[0].role': "
                "Input should be 'system', 'developer', 'user' or 'assistant'."
            ),
        ),
        (
            {"messages": [{"role": "assistant", "content": None}]},
            400,
            "invalid_value",
            "messages[0].content",
            "Invalid value for 'messages[0].content': Input should be a valid string.",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "invalid_value",
            "messages[0].content",
            (
                "Invalid value for 'messages[0].content': "
                "content part 0 is not a text part; this model accepts text only."
            ),
        ),
        (
            {"messages": _user(), "max_tokens": 0},
            400,
            "invalid_value",
            "max_tokens",
            "Invalid value for 'max_tokens': Input should be greater than or equal to 1.",
        ),
        (
            {"messages": _user(), "temperature": 2.5},
            400,
            "invalid_value",
            "temperature",
            "Invalid value for 'temperature': Input should be less than or equal to 2.",
        ),
        (
            {"messages": _user(), "stop": ["a", "b", "c", "d", "e"]},
            400,
            "invalid_value",
            "stop",
            "Invalid value for 'stop': at most 4 stop sequences are allowed.",
        ),
        (
            {"messages": _user(), "n": 2},
            400,
            "unsupported_value",
            "n",
            "Only n=1 is supported by this model.",
        ),
        (
            {"messages": _user(), "logprobs": True},
            400,
            "unsupported_parameter",
            "logprobs",
            "logprobs are not supported by this model.",
        ),
        (
            {"messages": _user(), "tools": [{"type": "function", "function": {"name": "f"}}]},
            400,
            "unsupported_parameter",
            "tools",
            "'tools' are not supported by this model.",
        ),
        (
            {"messages": _user("broken \ud800 here")},
            400,
            "invalid_encoding",
            "messages[0].content",
            (
                "Invalid value at 'messages[0].content': the string contains a lone UTF-16 surrogate "
                "and is not valid Unicode text."
            ),
        ),
    ],
)
def test_llama_cpp_rejects_bad_bodies_before_generating(
    smollm2: Any,
    body: dict[str, Any],
    status: int,
    code: str,
    param: str,
    message: str,
) -> None:
    with pytest.raises(BackendError) as caught:
        asyncio.run(smollm2.chat_completion({"model": SMOLLM2, **body}))

    error = caught.value
    assert (error.status_code, error.code, error.param, error.message, error.retryable) == (
        status,
        code,
        param,
        message,
        False,
    )
    assert error.type == "invalid_request_error"


@pytest.mark.parametrize(("n_seq_max", "hint"), [(16, 20), (32, 40), (2, 3), (1, 2)])
def test_concurrency_hint_is_the_engines_sequences_and_a_quarter_more(n_seq_max: int, hint: int) -> None:
    backend = ModelRegistry.from_dict(
        {"models": {SMOLLM2: {"backend": "llama_cpp", "n_seq_max": n_seq_max}}}
    ).backend(SMOLLM2)

    assert backend.concurrency_hint == hint  # type: ignore[attr-defined]
