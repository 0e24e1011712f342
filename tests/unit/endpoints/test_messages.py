"""Unit tests of `batchinfer.endpoints.messages`: a Message Batch line served as a chat completion, and
the answer as a `Message`."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from batchinfer.backends.base import BackendError
from batchinfer.endpoints.base import Usage
from batchinfer.endpoints.messages import Messages, MessagesServer, message_of
from batchinfer.wire.anthropic import MessageParams


def answer(text: str = "Hello", finish: str = "stop", **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc",
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


class Recording:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.concurrency_hint = 3

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return answer()


PARAMS = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}


def test_an_answer_becomes_a_message() -> None:
    params = MessageParams.model_validate(PARAMS)

    assert message_of(answer(), params) == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }


@pytest.mark.parametrize(
    ("finish", "choice", "reason", "sequence"),
    [
        ("length", {}, "max_tokens", None),
        ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),
        ("stop", {"matched_stop": "END"}, "stop_sequence", "END"),
        ("stop", {"stop_reason": "OTHER"}, "end_turn", None),
    ],
)
def test_the_stop_reason_follows_the_finish_reason(
    finish: str, choice: dict[str, Any], reason: str, sequence: str | None
) -> None:
    params = MessageParams.model_validate({**PARAMS, "stop_sequences": ["END"]})

    message = message_of(answer(finish=finish, **choice), params)

    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


def test_the_server_sends_the_chat_body_to_the_batch_backend() -> None:
    backend = Recording()
    server = MessagesServer(backend, lambda name: None)

    result = asyncio.run(server.chat_completion({"model": "m", "params": {**PARAMS, "system": "S"}}))

    assert result["content"] == [{"type": "text", "text": "Hello"}]
    assert backend.bodies == [
        {
            "model": "m",
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
            "max_tokens": 4,
        }
    ]
    assert server.concurrency_hint == 3


def test_a_request_for_another_model_runs_on_that_models_backend() -> None:
    batch_backend, other = Recording(), Recording()
    server = MessagesServer(batch_backend, {"n": other}.get)

    asyncio.run(server.chat_completion({"model": "m", "params": {**PARAMS, "model": "n"}}))

    assert (len(batch_backend.bodies), len(other.bodies)) == (0, 1)


@pytest.mark.parametrize(
    ("params", "message", "code"),
    [
        ({**PARAMS, "max_tokens": 0}, "params.max_tokens: Input should be greater than or equal to 1", None),
        ({**PARAMS, "tools": []}, "params: tools not supported by this service (text messages only)", None),
        ({**PARAMS, "model": "nope"}, "params.model: model 'nope' is not served here", "not_found_error"),
    ],
)
def test_params_it_cannot_serve_are_a_400(params: dict[str, Any], message: str, code: str | None) -> None:
    server = MessagesServer(Recording(), lambda name: None)

    with pytest.raises(BackendError) as caught:
        asyncio.run(server.chat_completion({"model": "m", "params": params}))

    assert (caught.value.status_code, caught.value.message) == (400, message)
    assert caught.value.code == (code or "invalid_request_error")


def test_the_endpoint_checks_only_the_lines_shape_and_counts_message_usage() -> None:
    endpoint = Messages()
    match = re.fullmatch(endpoint.pattern, "/v1/messages")

    assert endpoint.check_body({"model": "m", "params": {"anything": 1}}, 3) == []
    assert [e.param for e in endpoint.check_body({"model": "m"}, 3)] == ["body"]
    assert endpoint.model_of(match, {"model": "m", "params": {}}) == "m"
    assert endpoint.usage({"usage": {"input_tokens": 5, "output_tokens": 2}}) == Usage(5, 2)
    assert endpoint.listed is False
