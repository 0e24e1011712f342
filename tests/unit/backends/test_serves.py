"""Which backend serves which batch endpoint: each backend class's `serves`, read by the registry
without building a backend."""

from __future__ import annotations

import pytest

from batchinfer.backends import ModelRegistry

CHAT, COMPLETIONS, RESPONSES, TOKENS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v2/models/{model}/infer",
)
REGISTRY = ModelRegistry.from_dict(
    {
        "models": {
            "smol": {"backend": "llama_cpp", "model_path": "/nowhere/x.gguf"},
            "vllm": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
            "nova": {"backend": "bedrock", "model_id": "amazon.nova-micro-v1:0"},
            "mindie": {"backend": "kserve_v2", "base_url": "http://127.0.0.1:9", "model": "m"},
        }
    }
)


@pytest.mark.parametrize(
    ("name", "serves"),
    [
        ("smol", {CHAT, COMPLETIONS, RESPONSES, TOKENS}),
        ("vllm", {CHAT, COMPLETIONS, RESPONSES, "/v1/embeddings"}),
        ("nova", {CHAT, RESPONSES}),
        ("mindie", {CHAT, COMPLETIONS, RESPONSES, TOKENS}),
    ],
)
def test_each_backend_kind_declares_what_it_serves(name: str, serves: set[str]) -> None:
    # the GGUF file does not exist: nothing is built to answer
    assert REGISTRY.serves(name) == frozenset(serves)
