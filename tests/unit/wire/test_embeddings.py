"""The embeddings wire models: OpenAI's response body, base64 vectors as little-endian float32."""

from __future__ import annotations

import base64
import struct

from batchinfer.wire.embeddings import EmbeddingsBody, EmbeddingsResponse, decode_base64, encode_base64


def test_base64_is_little_endian_float32_and_round_trips() -> None:
    # Given / When
    text = encode_base64([1.0, -0.5, 0.25])

    # Then
    assert base64.b64decode(text) == struct.pack("<3f", 1.0, -0.5, 0.25)
    assert decode_base64(text) == [1.0, -0.5, 0.25]


def test_the_response_body_is_openais() -> None:
    # Given / When
    body = EmbeddingsResponse.of("m", [[0.5, 0.25], [1.0, 0.0]], "float", prompt_tokens=9).model_dump()

    # Then
    assert body == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5, 0.25]},
            {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]},
        ],
        "model": "m",
        "usage": {"prompt_tokens": 9, "total_tokens": 9},
    }
    base64_body = EmbeddingsResponse.of("m", [[0.5]], "base64", prompt_tokens=1).model_dump()
    assert base64_body["data"][0]["embedding"] == encode_base64([0.5])


def test_inputs_are_listed_one_per_input() -> None:
    # Given / When / Then
    assert EmbeddingsBody.model_validate({"model": "m", "input": "a"}).inputs() == ["a"]
    assert EmbeddingsBody.model_validate({"model": "m", "input": [5, 6]}).inputs() == [[5, 6]]
    assert EmbeddingsBody.model_validate({"model": "m", "input": [[5], [6]]}).inputs() == [[5], [6]]
