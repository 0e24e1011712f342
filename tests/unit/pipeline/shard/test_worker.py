"""The worker sends a batch's bodies by its endpoint: chat completions, or token inference."""

from __future__ import annotations

import asyncio

import pytest

from batchinfer.backends import BackendError, ModelRegistry
from batchinfer.infer.service import TokenRequests
from batchinfer.pipeline.shard.worker import for_endpoint

REGISTRY = ModelRegistry.from_dict(
    {"models": {"chat-only": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}}}
)
TOKEN_BODY = {
    "inputs": [{"name": "input0", "shape": [1], "datatype": "UINT32", "data": [5]}],
    "outputs": [{"name": "output0"}],
}


def test_chat_batches_call_the_backend_itself() -> None:
    backend = REGISTRY.backend("chat-only")

    assert for_endpoint(backend, "/v1/chat/completions") is backend


@pytest.mark.parametrize("endpoint", ["/v2/models/{model}/infer", "/v2/models/chat-only/infer"])
def test_token_batches_go_through_token_inference(endpoint: str) -> None:
    backend = REGISTRY.backend("chat-only")

    wrapped = for_endpoint(backend, endpoint)

    assert isinstance(wrapped, TokenRequests) and wrapped.backend is backend


def test_a_token_line_for_a_model_without_token_ids_is_a_400() -> None:
    wrapped = for_endpoint(REGISTRY.backend("chat-only"), "/v2/models/chat-only/infer")

    with pytest.raises(BackendError) as caught:
        asyncio.run(wrapped.chat_completion(TOKEN_BODY))

    assert (caught.value.status_code, caught.value.code, caught.value.retryable, caught.value.message) == (
        400,
        "model_not_supported",
        False,
        "this model does not take token ids; token batches are served for llama_cpp and kserve_v2 models",
    )
