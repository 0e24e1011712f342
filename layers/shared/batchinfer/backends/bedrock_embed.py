"""Embeddings on Amazon Bedrock through `InvokeModel`: Titan Text Embeddings V2 and Cohere Embed.

InvokeModel reference: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html

- Titan Text Embeddings V2 (`amazon.titan-embed-text-v2:0`): one input per call, body
  `{"inputText", "dimensions", "normalize": true}` (`dimensions` 256, 512 or 1024; default 1024), answer
  `{"embedding", "inputTextTokenCount"}`.
- Cohere Embed (`cohere.embed-english-v3`, `cohere.embed-multilingual-v3`): up to 96 texts per call,
  body `{"texts", "input_type": "search_document"}`, answer `{"embeddings"}`; no `dimensions`. Its
  input tokens are the answer's `X-Amzn-Bedrock-Input-Token-Count` header.
Both take text only: token-id inputs are a 400. Errors are the caller's to map (`botocore` raises).
"""

from __future__ import annotations

import json
from typing import Any

from batchinfer.backends.base import BackendError
from batchinfer.wire.embeddings import EmbeddingsBody, EmbeddingsResponse

__all__ = ["TITAN_DIMENSIONS", "embeddings_model", "invoke_embeddings"]

TITAN_DIMENSIONS = (256, 512, 1024)
# Cohere Embed's limit of texts per InvokeModel call.
COHERE_TEXTS_PER_CALL = 96


def embeddings_model(model_id: str) -> str | None:
    """ "titan" or "cohere" for a Bedrock embedding model id (an inference profile's too), else None."""
    base = (
        model_id.split(".", 1)[1] if model_id.split(".", 1)[0] in {"us", "eu", "apac", "global"} else model_id
    )
    if base.startswith("amazon.titan-embed-text-v2"):
        return "titan"
    if base.startswith("cohere.embed-"):
        return "cohere"
    return None


def _texts(request: EmbeddingsBody) -> list[str]:
    inputs = request.inputs()
    if any(not isinstance(value, str) for value in inputs):
        raise BackendError(
            400,
            "Bedrock embedding models take text: give input as strings, not token ids.",
            code="invalid_value",
            param="input",
        )
    return [str(value) for value in inputs]


def _invoke(client: Any, model_id: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """One InvokeModel call: its JSON answer and the input tokens its header counts (0 if absent)."""
    answer = client.invoke_model(
        modelId=model_id, body=json.dumps(body), contentType="application/json", accept="application/json"
    )
    headers = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return json.loads(answer["body"].read()), int(headers.get("x-amzn-bedrock-input-token-count") or 0)


def _titan(client: Any, model_id: str, texts: list[str], dimensions: int | None) -> tuple[list[Any], int]:
    if dimensions is not None and dimensions not in TITAN_DIMENSIONS:
        raise BackendError(
            400,
            f"dimensions must be one of {', '.join(map(str, TITAN_DIMENSIONS))} for {model_id}, "
            f"got {dimensions}.",
            code="invalid_value",
            param="dimensions",
        )
    vectors, tokens = [], 0
    for text in texts:
        body = {"inputText": text, "dimensions": dimensions or 1024, "normalize": True}
        answer, _ = _invoke(client, model_id, body)
        vectors.append(answer["embedding"])
        tokens += int(answer.get("inputTextTokenCount") or 0)
    return vectors, tokens


def _cohere(client: Any, model_id: str, texts: list[str], dimensions: int | None) -> tuple[list[Any], int]:
    if dimensions is not None:
        raise BackendError(
            400, f"{model_id} does not support 'dimensions'.", code="invalid_value", param="dimensions"
        )
    vectors, tokens = [], 0
    for start in range(0, len(texts), COHERE_TEXTS_PER_CALL):
        chunk = texts[start : start + COHERE_TEXTS_PER_CALL]
        answer, counted = _invoke(client, model_id, {"texts": chunk, "input_type": "search_document"})
        vectors += answer["embeddings"]
        tokens += counted
    return vectors, tokens


def invoke_embeddings(client: Any, model_id: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """The `EmbeddingsResponse` dict of OpenAI embeddings `body` on Bedrock model `model_id` (blocking).

    Raises `BackendError(400)` for a model that embeds nothing, token-id inputs or an unsupported
    `dimensions`; botocore's errors pass through.
    """
    kind = embeddings_model(model_id)
    if kind is None:
        raise BackendError(
            400,
            f"The model '{name}' ({model_id}) does not serve /v1/embeddings.",
            code="invalid_model",
            param="model",
        )
    request = EmbeddingsBody.model_validate(body)
    run = _titan if kind == "titan" else _cohere
    vectors, tokens = run(client, model_id, _texts(request), request.dimensions)
    return EmbeddingsResponse.of(name, vectors, request.encoding_format, prompt_tokens=tokens).model_dump()
