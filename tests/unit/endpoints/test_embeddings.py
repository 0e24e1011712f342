"""The `/v1/embeddings` line rules: each with its line number, code, param and exact message."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchinfer.backends.base import BackendError
from batchinfer.endpoints.embeddings import Embeddings, check_embeddings_body
from batchinfer.endpoints.registry import endpoint_for
from batchinfer.wire.line_errors import LineError


def errors(body: dict[str, Any], line: int = 7) -> list[dict[str, Any]]:
    return [error.model_dump() for error in check_embeddings_body(body, line)]


@pytest.mark.parametrize(
    "value",
    ["a text", ["one", "two"], [101, 7592, 102], [[101, 102], [7592]], ["x"] * 2048],
)
def test_every_input_shape_of_openai_is_valid(value: Any) -> None:
    # Given / When / Then
    assert errors({"model": "m", "input": value, "encoding_format": "base64", "user": "u"}) == []


def test_more_than_2048_inputs_in_a_line_is_an_error_naming_the_line() -> None:
    # Given a line of 2,049 strings
    body = {"model": "m", "input": ["x"] * 2049}

    # When / Then
    assert errors(body) == [
        LineError(
            code="invalid_parameter",
            message="Line 7: body.input has 2049 inputs; the limit is 2048 inputs per request.",
            param="body.input",
            line=7,
        ).model_dump()
    ]


@pytest.mark.parametrize("value", ["", [], [""], [[]], [-1], {"text": "x"}])
def test_an_empty_or_malformed_input_is_an_invalid_parameter(value: Any) -> None:
    # Given / When
    [error] = errors({"model": "m", "input": value}, line=3)

    # Then
    assert error["code"] == "invalid_parameter"
    assert error["param"] == "body.input"
    assert error["line"] == 3
    assert error["message"].startswith("Line 3: body.input must be a non-empty string, an array of 1 to 2048")


def test_a_missing_input_and_a_bad_encoding_format_are_reported_together() -> None:
    # Given / When / Then
    assert errors({"model": "m", "encoding_format": "int8", "dimensions": 0}) == [
        {
            "code": "missing_required_parameter",
            "message": "Line 7: body.input is missing.",
            "param": "body.input",
            "line": 7,
        },
        {
            "code": "invalid_parameter",
            "message": 'Line 7: body.encoding_format must be "float" or "base64", got string "int8".',
            "param": "body.encoding_format",
            "line": 7,
        },
        {
            "code": "invalid_parameter",
            "message": "Line 7: body.dimensions must be a positive integer or null, got integer 0.",
            "param": "body.dimensions",
            "line": 7,
        },
    ]


def test_the_endpoint_counts_inputs_and_input_tokens_only() -> None:
    # Given the registered endpoint
    endpoint = endpoint_for("/v1/embeddings")

    # When / Then
    assert isinstance(endpoint, Embeddings)
    assert endpoint.max_batch_inputs == 50_000
    assert [endpoint.inputs({"input": value}) for value in ("a", ["a", "b"], [1, 2, 3], [[1], [2]])] == [
        1,
        2,
        1,
        2,
    ]
    usage = endpoint.usage({"usage": {"prompt_tokens": 12, "total_tokens": 12}})
    assert (usage.input_tokens, usage.output_tokens) == (12, 0)


def test_a_backend_without_embeddings_answers_each_line_with_a_400() -> None:
    # Given the endpoint's server on a chat-only backend
    server = Embeddings().server(object())

    # When / Then
    with pytest.raises(BackendError) as caught:
        asyncio.run(server.chat_completion({"model": "chat-only", "input": "a"}))
    assert (caught.value.status_code, caught.value.code, caught.value.param, caught.value.message) == (
        400,
        "invalid_model",
        "model",
        "The model 'chat-only' does not serve /v1/embeddings.",
    )
