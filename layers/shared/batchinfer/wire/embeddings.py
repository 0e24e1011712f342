"""OpenAI `/v1/embeddings` on the wire: the request body, the response body, and base64 vectors.

    body = EmbeddingsBody.model_validate(line["body"])      # input: str | [str] | [int] | [[int]]
    EmbeddingsResponse.of(model, vectors, "base64", prompt_tokens=12).model_dump()

Limits as OpenAI's: at most `MAX_INPUTS_PER_REQUEST` (2,048) inputs a request, no empty string or
empty token list; `MAX_INPUTS_PER_BATCH` (50,000) inputs a batch. A base64 vector is the
little-endian float32 bytes of its floats, base64-encoded (what the `openai` SDK decodes).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "MAX_INPUTS_PER_BATCH",
    "MAX_INPUTS_PER_REQUEST",
    "RULES",
    "Embedding",
    "EmbeddingsBody",
    "EmbeddingsResponse",
    "EmbeddingsUsage",
    "decode_base64",
    "encode_base64",
    "input_count",
]

MAX_INPUTS_PER_REQUEST = 2048
MAX_INPUTS_PER_BATCH = 50_000


def _non_empty(value: Any) -> Any:
    # A validator rather than `min_length`: constrained strings reject lone surrogates, which the
    # worker answers per line as the chat endpoint does.
    if len(value) == 0:
        raise ValueError("must not be empty")
    return value


_Text = Annotated[str, AfterValidator(_non_empty)]
_TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], AfterValidator(_non_empty)]
EmbeddingsInput = (
    _Text
    | Annotated[list[_Text], Field(min_length=1, max_length=MAX_INPUTS_PER_REQUEST)]
    | _TokenIds
    | Annotated[list[_TokenIds], Field(min_length=1, max_length=MAX_INPUTS_PER_REQUEST)]
)

RULES = {
    "model": "a non-empty string",
    "input": (
        f"a non-empty string, an array of 1 to {MAX_INPUTS_PER_REQUEST} non-empty strings, an array of "
        f"token ids (integers >= 0) or an array of 1 to {MAX_INPUTS_PER_REQUEST} such arrays"
    ),
    "encoding_format": '"float" or "base64"',
    "dimensions": "a positive integer or null",
    "user": "a string",
}


class EmbeddingsBody(BaseModel):
    """An OpenAI embeddings request body; unknown fields pass through (as the chat body's do)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: Annotated[str, AfterValidator(_non_empty)]
    input: EmbeddingsInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None

    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs as a list: of strings, or of token-id lists."""
        return inputs_of(self.input)


def inputs_of(value: Any) -> list[Any]:
    """`input` as a list of inputs: a string or a token-id list is one input (no checks)."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        return [value]
    return list(value) if isinstance(value, list) else [value]


def input_count(body: dict[str, Any]) -> int:
    """How many inputs a (valid) embeddings body holds."""
    return len(inputs_of(body.get("input")))


def encode_base64(vector: Sequence[float]) -> str:
    """The base64 of `vector`'s little-endian float32 bytes (OpenAI's `encoding_format: "base64"`)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def decode_base64(text: str) -> list[float]:
    """The floats of an `encode_base64` string."""
    data = base64.b64decode(text)
    return list(struct.unpack(f"<{len(data) // 4}f", data))


class Embedding(BaseModel):
    """One vector of a response: `embedding` is floats, or a base64 string (see `encode_base64`)."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsUsage(BaseModel):
    """Tokens of an embeddings request: input tokens only (`total_tokens` == `prompt_tokens`)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    """OpenAI's embeddings response body: `{"object": "list", "data", "model", "usage"}`."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage

    @classmethod
    def of(
        cls,
        model: str,
        vectors: Sequence[Sequence[float]],
        encoding_format: str,
        prompt_tokens: int,
    ) -> EmbeddingsResponse:
        """The response carrying `vectors` (in input order) as floats or base64 strings."""
        encode = encode_base64 if encoding_format == "base64" else list
        return cls(
            data=[Embedding(index=i, embedding=encode(vector)) for i, vector in enumerate(vectors)],
            model=model,
            usage=EmbeddingsUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        )
