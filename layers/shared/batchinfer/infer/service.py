"""Serving token requests on a registry model: find its token backend, check, generate, answer.

Used by the `/v2` HTTP function (errors become `{"error": ...}` responses) and by the shard worker for
batches whose endpoint is `/v2/models/{model}/infer` (errors become OpenAI error envelopes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from batchinfer.backends.base import (
    BackendError,
    BackendNotImplemented,
    ModelNotFound,
    RegistryError,
    TokenBackend,
)
from batchinfer.backends.registry import ModelRegistry
from batchinfer.wire.kserve import InferError, infer_response, parse_infer_request
from batchinfer.wire.tokens import ModelLimits

__all__ = ["TokenRequests", "infer", "infer_batch_body", "model_limits", "token_backend"]


def token_backend(registry: ModelRegistry, name: str) -> TokenBackend:
    """The backend generating tokens for registry model `name`.

    Raises `InferError(404)` when the registry has no such model or its backend cannot take token ids
    (an OpenAI-compatible or Bedrock model only answers chat), `InferError(503)` when the backend cannot
    be built (for example its GGUF file is missing).
    """
    try:
        backend = registry.backend(name)
    except ModelNotFound:
        raise InferError(
            404, f"model '{name}' is not found; this server serves no model of that name"
        ) from None
    except (RegistryError, BackendNotImplemented) as exc:
        raise InferError(503, f"model '{name}' is not available: {exc}") from None
    if not isinstance(backend, TokenBackend):
        kind = registry.config(name).backend
        raise InferError(
            404,
            f"model '{name}' (backend {kind}) does not take token ids; token inference is "
            "served for llama_cpp and kserve_v2 models",
        )
    return backend


def _as_infer_error(error: BackendError) -> InferError:
    return InferError(error.status_code, error.message, param=error.param)


async def _infer(backend: TokenBackend, body: Any, time_limit_s: float | None) -> dict[str, Any]:
    # Request problems raise InferError; backend failures stay BackendErrors (status, retryable).
    limits = await backend.token_limits()
    request = parse_infer_request(body, limits)
    params = request.params
    if time_limit_s is not None and time_limit_s < params.timeout:
        params = dataclasses.replace(params, timeout=max(time_limit_s, 0.001))
    result = await backend.generate_tokens(request.input_ids, params)
    return infer_response(request, result)


async def model_limits(backend: TokenBackend) -> ModelLimits:
    """The backend's limits; a backend failure (the model does not load) is `InferError(5xx)`."""
    try:
        return await backend.token_limits()
    except BackendError as error:
        raise _as_infer_error(error) from None


async def infer(backend: TokenBackend, body: Any, *, time_limit_s: float | None = None) -> dict[str, Any]:
    """Answer one parsed request body with the KServe v2 response `{"id", "outputs"}`.

    `time_limit_s` (the caller's own deadline, e.g. the Lambda's remaining time) lowers the request's
    `parameters.timeout` when shorter. Raises `InferError`: 400 for a bad request (see
    `parse_infer_request`), 504 when the request timed out, the backend's status when it failed.
    """
    try:
        return await _infer(backend, body, time_limit_s)
    except BackendError as error:
        raise _as_infer_error(error) from None


async def infer_batch_body(backend: TokenBackend, body: dict[str, Any]) -> dict[str, Any]:
    """`infer` for a batch line. Raises `BackendError` (its OpenAI envelope goes to error.jsonl): a bad
    body is 400 `invalid_value` with `param` the field's path; backend failures pass through unchanged
    (so the worker retries the retryable ones)."""
    try:
        return await _infer(backend, body, None)
    except InferError as error:
        raise BackendError(error.status, error.message, code="invalid_value", param=error.param) from None


class TokenRequests:
    """The shard worker's view of a model for a token batch (`/v2/models/{model}/infer`).

    The worker sends every request body through `chat_completion(body)` (the `ChatBackend` protocol);
    for a token batch that body is a KServe v2 token request, answered by `infer_batch_body`.
    `concurrency_hint` is the model's own (see `ChatBackend`).
    """

    def __init__(self, backend: object) -> None:
        self.backend = backend
        self.concurrency_hint: int | None = getattr(backend, "concurrency_hint", None)

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one token-request line: the KServe v2 response, or `BackendError` (400 for a bad body or
        a model that takes no token ids; the backend's own errors otherwise)."""
        if not isinstance(self.backend, TokenBackend):
            raise BackendError(
                400,
                "this model does not take token ids; token batches are served for llama_cpp "
                "and kserve_v2 models",
                code="model_not_supported",
            )
        return await infer_batch_body(self.backend, body)
