"""Wire shapes of Anthropic's Message Batches API (the `anthropic` SDK's `resources/messages/batches.py`
and `types/messages/*`; https://docs.anthropic.com/en/api/creating-message-batches).

Times are RFC 3339 strings (`Timestamp`). The Messages params are the text subset every backend
serves: what needs more (tools, images, documents, thinking) is refused per request, as an `errored`
result, never for the whole batch.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, model_validator

MESSAGES_ENDPOINT = "/v1/messages"
# Anthropic's limits on one batch: requests, and the bytes of the create body.
MAX_REQUESTS = 100_000
MAX_BODY_BYTES = 256 * 1024 * 1024
CUSTOM_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# Fields of the Messages API this service cannot serve: named in the request's error.
UNSUPPORTED_PARAMS = ("tools", "tool_choice", "thinking", "mcp_servers", "container", "stream")
ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
]


def rfc3339(seconds: int | None) -> str | None:
    """Unix seconds as an RFC 3339 UTC time (`2026-12-03T20:00:00Z`); None stays None."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Timestamp = Annotated[int, PlainSerializer(rfc3339, return_type=str)]
OptionalTimestamp = Annotated[int | None, PlainSerializer(rfc3339, return_type=str | None)]


class TextBlock(BaseModel):
    """A text content block `{"type": "text", "text"}` (`cache_control` and `citations` ignored)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


Content = str | list[TextBlock]


def _text(content: Content) -> str:
    return content if isinstance(content, str) else "".join(block.text for block in content)


class InputMessage(BaseModel):
    """One turn of `messages`: `user` or `assistant`, its content a string or text blocks."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: Content

    @property
    def text(self) -> str:
        """The content as one string (text blocks joined)."""
        return _text(self.content)


def _alternating(messages: list[InputMessage]) -> list[InputMessage]:
    if messages[0].role != "user":
        raise ValueError("the first message must have role 'user'")
    for before, after in itertools.pairwise(messages):
        if before.role == after.role:
            raise ValueError("messages must alternate between 'user' and 'assistant' roles")
    return messages


class MessageParams(BaseModel):
    """The params of one batch request: a non-streaming Messages create (text only).

    `max_tokens` >= 1; `messages` start with `user` and alternate; `system` a string or text blocks;
    `temperature` 0 to 1; `top_p` 0 to 1; `top_k` >= 0 (0: the whole vocabulary); `stop_sequences`
    non-empty strings. Raises `ValidationError`; a field of
    `UNSUPPORTED_PARAMS` or any other unknown field is refused (`extra="forbid"`).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int = Field(ge=1)
    messages: Annotated[list[InputMessage], Field(min_length=1), AfterValidator(_alternating)]
    system: Content | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        if isinstance(data, dict) and (used := [name for name in UNSUPPORTED_PARAMS if name in data]):
            raise ValueError(f"{', '.join(used)} not supported by this service (text messages only)")
        return data

    def chat_body(self) -> dict[str, Any]:
        """The OpenAI chat completions body of these params: the system prompt first, then the turns,
        `max_tokens`, `temperature`, `top_p`, `top_k` (vLLM's extension field of chat, which every backend
        reads) and the stop sequences as `stop`."""
        messages = [{"role": "system", "content": _text(self.system)}] if self.system else []
        messages += [{"role": m.role, "content": m.text} for m in self.messages]
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        for name in ("temperature", "top_p", "top_k"):
            if (value := getattr(self, name)) is not None:
                body[name] = value
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        return body


class BatchRequest(BaseModel):
    """One entry of `requests`: its `custom_id` and its params (checked per request, at run time)."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(pattern=CUSTOM_ID_PATTERN, description="1-64 of a-z A-Z 0-9 _ -")
    params: dict[str, Any]


class CreateMessageBatch(BaseModel):
    """Body of `POST /v1/messages/batches`: 1 to 100,000 requests with unique `custom_id`s."""

    model_config = ConfigDict(extra="forbid")

    requests: list[BatchRequest] = Field(min_length=1, max_length=MAX_REQUESTS)

    @model_validator(mode="after")
    def _unique(self) -> CreateMessageBatch:
        seen: set[str] = set()
        for request in self.requests:
            if request.custom_id in seen:
                raise ValueError(f"custom_id {request.custom_id!r} is used by more than one request")
            seen.add(request.custom_id)
        return self


class RequestCounts(BaseModel):
    """Requests by state; they always sum to the batch's requests."""

    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(BaseModel):
    """The MessageBatch object."""

    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: RequestCounts
    created_at: Timestamp
    expires_at: Timestamp
    ended_at: OptionalTimestamp = None
    cancel_initiated_at: OptionalTimestamp = None
    archived_at: OptionalTimestamp = None
    results_url: str | None = None


class MessageBatchList(BaseModel):
    """A page of `GET /v1/messages/batches`, newest first."""

    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class DeletedMessageBatch(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


class ErrorObject(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    """`{"type": "error", "error": {type, message}, "request_id"}`: every 4xx/5xx of these routes, and
    the `error` of an `errored` result."""

    type: Literal["error"] = "error"
    error: ErrorObject
    request_id: str | None = None


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int


class Message(BaseModel):
    """The Message of a succeeded request (text content only)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence"]
    stop_sequence: str | None = None
    usage: MessageUsage


def result_line(custom_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """One line of a batch's results: `{"custom_id", "result": {"type": ...}}`."""
    return {"custom_id": custom_id, "result": result}
