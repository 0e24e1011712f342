"""Unit tests of `batchinfer.endpoints.completions`: its line rules (line, code, param, exact message),
how a backend serves it and how its usage counts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchinfer.backends.base import BackendError
from batchinfer.endpoints.base import Usage
from batchinfer.endpoints.completions import Completions, CompletionsServer, check_completion_body
from batchinfer.wire.line_errors import LineError

COMPLETIONS = Completions()


def test_a_prompt_or_a_list_of_prompts_with_the_served_options_is_valid() -> None:
    assert check_completion_body({"model": "m", "prompt": "Once"}, 1) == []
    assert (
        check_completion_body(
            {
                "model": "m",
                "prompt": ["a", "b"],
                "max_tokens": 8,
                "temperature": 0,
                "top_p": 0.5,
                "stop": ["\n"],
                "seed": 3,
                "n": 1,
                "echo": False,
                "logprobs": None,
                "user": "u",
            },
            1,
        )
        == []
    )


@pytest.mark.parametrize(
    ("field", "value", "code", "message"),
    [
        (
            "n",
            2,
            "invalid_parameter",
            "Line 4: body.n must be 1 (one choice per prompt; n > 1 is not supported), got integer 2.",
        ),
        (
            "echo",
            True,
            "invalid_parameter",
            "Line 4: body.echo must be false (echo is not supported), got boolean true.",
        ),
        (
            "logprobs",
            5,
            "invalid_parameter",
            "Line 4: body.logprobs must be null (logprobs are not supported), got integer 5.",
        ),
        (
            "prompt",
            [1, 2],
            "invalid_parameter",
            "Line 4: body.prompt must be a non-empty string or a non-empty array of non-empty strings "
            "(token-id prompts are not supported), got array [1, 2].",
        ),
        (
            "prompt",
            [],
            "invalid_parameter",
            "Line 4: body.prompt must be a non-empty string or a non-empty array of non-empty strings "
            "(token-id prompts are not supported), got array [].",
        ),
        (
            "max_tokens",
            0,
            "invalid_parameter",
            "Line 4: body.max_tokens must be a positive integer or null, got integer 0.",
        ),
        (
            "temperature",
            3,
            "invalid_parameter",
            "Line 4: body.temperature must be a number from 0 to 2, got integer 3.",
        ),
        (
            "stream",
            True,
            "streaming_unsupported",
            'Line 4: "stream": true is not supported in a batch; remove it or set it to false.',
        ),
    ],
)
def test_each_unsupported_value_is_a_line_error_naming_its_field(
    field: str, value: object, code: str, message: str
) -> None:
    assert check_completion_body({"model": "m", "prompt": "p", field: value}, 4) == [
        LineError(code=code, message=message, param=f"body.{field}", line=4)
    ]


def test_a_missing_prompt_is_a_missing_required_parameter() -> None:
    assert check_completion_body({"model": "m"}, 2) == [
        LineError(
            code="missing_required_parameter",
            message="Line 2: body.prompt is missing.",
            param="body.prompt",
            line=2,
        )
    ]


def test_usage_counts_prompt_and_completion_tokens() -> None:
    assert COMPLETIONS.usage(
        {"usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    ) == Usage(5, 2)
    assert COMPLETIONS.usage({}) == Usage(0, 0)


def test_the_model_is_body_model() -> None:
    match = COMPLETIONS.pattern.fullmatch("/v1/completions")
    assert match is not None

    assert COMPLETIONS.model_of(match, {"model": "m"}) == "m"


class _Backend:
    concurrency_hint = 7

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def text_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return {"object": "text_completion"}

    def withdraw_waiting(self) -> int:
        return 3


def test_the_server_asks_the_backends_text_completion_and_keeps_its_hint_and_withdraw() -> None:
    backend = _Backend()
    server = COMPLETIONS.server(backend)

    assert isinstance(server, CompletionsServer)
    assert asyncio.run(server.chat_completion({"prompt": "p"})) == {"object": "text_completion"}
    assert backend.bodies == [{"prompt": "p"}]
    assert (server.concurrency_hint, server.withdraw_waiting()) == (7, 3)


def test_a_backend_without_text_completion_is_a_400() -> None:
    server = COMPLETIONS.server(object())

    with pytest.raises(BackendError) as raised:
        asyncio.run(server.chat_completion({"prompt": "p"}))

    assert (raised.value.status_code, raised.value.code, raised.value.message) == (
        400,
        "model_not_supported",
        "this model does not serve /v1/completions",
    )
    assert server.withdraw_waiting() == 0


def test_it_is_served_by_backends_that_list_it() -> None:
    assert COMPLETIONS.served_by(frozenset({"/v1/completions"})) is True
    assert COMPLETIONS.served_by(frozenset({"/v1/chat/completions", "/v1/responses"})) is False
