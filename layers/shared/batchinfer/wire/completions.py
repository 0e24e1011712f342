"""The OpenAI (legacy) completions request and response (`POST /v1/completions`).

Fields, types and ranges from OpenAI's API reference
(https://platform.openai.com/docs/api-reference/completions/create), read two ways as chat's are:

- `CompletionBody`, strict: what a batch line's body must be for the batch to run. `prompt` is a
  non-empty string or a non-empty array of them (token-id prompts are not taken), one choice per
  prompt; `n` must be 1, `echo` false and `logprobs` null (not served here); `stop` as chat's; `null`
  means "not given"; unknown fields pass through.
- `CompletionRequest`: what a backend that generates from the raw prompt reads
  (`read_completion_request`), with `presence_penalty`/`frequency_penalty` and non-empty stop strings.
- `CompletionResponse`: the `text_completion` object answered, `choices[i]` for `prompt[i]`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from batchinfer.wire.chat import (
    RULES,
    CompletionUsage,
    NonEmptyStr,
    OneChoice,
    Penalty,
    PositiveInt,
    Stop,
    Temperature,
    TopK,
    TopP,
    UsableStop,
    request_error,
)

__all__ = [
    "COMPLETION_RULES",
    "DEFAULT_COMPLETION_TOKENS",
    "CompletionBody",
    "CompletionChoice",
    "CompletionRequest",
    "CompletionResponse",
    "read_completion_request",
]

# OpenAI's default `max_tokens` for completions (chat's default is the model's).
DEFAULT_COMPLETION_TOKENS = 16


def _check_prompt(value: Any) -> str | list[str]:
    # One rule for the whole field (not a union of two), so a bad prompt is one error.
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(item, str) and item for item in value):
        return value
    raise ValueError("prompt must be a non-empty string or a non-empty array of non-empty strings")


class CompletionBody(BaseModel):
    """The checked fields of a `/v1/completions` body, strictly (see the module docstring)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: NonEmptyStr
    prompt: Annotated[Any, AfterValidator(_check_prompt)]
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: OneChoice | None = None
    echo: Literal[False] | None = None
    logprobs: None = None
    stop: Stop = None
    seed: int | None = None
    stream: Literal[False] | None = None

    def prompts(self) -> list[str]:
        """The prompts, one per choice."""
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


# What each field of `CompletionBody` must be, for messages.
COMPLETION_RULES = {
    **{name: RULES[name] for name in ("model", "max_tokens", "temperature", "top_p", "stop", "seed")},
    "prompt": "a non-empty string or a non-empty array of non-empty strings (token-id prompts are not "
    "supported)",
    "n": "1 (one choice per prompt; n > 1 is not supported)",
    "echo": "false (echo is not supported)",
    "logprobs": "null (logprobs are not supported)",
    "stream": "false or null (a batch does not stream)",
}


class CompletionRequest(CompletionBody):
    """A completions body as a raw-prompt backend reads it; `model` is not read. Its sampling fields
    have the names of `wire.chat.ChatRequest`'s, so one sampler builder serves both."""

    model: Any = None
    stop: UsableStop = None
    top_k: TopK | None = None  # vLLM's extension, as on `ChatRequest`
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    response_format: None = None  # completions have none; named for the shared sampler builder


def read_completion_request(body: dict[str, Any]) -> CompletionRequest:
    """`body` as a `CompletionRequest`; raises `ChatRequestError` (400, OpenAI's codes) naming the first
    problem: `missing_required_parameter`, `unsupported_value` (`n`, `echo`, `logprobs`), else
    `invalid_value`."""
    try:
        return CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc, _not_served) from None


def _not_served(param: str, kind: str) -> str | None:
    return f"'{param}' must be {COMPLETION_RULES[param]}." if param in ("n", "echo", "logprobs") else None


class CompletionChoice(BaseModel):
    """One choice: the generated `text` of prompt `index`, and why generation stopped."""

    text: str
    index: int
    logprobs: None = None
    finish_reason: str


class CompletionResponse(BaseModel):
    """A `text_completion` object as OpenAI serves it; `created` is the Unix time it was made."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    system_fingerprint: str | None = None
