"""The embedded embedding backend without its model: where it finds the files, and a model that cannot
be converted or loaded answering 500 `model_error`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from batchinfer.backends.base import BackendError
from batchinfer.backends.config import LlamaEmbedConfig
from batchinfer.backends.llama_embed import LlamaEmbedBackend


def test_a_directory_without_weights_is_refused_at_construction(tmp_path: Path) -> None:
    # Given / When / Then
    with pytest.raises(
        FileNotFoundError, match=f"no model.safetensors in the embedding model directory {tmp_path}"
    ):
        LlamaEmbedBackend("m", LlamaEmbedConfig(backend="llama_embed", model_dir=tmp_path))


def test_a_model_that_cannot_be_converted_is_a_500_model_error(tmp_path: Path) -> None:
    # Given weights without their config.json
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 8)
    backend = LlamaEmbedBackend(
        "m", LlamaEmbedConfig(backend="llama_embed", model_dir=tmp_path, cache_dir=tmp_path)
    )

    # When
    with pytest.raises(BackendError) as caught:
        asyncio.run(backend.embeddings({"model": "m", "input": "a"}))

    # Then
    assert (caught.value.status_code, caught.value.code, caught.value.retryable) == (
        500,
        "model_error",
        False,
    )
    assert caught.value.message.startswith("The model failed to load: FileNotFoundError: ")
    assert backend.serves == frozenset({"/v1/embeddings"})
