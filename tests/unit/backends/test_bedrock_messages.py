"""Bedrock's top_k fields through Converse, and Anthropic models served natively (`api:
anthropic_messages`: InvokeModel with the Messages body), through botocore's Stubber: requests and
answers are checked against the real `bedrock-runtime` shapes of botocore's service model."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from batchinfer.backends import BackendError, ModelRegistry, RegistryError
from batchinfer.backends.bedrock import BedrockBackend
from batchinfer.backends.config import bedrock_provider
from batchinfer.endpoints.messages import MessagesServer

CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def stubbed(model_id: str, **options: Any) -> Iterator[tuple[BedrockBackend, Stubber]]:
    config = {"backend": "bedrock", "model_id": model_id, "region": "us-east-1", **options}
    backend = ModelRegistry.from_dict({"models": {"claude": config}}).backend("claude")
    assert isinstance(backend, BedrockBackend)
    with Stubber(backend.client) as stubber:
        yield backend, stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def native() -> Iterator[tuple[BedrockBackend, Stubber]]:
    yield from stubbed(CLAUDE, api="anthropic_messages")


def converse_answer() -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "Hello"}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 3, "outputTokens": 1, "totalTokens": 4},
        "metrics": {"latencyMs": 5},
    }


def invoked(body: dict[str, Any], answer: dict[str, Any]) -> tuple[Any, ...]:
    data = json.dumps(answer).encode()
    response = {"body": StreamingBody(io.BytesIO(data), len(data)), "contentType": "application/json"}
    expected = {
        "modelId": CLAUDE,
        "body": json.dumps(body),
        "contentType": "application/json",
        "accept": "application/json",
    }
    return "invoke_model", response, expected


def claude_answer(stop_reason: str = "end_turn", stop_sequence: str | None = None) -> dict[str, Any]:
    return {
        "id": "msg_bdrk_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-3-5-haiku-20241022",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": 9, "output_tokens": 2},
    }


@pytest.mark.parametrize(
    ("model_id", "provider"),
    [
        (CLAUDE, "anthropic"),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "anthropic"),
        ("global.anthropic.claude-sonnet-4-20250514-v1:0", "anthropic"),
        ("arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-haiku-20240307-v1:0", "anthropic"),
        ("amazon.nova-micro-v1:0", "amazon"),
        ("meta.llama3-8b-instruct-v1:0", "meta"),
    ],
)
def test_the_provider_of_a_model_profile_or_arn(model_id: str, provider: str) -> None:
    assert bedrock_provider(model_id) == provider


@pytest.mark.parametrize(
    ("model_id", "fields"),
    [
        (CLAUDE, {"top_k": 5}),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", {"top_k": 5}),
        ("amazon.nova-micro-v1:0", {"inferenceConfig": {"topK": 5}}),
    ],
)
def test_top_k_goes_to_converse_as_the_model_s_own_request_field(
    model_id: str, fields: dict[str, Any]
) -> None:
    for backend, stubber in stubbed(model_id):
        # Given Converse answers the request with the model's own top_k field
        expected = {
            "modelId": model_id,
            "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
            "inferenceConfig": {"maxTokens": 8},
            "additionalModelRequestFields": fields,
        }
        stubber.add_response("converse", converse_answer(), expected)
        # When a chat body with top_k 5 is answered
        out = asyncio.run(backend.chat_completion({"messages": USER, "max_tokens": 8, "top_k": 5}))
        # Then it was sent
        assert out["choices"][0]["message"]["content"] == "Hello"


@pytest.mark.parametrize("top_k", [-1, 0])
def test_a_top_k_of_the_whole_vocabulary_sends_no_field(top_k: int) -> None:
    for backend, _ in stubbed("meta.llama3-8b-instruct-v1:0"):
        kwargs = backend.converse_request({"messages": USER, "max_tokens": 8, "top_k": top_k})
        assert kwargs == {
            "modelId": "meta.llama3-8b-instruct-v1:0",
            "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
            "inferenceConfig": {"maxTokens": 8},
        }


def test_top_k_on_a_model_without_the_field_is_a_400_before_any_call() -> None:
    for backend, _ in stubbed("meta.llama3-8b-instruct-v1:0"):
        with pytest.raises(BackendError) as caught:
            backend.converse_request({"messages": USER, "max_tokens": 8, "top_k": 5})
        error = caught.value
        assert (error.status_code, error.code, error.param) == (400, "unsupported_parameter", "top_k")
        assert error.message == (
            "'top_k' is not supported by Bedrock model meta.llama3-8b-instruct-v1:0 "
            "(Anthropic and Amazon Nova models only)."
        )


def test_anthropic_messages_is_refused_for_a_model_that_is_not_anthropic_s() -> None:
    config = {"backend": "bedrock", "model_id": "amazon.nova-micro-v1:0", "api": "anthropic_messages"}

    with pytest.raises(RegistryError) as caught:
        ModelRegistry.from_dict({"models": {"nova": config}})

    assert "api anthropic_messages needs an Anthropic model (anthropic.claude-...), not " in str(caught.value)
    assert "'amazon.nova-micro-v1:0'" in str(caught.value)


def test_a_message_batch_request_is_sent_as_its_messages_body(native: tuple[BedrockBackend, Stubber]) -> None:
    backend, stubber = native
    # Given Bedrock answers the params as sent, without model/metadata/service_tier
    params = {
        "model": "claude",
        "max_tokens": 16,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_k": 5,
        "metadata": {"user_id": "u1"},
        "service_tier": "auto",
    }
    sent = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_k": 5,
    }
    stubber.add_response(*invoked(sent, claude_answer("stop_sequence", "END")))

    # When the Message Batches server answers the request
    message = asyncio.run(MessagesServer(backend).chat_completion({"model": "claude", "params": params}))

    # Then its Message is Bedrock's, named as the request named the model
    assert message == {
        "id": "msg_bdrk_01",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
        "usage": {"input_tokens": 9, "output_tokens": 2},
    }


def test_a_chat_body_is_sent_as_a_messages_body_and_answered_as_chat(
    native: tuple[BedrockBackend, Stubber],
) -> None:
    backend, stubber = native
    sent = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "system": [{"type": "text", "text": "Be brief."}],
        "top_p": 0.9,
        "stop_sequences": ["END"],
        "top_k": 3,
    }
    stubber.add_response(*invoked(sent, claude_answer("max_tokens")))
    body = {
        "messages": [{"role": "system", "content": "Be brief."}, *USER],
        "max_tokens": 8,
        "top_p": 0.9,
        "stop": "END",
        "top_k": 3,
    }

    out = asyncio.run(backend.chat_completion(body))

    out.pop("created")
    assert out == {
        "id": "chatcmpl-bdrk_01",
        "object": "chat.completion",
        "model": "claude",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello", "refusal": None},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
        "system_fingerprint": None,
    }


def test_a_throttled_invoke_is_a_retryable_429(native: tuple[BedrockBackend, Stubber]) -> None:
    backend, stubber = native
    stubber.add_client_error("invoke_model", "ThrottlingException", "slow down", 429)
    params = {"model": "claude", "max_tokens": 4, "messages": USER}

    with pytest.raises(BackendError) as caught:
        asyncio.run(MessagesServer(backend).chat_completion({"model": "claude", "params": params}))

    assert (caught.value.status_code, caught.value.code, caught.value.retryable) == (
        429,
        "rate_limit_exceeded",
        True,
    )
