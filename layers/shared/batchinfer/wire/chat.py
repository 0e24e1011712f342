"""The OpenAI chat completions request and response (`POST /v1/chat/completions`), one schema of each.

Fields, types and ranges from OpenAI's API reference
(https://platform.openai.com/docs/api-reference/chat/create). It is read two ways:

- `ChatCompletionBody`, strict: what a batch line's body must be for the batch to run (`prepare`
  checks every line against it; see `batchinfer.endpoints.chat`). Strict types: `true` is not
  an integer, `1.5` and `"10"` are not a `max_tokens`; `null` means "not given". Unknown fields pass
  through, as OpenAI allows. `stream` must not be true (a batch has nowhere to stream to), `n` must
  be 1 (one result line per request), `stop` is a string or up to 4 strings, `content` a string or
  an array of content parts. `plain_chat_body` is its fast path.
- `ChatRequest`, derived from it: what the text-only backends (llama.cpp, KServe v2, Bedrock) read,
  with `read_chat_request`. The same field rules plus what a text model needs: text messages only
  (`system`, `developer`, `user`, `assistant`; text parts are joined), non-empty stop strings,
  `presence_penalty`/`frequency_penalty`, `response_format` `text`/`json_object`, and vLLM's `top_k`
  extension (an integer >= -1; -1 and 0 mean the whole vocabulary; absent, the backend's default);
  `n` other than 1, `logprobs`, `tools` and `functions` are rejected. Its errors are OpenAI's
  (`invalid_value`, `missing_required_parameter`, `unsupported_value`, `unsupported_parameter`, all
  400).
- `ChatCompletionResponse`: the `chat.completion` object the backends answer with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from batchinfer.wire.messages import loc_path

__all__ = [
    "PLAIN_CHAT_FIELDS",
    "PLAIN_MESSAGE_FIELDS",
    "RULES",
    "ChatCompletionBody",
    "ChatCompletionChoice",
    "ChatCompletionMessage",
    "ChatCompletionResponse",
    "ChatMessage",
    "ChatRequest",
    "ChatRequestError",
    "CompletionUsage",
    "NonEmptyStr",
    "TextMessage",
    "plain_chat_body",
    "read_chat_request",
]

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
TextRole = Literal["system", "developer", "user", "assistant"]


def _non_empty(value: str) -> str:
    # A validator rather than `min_length`: pydantic's constrained strings reject lone surrogates,
    # which must pass validation here (the worker answers them per line).
    if not value:
        raise ValueError("must not be empty")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]


def _check_content(value: Any) -> Any:
    # OpenAI chat content: a string, or an array of content parts `{"type": ..., ...}`.
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in value):
        return value
    raise ValueError('content must be a string or an array of content parts {"type": ...}')


class ChatMessage(BaseModel):
    """One chat message: a `role` and a `content` (other OpenAI message fields pass through)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    role: Role
    content: Annotated[Any, AfterValidator(_check_content)]

    @model_validator(mode="after")
    def _null_content_only_for_assistant(self) -> ChatMessage:
        # OpenAI allows a null content only for an assistant message that carries tool calls.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content may be null only in an assistant message, not in a {self.role} one")
        return self


def _check_stop(value: Any) -> Any:
    # OpenAI: "Up to 4 sequences where the API will stop generating further tokens."
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        if len(value) <= 4:
            return value
        raise ValueError("at most 4 stop sequences are allowed")
    raise ValueError("stop must be a string or an array of up to 4 strings")


Stop = Annotated[Any, AfterValidator(_check_stop)]


# Field types shared by the request bodies (chat, completions, responses).
PositiveInt = Annotated[int, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(ge=0, le=1)]
# vLLM's `top_k` extension field (OpenAI has none): the k most likely tokens; -1 or 0 the whole vocabulary.
TopK = Annotated[int, Field(ge=-1)]
OneChoice = Annotated[int, Field(ge=1, le=1)]


class ChatCompletionBody(BaseModel):
    """The checked fields of a `/v1/chat/completions` body, strictly (see the module docstring)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: NonEmptyStr
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: OneChoice | None = None
    stop: Stop = None
    seed: int | None = None
    stream: bool | None = None


# What each field of `ChatCompletionBody` must be, for messages.
RULES = {
    "model": "a non-empty string",
    "messages": "a non-empty array of messages, each an object with a role and a content",
    "max_tokens": "a positive integer or null",
    "max_completion_tokens": "a positive integer or null",
    "temperature": "a number from 0 to 2",
    "top_p": "a number from 0 to 1",
    "n": "1 (one choice per request in a batch)",
    "stop": "a string or an array of up to 4 strings",
    "seed": "an integer",
    "stream": "a boolean",
}


# ---- The common case, fast. pydantic explains precisely what is wrong with a body but costs ~8 µs,
# several times the JSON parsing of a batch line; nearly every body is right. `plain_chat_body`
# accepts only values the models accept too (never the reverse: anything unusual goes on to
# pydantic, which then reports as before), in ~1 µs. It must cover every field of the models it
# stands for: tests/unit/wire/test_chat.py fails when a field is added without its check here.

_ROLES = frozenset(Role.__args__)  # type: ignore[attr-defined]
_INT64 = 2**63
# The fields `plain_chat_body` checks, one by one (inline: a call per field costs more than the check).
PLAIN_CHAT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "stream",
    }
)
PLAIN_MESSAGE_FIELDS = frozenset({"role", "content"})


def plain_chat_body(body: dict[str, Any]) -> bool:
    """True only for a body that `ChatCompletionBody` accepts (False says nothing)."""
    get = body.get
    messages, model = get("messages"), get("model")
    if type(messages) is not list or not messages or type(model) is not str or not model:
        return False
    for message in messages:
        if type(message) is not dict:
            return False
        role = message.get("role")
        if type(role) is not str or role not in _ROLES or type(message.get("content")) is not str:
            return False
    if (value := get("max_tokens")) is not None and not (type(value) is int and 0 < value < _INT64):
        return False
    if (value := get("max_completion_tokens")) is not None and not (
        type(value) is int and 0 < value < _INT64
    ):
        return False
    if (value := get("temperature")) is not None and not (type(value) in (int, float) and 0 <= value <= 2):
        return False
    if (value := get("top_p")) is not None and not (type(value) in (int, float) and 0 <= value <= 1):
        return False
    if (value := get("n")) is not None and not (type(value) is int and value == 1):
        return False
    if (value := get("seed")) is not None and not (type(value) is int and -_INT64 <= value < _INT64):
        return False
    if (value := get("stream")) is not None and value is not False:
        return False
    value = get("stop")
    return (
        value is None
        or type(value) is str
        or (type(value) is list and len(value) <= 4 and all(type(item) is str for item in value))
    )


# ---- What the text-only backends read.


def _join_text_parts(value: Any) -> Any:
    # OpenAI's array form: only text parts can reach a text-only model; join them like vLLM does.
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise ValueError(f"content part {index} is not a text part; this model accepts text only")
            texts.append(part["text"])
        return "\n".join(texts)
    return value


def _non_empty_stops(value: Any) -> Any:
    # An empty stop string matches everywhere: the completion would always be empty.
    if value == "" or (isinstance(value, list) and "" in value):
        raise ValueError("stop sequences must not be empty")
    return value


class TextMessage(ChatMessage):
    """A message a text model can read: a text role and a string `content` (text parts joined)."""

    role: TextRole
    content: Annotated[str, BeforeValidator(_join_text_parts)]


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object"]


Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# Stop strings a model can use (none empty).
UsableStop = Annotated[Stop, AfterValidator(_non_empty_stops)]


class ChatRequest(ChatCompletionBody):
    """A chat completions body as a text-only backend reads it (see the module docstring); `model`
    is not needed (the backend is already the model)."""

    model: Any = None  # not read: the backend is already the model
    messages: list[TextMessage] = Field(min_length=1)  # type: ignore[assignment]
    stop: Annotated[Stop, AfterValidator(_non_empty_stops)] = None
    top_k: TopK | None = None  # absent: the backend's own default
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None

    def only_plain_sampling(self, who: str) -> None:
        """Raise `ChatRequestError(unsupported_parameter)` for what only llama.cpp's sampler honours:
        presence/frequency penalties and `response_format` `json_object`; `who` names the model in
        the message ("Bedrock models")."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ChatRequestError(f"'{name}' is not supported by {who}.", "unsupported_parameter", name)
        if self.response_format is not None and self.response_format.type != "text":
            raise ChatRequestError(
                f"response_format json_object is not supported by {who}.",
                "unsupported_parameter",
                "response_format",
            )


class ChatRequestError(ValueError):
    """A chat request a backend must refuse (HTTP 400): OpenAI's error `code`, `param` (the field's
    path, `messages[0].content`) and `message`."""

    def __init__(self, message: str, code: str, param: str) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


def request_error(exc: ValidationError, unsupported: Callable[[str, str], str | None]) -> ChatRequestError:
    """The `ChatRequestError` of `exc`'s first problem: `missing_required_parameter`, else
    `unsupported_value` with the message `unsupported(param, pydantic error type)` gives (None: not
    that), else `invalid_value` with pydantic's reason."""
    first = exc.errors(include_url=False)[0]
    param = loc_path(first["loc"])
    if first["type"] == "missing":
        return ChatRequestError(
            f"Missing required parameter: '{param}'.", "missing_required_parameter", param
        )
    if (message := unsupported(param, first["type"])) is not None:
        return ChatRequestError(message, "unsupported_value", param)
    # pydantic prefixes our validators' messages with "Value error, ".
    reason = first["msg"].removeprefix("Value error, ")
    return ChatRequestError(f"Invalid value for '{param}': {reason}.", "invalid_value", param)


def _only_one_choice(param: str, kind: str) -> str | None:
    if param == "n" and kind in ("greater_than_equal", "less_than_equal"):
        return "Only n=1 is supported by this model."
    return None


def read_chat_request(body: dict[str, Any]) -> ChatRequest:
    """`body` as a `ChatRequest`; raises `ChatRequestError` naming the first problem.

    Codes: `missing_required_parameter` (`Missing required parameter: 'messages'.`), `invalid_value`
    (`Invalid value for 'temperature': <pydantic's reason>.`), `unsupported_value` (`n` other than 1),
    `unsupported_parameter` (`logprobs`, `tools`, `functions`).
    """
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc, _only_one_choice) from None
    if request.logprobs:
        raise ChatRequestError(
            "logprobs are not supported by this model.", "unsupported_parameter", "logprobs"
        )
    for name in ("tools", "functions"):
        if getattr(request, name):
            raise ChatRequestError(
                f"'{name}' are not supported by this model.", "unsupported_parameter", name
            )
    return request


# ---- The response: what a backend answers (OpenAI's `chat.completion` object).


class ChatCompletionMessage(BaseModel):
    """The assistant's message of a choice (text only: `refusal` is always null here)."""

    role: Literal["assistant"] = "assistant"
    content: str
    refusal: str | None = None


class ChatCompletionChoice(BaseModel):
    """One choice: its `index`, `message` and why generation stopped (`stop`, `length`,
    `content_filter`); `logprobs` are never returned."""

    index: int = 0
    message: ChatCompletionMessage
    logprobs: None = None
    finish_reason: str


class PromptTokensDetails(BaseModel):
    """`cached_tokens`: the prompt's tokens the model took from its cache instead of computing."""

    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    """Tokens of one completion; `total_tokens` is their sum. `prompt_tokens_details` only from a
    backend that knows what its prompt cache saved (left out of the JSON otherwise)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = Field(None, exclude_if=lambda v: v is None)

    @classmethod
    def of(
        cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> CompletionUsage:
        """The usage of `prompt_tokens` in (`cached_tokens` of them from a prompt cache, when known) and
        `completion_tokens` out."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=None
            if cached_tokens is None
            else PromptTokensDetails(cached_tokens=cached_tokens),
        )


class ChatCompletionResponse(BaseModel):
    """A `chat.completion` object as OpenAI serves it (`model_dump()` gives its JSON, every field
    present, in OpenAI's order); `created` is the Unix time it was made."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage
    system_fingerprint: str | None = None

    @classmethod
    def answer(
        cls,
        *,
        id: str,
        model: str,
        content: str,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None = None,
    ) -> ChatCompletionResponse:
        """The completion of one text answer: a single assistant choice and its usage (`cached_tokens`:
        see `CompletionUsage.of`)."""
        return cls(
            id=id,
            model=model,
            choices=[
                ChatCompletionChoice(
                    message=ChatCompletionMessage(content=content), finish_reason=finish_reason
                )
            ],
            usage=CompletionUsage.of(prompt_tokens, completion_tokens, cached_tokens),
        )
