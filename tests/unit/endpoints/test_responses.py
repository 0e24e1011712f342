"""Unit tests of `batchinfer.endpoints.responses`: its line rules (line, code, param, exact message),
how a backend serves it (natively, or as chat) and how its usage counts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchinfer.endpoints.base import Usage
from batchinfer.endpoints.responses import Responses, check_response_body
from batchinfer.wire.line_errors import LineError

RESPONSES = Responses()


def test_text_input_with_the_served_options_is_valid() -> None:
    assert check_response_body({"model": "m", "input": "Hi"}, 1) == []
    assert (
        check_response_body(
            {
                "model": "m",
                "input": [
                    {"role": "developer", "content": "Be brief."},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                    {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
                ],
                "instructions": "x",
                "max_output_tokens": 16,
                "temperature": 0,
                "top_p": 1,
                "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
                "metadata": {"k": "v"},
                "store": False,
                "tools": [],
                "user": "u",
            },
            1,
        )
        == []
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "tools",
            [{"type": "web_search"}],
            "Line 3: body.tools must be absent or empty (tools are not supported), "
            'got array [{"type": "web_search"}].',
        ),
        (
            "store",
            True,
            "Line 3: body.store must be false or absent (a batch stores no responses), got boolean true.",
        ),
        (
            "background",
            True,
            "Line 3: body.background must be false or absent (a batch runs in the background already), "
            "got boolean true.",
        ),
        (
            "previous_response_id",
            "resp_1",
            "Line 3: body.previous_response_id must be null or absent (a batch stores no responses to "
            'continue), got string "resp_1".',
        ),
        (
            "max_output_tokens",
            0,
            "Line 3: body.max_output_tokens must be a positive integer or null, got integer 0.",
        ),
        (
            "text",
            {"format": {"type": "xml"}},
            "Line 3: invalid body.text.format.type: Input should be 'text', 'json_object' or 'json_schema'; "
            'got string "xml".',
        ),
    ],
)
def test_each_unsupported_option_is_an_invalid_parameter_naming_it(
    field: str, value: object, message: str
) -> None:
    assert check_response_body({"model": "m", "input": "Hi", field: value}, 3) == [
        LineError(code="invalid_parameter", message=message, param=f"body.{field}", line=3)
    ]


def test_stream_is_streaming_unsupported() -> None:
    assert check_response_body({"model": "m", "input": "Hi", "stream": True}, 2) == [
        LineError(
            code="streaming_unsupported",
            message='Line 2: "stream": true is not supported in a batch; remove it or set it to false.',
            param="body.stream",
            line=2,
        )
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}],
            },
            "Line 5: body.input[0].content[1] is an image (input_image); only text is supported.",
        ),
        (
            {"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]},
            "Line 5: body.input[0].content[0] is a file (input_file); only text is supported.",
        ),
        (
            {"type": "function_call_output", "call_id": "c", "output": "o"},
            "Line 5: body.input[0] is a 'function_call_output' item; only message items are supported.",
        ),
    ],
)
def test_images_files_and_other_items_are_refused_naming_where(item: dict[str, Any], message: str) -> None:
    assert check_response_body({"model": "m", "input": [item]}, 5) == [
        LineError(code="invalid_parameter", message=message, param="body.input", line=5)
    ]


def test_missing_and_empty_input() -> None:
    assert check_response_body({"model": "m"}, 1) == [
        LineError(
            code="missing_required_parameter",
            message="Line 1: body.input is missing.",
            param="body.input",
            line=1,
        )
    ]
    assert check_response_body({"model": "m", "input": []}, 1) == [
        LineError(
            code="invalid_parameter",
            message="Line 1: body.input must be a non-empty string or a non-empty array of message items "
            "{role, content} with text content (input_text parts; images and files are not supported), "
            "got array [].",
            param="body.input",
            line=1,
        )
    ]


def test_usage_counts_input_and_output_tokens_not_chats_names() -> None:
    result = {"usage": {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}}

    assert RESPONSES.usage(result) == Usage(11, 4)
    assert RESPONSES.usage({"usage": {"prompt_tokens": 3, "completion_tokens": 2}}) == Usage(0, 0)


class _Chat:
    def __init__(self, finish_reason: str = "stop") -> None:
        self.bodies: list[dict[str, Any]] = []
        self.finish_reason = finish_reason

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return {
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi!"},
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
        }


class _Native(_Chat):
    async def create_response(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"object": "response", "native": body["input"]}


def test_a_backend_with_responses_answers_natively() -> None:
    backend = _Native()

    answer = asyncio.run(RESPONSES.server(backend).chat_completion({"model": "m", "input": "x"}))

    assert (answer, backend.bodies) == ({"object": "response", "native": "x"}, [])


def test_a_chat_backend_is_asked_the_request_as_chat_and_answers_a_response() -> None:
    backend = _Chat(finish_reason="length")
    body = {
        "model": "m",
        "input": "Hi",
        "instructions": "Be brief.",
        "max_output_tokens": 2,
        "metadata": {"k": "v"},
    }

    answer = asyncio.run(RESPONSES.server(backend).chat_completion(body))

    assert backend.bodies == [
        {
            "model": "m",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_completion_tokens": 2,
        }
    ]
    assert (answer["object"], answer["status"], answer["incomplete_details"]) == (
        "response",
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert answer["output"][0]["content"] == [{"type": "output_text", "text": "Hi!", "annotations": []}]
    assert answer["usage"]["input_tokens"] == 9 and answer["metadata"] == {"k": "v"}
