"""Bedrock embeddings through botocore's Stubber: InvokeModel requests for Titan Text Embeddings V2
and Cohere Embed checked against the real API model, their answers as OpenAI embeddings bodies."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from batchinfer.backends.base import BackendError
from batchinfer.backends.bedrock import BedrockBackend
from batchinfer.backends.registry import ModelRegistry

TITAN = "amazon.titan-embed-text-v2:0"
COHERE = "cohere.embed-english-v3"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def stubbed(model_id: str) -> Iterator[tuple[BedrockBackend, Stubber]]:
    registry = ModelRegistry.from_dict(
        {"models": {"emb": {"backend": "bedrock", "model_id": model_id, "region": "us-east-1"}}}
    )
    backend = registry.backend("emb")
    assert isinstance(backend, BedrockBackend)
    with Stubber(backend.client) as stubber:
        yield backend, stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def titan(aws_env: None) -> Iterator[tuple[BedrockBackend, Stubber]]:
    yield from stubbed(TITAN)


@pytest.fixture
def cohere(aws_env: None) -> Iterator[tuple[BedrockBackend, Stubber]]:
    yield from stubbed(COHERE)


def invoked(model_id: str, body: dict[str, Any], answer: dict[str, Any], tokens: int) -> tuple[Any, ...]:
    data = json.dumps(answer).encode()
    response = {
        "body": StreamingBody(io.BytesIO(data), len(data)),
        "contentType": "application/json",
        "ResponseMetadata": {"HTTPHeaders": {"x-amzn-bedrock-input-token-count": str(tokens)}},
    }
    expected = {
        "modelId": model_id,
        "body": json.dumps(body),
        "contentType": "application/json",
        "accept": "application/json",
    }
    return "invoke_model", response, expected


def embed(backend: BedrockBackend, **body: Any) -> dict[str, Any]:
    return asyncio.run(backend.embeddings({"model": "emb", **body}))


def test_titan_is_invoked_once_per_input_with_dimensions_and_normalize(
    titan: tuple[BedrockBackend, Stubber],
) -> None:
    # Given Titan answers two calls
    backend, stubber = titan
    for text, vector, count in (("a b", [0.6, 0.8], 2), ("c", [1.0, 0.0], 1)):
        request = {"inputText": text, "dimensions": 256, "normalize": True}
        stubber.add_response(
            *invoked(TITAN, request, {"embedding": vector, "inputTextTokenCount": count}, count)
        )

    # When
    body = embed(backend, input=["a b", "c"], dimensions=256)

    # Then
    assert backend.serves == frozenset({"/v1/embeddings"})
    assert body == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.6, 0.8]},
            {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]},
        ],
        "model": "emb",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }


def test_cohere_is_invoked_with_all_texts_and_its_header_counts_tokens(
    cohere: tuple[BedrockBackend, Stubber],
) -> None:
    # Given Cohere answers one call for both texts
    backend, stubber = cohere
    request = {"texts": ["a", "b"], "input_type": "search_document"}
    stubber.add_response(*invoked(COHERE, request, {"embeddings": [[0.5], [0.25]], "id": "x"}, 4))

    # When
    body = embed(backend, input=["a", "b"], encoding_format="float")

    # Then
    assert [item["embedding"] for item in body["data"]] == [[0.5], [0.25]]
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


def test_what_bedrock_cannot_take_is_a_400_before_any_call(
    titan: tuple[BedrockBackend, Stubber], cohere: tuple[BedrockBackend, Stubber]
) -> None:
    # Given / When / Then
    cases = [
        (
            titan[0],
            {"input": "a", "dimensions": 300},
            f"dimensions must be one of 256, 512, 1024 for {TITAN}, got 300.",
        ),
        (cohere[0], {"input": "a", "dimensions": 256}, f"{COHERE} does not support 'dimensions'."),
        (
            titan[0],
            {"input": [1, 2]},
            "Bedrock embedding models take text: give input as strings, not token ids.",
        ),
    ]
    for backend, body, message in cases:
        with pytest.raises(BackendError) as caught:
            embed(backend, **body)
        assert (caught.value.status_code, caught.value.message) == (400, message)


def test_a_throttled_call_is_a_retryable_429(titan: tuple[BedrockBackend, Stubber]) -> None:
    # Given
    backend, stubber = titan
    stubber.add_client_error(
        "invoke_model",
        service_error_code="ThrottlingException",
        service_message="slow down",
        http_status_code=429,
    )

    # When
    with pytest.raises(BackendError) as caught:
        embed(backend, input="a")

    # Then
    assert (caught.value.status_code, caught.value.code, caught.value.retryable) == (
        429,
        "rate_limit_exceeded",
        True,
    )
