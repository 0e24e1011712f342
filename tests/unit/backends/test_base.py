"""What every backend shares: the lone-surrogate check and the reading of a chat body with OpenAI's codes."""

from __future__ import annotations

from typing import Any

import pytest

from batchinfer.backends.base import BackendError, chat_request, require_utf8, unencodable_path


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"messages": [{"role": "user", "content": "fine \u00e9\u4f60\U0001f600 \x00 nul"}]}, None),
        ({"messages": [{"role": "user", "content": "broken \ud800 here"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "messages[0].content[0].text",
        ),
        ({"metadata": {"k\udc80": "v"}}, "metadata.k\udc80"),
        ({"stop": ["ok", "\ud83d"]}, "stop[1]"),
    ],
)
def test_unencodable_path_points_at_the_first_lone_surrogate(body: dict[str, Any], path: str | None) -> None:
    assert unencodable_path(body) == path


def test_require_utf8_raises_invalid_encoding() -> None:
    with pytest.raises(BackendError) as caught:
        require_utf8({"messages": [{"role": "user", "content": "broken \ud800 here"}]})

    error = caught.value
    assert (error.status_code, error.code, error.param, error.retryable) == (
        400,
        "invalid_encoding",
        "messages[0].content",
        False,
    )
    assert error.body() == {
        "error": {
            "message": "Invalid value at 'messages[0].content': the string contains a lone UTF-16 surrogate "
            "and is not valid Unicode text.",
            "type": "invalid_request_error",
            "param": "messages[0].content",
            "code": "invalid_encoding",
        }
    }


@pytest.mark.parametrize(
    ("body", "unsupported_by", "code", "param", "message"),
    [
        (
            {"messages": [{"role": "user", "content": "\udfff"}]},
            None,
            "invalid_encoding",
            "messages[0].content",
            (
                "Invalid value at 'messages[0].content': the string contains a lone UTF-16 surrogate "
                "and is not valid Unicode text."
            ),
        ),
        (
            {"messages": []},
            None,
            "invalid_value",
            "messages",
            "Invalid value for 'messages': List should have at least 1 item after validation, not 0.",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "presence_penalty": 1},
            "Y models",
            "unsupported_parameter",
            "presence_penalty",
            "'presence_penalty' is not supported by Y models.",
        ),
    ],
)
def test_chat_request_raises_a_400_with_the_code_of_the_first_problem(
    body: dict[str, Any], unsupported_by: str | None, code: str, param: str, message: str
) -> None:
    with pytest.raises(BackendError) as caught:
        chat_request(body, unsupported_by=unsupported_by)

    error = caught.value
    assert (error.status_code, error.code, error.param, error.message, error.type, error.retryable) == (
        400,
        code,
        param,
        message,
        "invalid_request_error",
        False,
    )


def test_chat_request_lets_penalties_pass_for_a_model_that_honours_them() -> None:
    request = chat_request({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 1})

    assert request.presence_penalty == 1
