"""`/v1/embeddings`: OpenAI embeddings, served by backends that have an `embeddings` method.

Line urls are the template itself; the body is `wire.embeddings.EmbeddingsBody` (unknown fields pass
through), the model is `body.model`, the result a `wire.embeddings.EmbeddingsResponse` whose usage
counts input tokens only. A line holds at most 2,048 inputs and a batch at most 50,000 (OpenAI's
limits); what needs the model (an input longer than its context, `dimensions` on a model without
Matryoshka training) is answered by the backend as a per-line 400.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from batchinfer.backends.base import BackendError
from batchinfer.endpoints.base import Endpoint, Server, Usage
from batchinfer.wire.embeddings import (
    MAX_INPUTS_PER_BATCH,
    MAX_INPUTS_PER_REQUEST,
    RULES,
    EmbeddingsBody,
    EmbeddingsResponse,
    input_count,
)
from batchinfer.wire.line_errors import ErrorCode, LineError, line_errors
from batchinfer.wire.messages import describe
from batchinfer.wire.openai import EMBEDDINGS_ENDPOINT

__all__ = ["Embeddings", "EmbeddingsServer", "check_embeddings_body"]


def check_embeddings_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v1/embeddings` body (empty when valid); see `EmbeddingsBody`. An `input` array of
    more than `MAX_INPUTS_PER_REQUEST` items gets its own sentence."""
    value = body.get("input")
    if isinstance(value, list) and len(value) > MAX_INPUTS_PER_REQUEST and not isinstance(value[0], int):
        return [
            LineError(
                code=ErrorCode.INVALID_PARAMETER,
                message=f"Line {line}: body.input has {len(value)} inputs; the limit is "
                f"{MAX_INPUTS_PER_REQUEST} inputs per request.",
                param="body.input",
                line=line,
            )
        ]
    try:
        EmbeddingsBody.model_validate(body)
    except ValidationError as exc:
        found = {error.param: error for error in line_errors(exc, line, "body.", RULES)}
    else:
        return []
    if (error := found.get("body.input")) is not None and error.code == ErrorCode.INVALID_PARAMETER:
        # `input` is a union: pydantic reports each shape it is not; one sentence says what it may be.
        message = f"Line {line}: body.input must be {RULES['input']}, got {describe(value)}."
        found["body.input"] = error.model_copy(update={"message": message})
    return list(found.values())


class EmbeddingsServer:
    """Embeddings bodies answered by a backend's `embeddings(body)` (see the module docstring)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.concurrency_hint: int | None = getattr(backend, "concurrency_hint", None)

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The `EmbeddingsResponse` dict of one body. Raises `BackendError`: 400 `invalid_model` when
        the model's backend embeds nothing, else the backend's own errors."""
        embeddings = getattr(self.backend, "embeddings", None)
        if embeddings is None:
            raise BackendError(
                400,
                f"The model '{body.get('model')}' does not serve {EMBEDDINGS_ENDPOINT}.",
                code="invalid_model",
                param="model",
            )
        return await embeddings(body)


class Embeddings(Endpoint):
    """The embeddings endpoint (see the module docstring)."""

    template = EMBEDDINGS_ENDPOINT
    pattern = re.compile(re.escape(EMBEDDINGS_ENDPOINT))
    model_param = "body.model"
    body_model = EmbeddingsBody
    result_model = EmbeddingsResponse
    max_batch_inputs = MAX_INPUTS_PER_BATCH

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """See `check_embeddings_body`."""
        return check_embeddings_body(body, line)

    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        """`body.model` when it is a non-empty string."""
        model = body.get("model")
        return model if isinstance(model, str) and model else None

    def inputs(self, body: dict[str, Any]) -> int:
        """The inputs of a valid body (a string or a token-id list is one)."""
        return input_count(body)

    def server(self, backend: Any) -> Server:
        """An `EmbeddingsServer` on the backend."""
        return EmbeddingsServer(backend)

    def usage(self, result: dict[str, Any]) -> Usage:
        """`usage.prompt_tokens` in, nothing out."""
        usage = result.get("usage") or {}
        return Usage(input_tokens=int(usage.get("prompt_tokens") or 0), output_tokens=0)
