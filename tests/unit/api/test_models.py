"""`/v1/models`: OpenAI's model objects, each with the batch endpoints it serves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer.api.models import list_models, retrieve_model
from batchinfer.backends.registry import load_registry
from batchinfer.core.settings import get_settings


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  vllm: {backend: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
        "  nova: {backend: bedrock, model_id: amazon.nova-micro-v1:0}\n"
    )
    monkeypatch.setenv("MODEL_REGISTRY", str(path))
    monkeypatch.setenv("TABLE_NAME", "t")
    monkeypatch.setenv("BUCKET_NAME", "b")
    get_settings.cache_clear()
    load_registry.cache_clear()  # type: ignore[attr-defined]
    yield path
    get_settings.cache_clear()


def test_every_model_is_listed_with_the_endpoints_it_serves(registry: Path) -> None:
    created = int(registry.stat().st_mtime)

    assert list_models().model_dump() == {
        "object": "list",
        "data": [
            {
                "id": "vllm",
                "object": "model",
                "created": created,
                "owned_by": "openai",
                "endpoints": [
                    "/v1/chat/completions",
                    "/v1/completions",
                    "/v1/responses",
                    "/v1/embeddings",
                    "/v1/messages",
                ],
            },
            {
                "id": "nova",
                "object": "model",
                "created": created,
                "owned_by": "bedrock",
                "endpoints": ["/v1/chat/completions", "/v1/responses", "/v1/messages"],
            },
        ],
    }
    assert retrieve_model("nova").endpoints == ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
