"""The embedded embedding model (all-MiniLM-L6-v2 on llama.cpp): real vectors, OpenAI's shapes, its limits."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchinfer.backends.base import BackendError
from batchinfer.backends.config import LlamaEmbedConfig
from batchinfer.backends.llama_embed import LlamaEmbedBackend
from batchinfer.wire.embeddings import decode_base64

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaEmbedBackend]:
    cache = Path(tmp_path_factory.mktemp("gguf"))
    yield LlamaEmbedBackend(MODEL, LlamaEmbedConfig(backend="llama_embed", cache_dir=cache, n_seq_max=16))


def embed(backend: LlamaEmbedBackend, **body: Any) -> dict[str, Any]:
    return asyncio.run(backend.embeddings({"model": MODEL, **body}))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_similar_sentences_are_nearer_and_vectors_are_unit_length(backend: LlamaEmbedBackend) -> None:
    # Given / When
    answer = embed(
        backend, input=["The cat sits on the mat.", "A cat is sitting on a mat.", "Stocks fell today."]
    )

    # Then
    cat, cat2, stocks = (item["embedding"] for item in answer["data"])
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    assert len(cat) == 384
    assert math.isclose(math.sqrt(cosine(cat, cat)), 1.0, abs_tol=1e-6)
    assert cosine(cat, cat2) > 0.9 > 0.2 > cosine(cat, stocks)
    assert answer["usage"] == {"prompt_tokens": 25, "total_tokens": 25}


def test_token_ids_and_base64_give_the_vector_of_the_text(backend: LlamaEmbedBackend) -> None:
    # Given "hello world" as text, and as the model's WordPiece ids without and with [CLS]/[SEP]
    text = embed(backend, input="hello world")["data"][0]["embedding"]

    # When
    ids = embed(backend, input=[[7592, 2088], [101, 7592, 2088, 102]], encoding_format="base64")

    # Then
    assert [decode_base64(item["embedding"]) for item in ids["data"]] == [text, text]
    assert ids["usage"] == {"prompt_tokens": 8, "total_tokens": 8}


def test_the_same_input_gives_the_same_vector_in_any_batch_mix(backend: LlamaEmbedBackend) -> None:
    # Given a sentence alone
    alone = embed(backend, input="The cat sits on the mat.")["data"][0]["embedding"]

    # When it is embedded among other inputs of its line and of other lines at once
    async def mixed() -> list[dict[str, Any]]:
        bodies = [{"model": MODEL, "input": [f"filler {i} " * (i % 5 + 1) for i in range(k)]} for k in (3, 9)]
        line = {"model": MODEL, "input": ["zz top", "The cat sits on the mat.", "x " * 30]}
        return await asyncio.gather(*(backend.embeddings(body) for body in (bodies[0], line, bodies[1])))

    together = asyncio.run(mixed())[1]["data"][1]["embedding"]

    # Then it is the same vector, bit for bit
    assert together == alone


def test_random_mixes_give_every_input_its_solo_vector(backend: LlamaEmbedBackend) -> None:
    # Given three sentences embedded alone, and twelve random mixes of up to 40 other inputs
    rng = random.Random(7)
    words = "alpha beta gamma delta river stone cloud market cat mat sings quickly".split()
    targets = [
        "The cat sits on the mat.",
        "hello",
        "A longer sentence with quite a few more words than the rest.",
    ]
    solo = [embed(backend, input=text)["data"][0]["embedding"] for text in targets]
    for _ in range(12):
        mix = [" ".join(rng.choices(words, k=rng.randint(1, 20))) for _ in range(rng.randint(1, 40))]
        for text in targets:
            mix.insert(rng.randint(0, len(mix)), text)

        # When the mix is one request
        vectors = [item["embedding"] for item in embed(backend, input=mix)["data"]]

        # Then each sentence has its solo vector
        assert [vectors[mix.index(text)] for text in targets] == solo


def test_an_input_beyond_the_context_is_a_400_naming_its_index(backend: LlamaEmbedBackend) -> None:
    # Given / When
    with pytest.raises(BackendError) as caught:
        embed(backend, input=["short", "word " * 600])

    # Then
    assert (caught.value.status_code, caught.value.code, caught.value.param) == (
        400,
        "context_length_exceeded",
        "input[1]",
    )
    assert caught.value.message == (
        "input[1] is 602 tokens long; this model's maximum context length is 512 tokens. "
        "Please shorten or split the input."
    )


def test_dimensions_and_unknown_token_ids_are_400s(backend: LlamaEmbedBackend) -> None:
    # Given / When
    with pytest.raises(BackendError) as dimensions:
        embed(backend, input="a", dimensions=128)
    with pytest.raises(BackendError) as token:
        embed(backend, input=[[5], [40000]])

    # Then
    assert (dimensions.value.status_code, dimensions.value.param, dimensions.value.message) == (
        400,
        "dimensions",
        "The model 'all-minilm-l6-v2' does not support 'dimensions': its vectors have a fixed size.",
    )
    assert (token.value.param, token.value.message) == (
        "input[1]",
        "Invalid token id 40000 in input[1]: this model's vocabulary has 30522 tokens.",
    )
