"""The Bedrock backend through botocore's Stubber: requests and answers are checked against the real
`bedrock-runtime` Converse shapes of botocore's service model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.stub import Stubber

from batchinfer.backends import BackendError, ModelRegistry
from batchinfer.backends.bedrock import BedrockBackend
from batchinfer.endpoints.registry import ENDPOINTS

MODEL_ID = "amazon.nova-micro-v1:0"


@pytest.fixture
def bedrock(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BedrockBackend, Stubber]]:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    registry = ModelRegistry.from_dict(
        {
            "models": {
                "nova": {
                    "backend": "bedrock",
                    "model_id": MODEL_ID,
                    "region": "us-east-1",
                    "default_max_tokens": 64,
                }
            }
        }
    )
    backend = registry.backend("nova")
    assert isinstance(backend, BedrockBackend)
    with Stubber(backend.client) as stubber:
        yield backend, stubber
        stubber.assert_no_pending_responses()


def answer(text: str, stop_reason: str = "end_turn", tokens: tuple[int, int] = (12, 3)) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": tokens[0], "outputTokens": tokens[1], "totalTokens": sum(tokens)},
        "metrics": {"latencyMs": 321},
        "ResponseMetadata": {"RequestId": "4f1c0f1e-0000-4000-8000-000000000001", "HTTPStatusCode": 200},
    }


def complete(backend: BedrockBackend, **body: Any) -> dict[str, Any]:
    return asyncio.run(backend.chat_completion({"model": "nova", **body}))


def test_chat_body_becomes_a_converse_call_and_its_answer_a_completion(
    bedrock: tuple[BedrockBackend, Stubber],
) -> None:
    backend, stubber = bedrock
    # Given Bedrock answers the exact Converse request the body maps to
    stubber.add_response(
        "converse",
        answer("Paris."),
        {
            "modelId": MODEL_ID,
            "system": [{"text": "Be brief."}, {"text": "Answer in English."}],
            "messages": [
                {"role": "user", "content": [{"text": "Capital of France?"}, {"text": "One word."}]},
                {"role": "assistant", "content": [{"text": "Which country?"}]},
                {"role": "user", "content": [{"text": "France."}]},
            ],
            "inferenceConfig": {"maxTokens": 20, "temperature": 0.2, "topP": 0.9, "stopSequences": ["\n\n"]},
        },
    )

    # When a chat body with two system messages and two consecutive user messages is sent
    out = complete(
        backend,
        max_tokens=20,
        temperature=0.2,
        top_p=0.9,
        stop="\n\n",
        seed=7,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "user", "content": [{"type": "text", "text": "One word."}]},
            {"role": "assistant", "content": "Which country?"},
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "France."},
        ],
    )

    # Then it is an OpenAI chat.completion
    created = out.pop("created")
    assert isinstance(created, int)
    assert out == {
        "id": "chatcmpl-4f1c0f1e-0000-4000-8000-000000000001",
        "object": "chat.completion",
        "model": "nova",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris.", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
        "system_fingerprint": None,
    }


def test_default_max_tokens_and_length_finish(bedrock: tuple[BedrockBackend, Stubber]) -> None:
    backend, stubber = bedrock
    stubber.add_response(
        "converse",
        answer("Once upon", "max_tokens", (5, 64)),
        {
            "modelId": MODEL_ID,
            "messages": [{"role": "user", "content": [{"text": "Tell a story."}]}],
            "inferenceConfig": {"maxTokens": 64},
        },
    )

    out = complete(backend, messages=[{"role": "user", "content": "Tell a story."}])

    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 64, "total_tokens": 69}


@pytest.mark.parametrize(
    ("code", "http_status", "expected"),
    [
        ("ThrottlingException", 429, (429, "rate_limit_exceeded", "requests", True)),
        ("ValidationException", 400, (400, "invalid_value", "invalid_request_error", False)),
        ("ModelTimeoutException", 408, (408, "timeout", "invalid_request_error", True)),
        ("ServiceUnavailableException", 503, (503, "server_error", "server_error", True)),
        ("AccessDeniedException", 403, (403, "access_denied", "invalid_request_error", False)),
        ("SomeNewException", 502, (502, "SomeNewException", "server_error", True)),
    ],
)
def test_converse_errors_map_to_backend_errors(
    bedrock: tuple[BedrockBackend, Stubber], code: str, http_status: int, expected: tuple[int, str, str, bool]
) -> None:
    backend, stubber = bedrock
    stubber.add_client_error(
        "converse", service_error_code=code, service_message="it failed", http_status_code=http_status
    )

    with pytest.raises(BackendError) as caught:
        complete(backend, messages=[{"role": "user", "content": "Hi"}])

    error = caught.value
    assert (error.status_code, error.code, error.type, error.retryable) == expected
    assert error.message == f"Bedrock {code}: it failed"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"presence_penalty": 0.5},
            "presence_penalty",
            "'presence_penalty' is not supported by Bedrock models.",
        ),
        (
            {"response_format": {"type": "json_object"}},
            "response_format",
            "response_format json_object is not supported by Bedrock models.",
        ),
        ({"n": 2}, "n", "Only n=1 is supported by this model."),
        (
            {"messages": [{"role": "assistant", "content": "Hello"}]},
            "messages",
            "Bedrock needs the first non-system message to be a user message.",
        ),
    ],
)
def test_what_converse_cannot_express_is_a_400_before_any_call(
    bedrock: tuple[BedrockBackend, Stubber],
    body: dict[str, Any],
    param: str,
    message: str,
) -> None:
    backend, _ = bedrock  # no response queued: a call would fail the test

    with pytest.raises(BackendError) as caught:
        complete(backend, **{"messages": [{"role": "user", "content": "Hi"}], **body})

    assert (caught.value.status_code, caught.value.param, caught.value.message, caught.value.retryable) == (
        400,
        param,
        message,
        False,
    )


# ---------------------------------------------------------------- /v1/responses, asked as chat

RESPONSES = ENDPOINTS["/v1/responses"]


def respond(backend: BedrockBackend, **body: Any) -> dict[str, Any]:
    return asyncio.run(RESPONSES.server(backend).chat_completion({"model": "nova", **body}))


def test_a_responses_body_is_one_converse_call_and_its_answer_a_response(
    bedrock: tuple[BedrockBackend, Stubber],
) -> None:
    backend, stubber = bedrock
    # Given Bedrock answers the exact Converse request the body maps to, cut at its token limit
    stubber.add_response(
        "converse",
        answer("Paris is", stop_reason="max_tokens", tokens=(14, 2)),
        {
            "modelId": MODEL_ID,
            "system": [{"text": "Be brief."}, {"text": "Answer in English."}],
            "messages": [
                {"role": "user", "content": [{"text": "Capital of France?\nOne word."}]},
                {"role": "assistant", "content": [{"text": "Which country?"}]},
                {"role": "user", "content": [{"text": "France."}]},
            ],
            "inferenceConfig": {"maxTokens": 2, "temperature": 0.2, "topP": 0.9},
        },
    )

    # When a Responses body with instructions, a developer item and input_text parts is sent
    out = respond(
        backend,
        instructions="Be brief.",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Capital of France?"},
                    {"type": "input_text", "text": "One word."},
                ],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Which country?"}]},
            {"role": "developer", "content": "Answer in English."},
            {"type": "message", "role": "user", "content": "France."},
        ],
        max_output_tokens=2,
        temperature=0.2,
        top_p=0.9,
        metadata={"run": "1"},
    )

    # Then it is a Response, incomplete at max_output_tokens, counting Bedrock's tokens
    assert (out["object"], out["model"], out["status"], out["incomplete_details"]) == (
        "response",
        "nova",
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert out["output"][0]["content"] == [{"type": "output_text", "text": "Paris is", "annotations": []}]
    assert out["usage"] == {
        "input_tokens": 14,
        "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 16,
    }
    assert (out["instructions"], out["metadata"], out["max_output_tokens"]) == ("Be brief.", {"run": "1"}, 2)


def test_a_plain_input_string_is_one_user_message(bedrock: tuple[BedrockBackend, Stubber]) -> None:
    backend, stubber = bedrock
    stubber.add_response(
        "converse",
        answer("Hi."),
        {
            "modelId": MODEL_ID,
            "messages": [{"role": "user", "content": [{"text": "Hello"}]}],
            "inferenceConfig": {"maxTokens": 64},
        },
    )

    out = respond(backend, input="Hello")

    assert (out["status"], out["incomplete_details"], out["output"][0]["content"][0]["text"]) == (
        "completed",
        None,
        "Hi.",
    )


def test_a_json_schema_format_is_refused_by_bedrock_before_any_call(
    bedrock: tuple[BedrockBackend, Stubber],
) -> None:
    backend, _ = bedrock

    with pytest.raises(BackendError) as raised:
        respond(backend, input="x", text={"format": {"type": "json_schema", "name": "n", "schema": {}}})

    assert (raised.value.status_code, raised.value.code, raised.value.param, raised.value.message) == (
        400,
        "unsupported_parameter",
        "response_format",
        "response_format json_object is not supported by Bedrock models.",
    )
