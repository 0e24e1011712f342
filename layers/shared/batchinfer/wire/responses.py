"""The OpenAI Responses request and Response object (`POST /v1/responses`), text only.

Fields from OpenAI's API reference (https://platform.openai.com/docs/api-reference/responses/create):

- `ResponseBody`, strict: what a batch line's body must be. `input` is a non-empty string or a
  non-empty array of message items (`role` user, assistant, system or developer; `content` a string
  or an array of `input_text`/`output_text` parts); `instructions`, `max_output_tokens`,
  `temperature`, `top_p`, `text.format` (`text`, `json_object`, `json_schema`), `metadata`.
  Refused, each with its sentence: `tools`, image and file parts, items other than messages,
  `previous_response_id`, `background`, `stream` and `store: true` (a batch stores nothing to build
  on, streams nothing, runs in the background already). Unknown fields pass through.
- `chat_body`: the same request as a chat completions body, for backends without Responses.
- `ResponseObject`: the Response answered (`from_chat` builds it from a chat completion).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from batchinfer.wire.chat import RULES, NonEmptyStr, PositiveInt, Temperature, TopP
from batchinfer.wire.openai import Metadata

__all__ = [
    "RESPONSE_RULES",
    "ResponseBody",
    "ResponseObject",
    "ResponseUsage",
    "chat_body",
]

_STRICT = ConfigDict(strict=True, extra="ignore")


class TextPart(BaseModel):
    """A text content part of an input message (`output_text` in earlier assistant turns)."""

    model_config = _STRICT

    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(BaseModel):
    """An input message item (`type` "message" or absent)."""

    model_config = _STRICT

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: list[TextPart]

    @field_validator("content", mode="before")
    @classmethod
    def _text_is_one_part(cls, value: Any) -> Any:
        return [{"type": "input_text", "text": value}] if isinstance(value, str) else value

    def text(self) -> str:
        """The content as one string (parts joined by newlines, as chat's text parts are)."""
        return "\n".join(part.text for part in self.content)


class TextFormat(BaseModel):
    """`text.format`: plain text, any JSON object, or JSON for a named schema."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal["text", "json_object", "json_schema"]


class TextOptions(BaseModel):
    """`text`: its `format` (default plain text)."""

    model_config = _STRICT

    format: TextFormat | None = None


class ResponseBody(BaseModel):
    """The checked fields of a `/v1/responses` body, strictly (see the module docstring)."""

    model_config = _STRICT

    model: NonEmptyStr
    input: Annotated[list[MessageItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    text: TextOptions | None = None
    metadata: Metadata = None
    store: Literal[False] | None = None
    stream: Literal[False] | None = None
    background: Literal[False] | None = None
    previous_response_id: None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_is_a_user_message(cls, value: Any) -> Any:
        # OpenAI: a string input is one user message. One shape to check: one error per mistake.
        return [{"role": "user", "content": value}] if isinstance(value, str) and value else value


# What each field of `ResponseBody` must be, for messages.
RESPONSE_RULES = {
    **{name: RULES[name] for name in ("model", "temperature", "top_p")},
    "input": "a non-empty string or a non-empty array of message items {role, content} with text content "
    "(input_text parts; images and files are not supported)",
    "instructions": "a string or null",
    "max_output_tokens": RULES["max_tokens"],
    "text": 'an object {"format": {"type": "text" | "json_object" | "json_schema", ...}}',
    "store": "false or absent (a batch stores no responses)",
    "stream": "false or absent (a batch does not stream)",
    "background": "false or absent (a batch runs in the background already)",
    "previous_response_id": "null or absent (a batch stores no responses to continue)",
    "tools": "absent or empty (tools are not supported)",
}


def chat_body(body: ResponseBody) -> dict[str, Any]:
    """The chat completions body of the same request: `instructions` as a first system message, the
    items as messages, `max_output_tokens` as `max_completion_tokens`, a JSON `text.format` as
    `response_format` `json_object` (the model's JSON grammar; a schema is not enforced)."""
    messages = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages += [{"role": item.role, "content": item.text()} for item in body.input]
    chat: dict[str, Any] = {"model": body.model, "messages": messages}
    for name, value in (
        ("max_completion_tokens", body.max_output_tokens),
        ("temperature", body.temperature),
        ("top_p", body.top_p),
    ):
        if value is not None:
            chat[name] = value
    if body.text is not None and body.text.format is not None and body.text.format.type != "text":
        chat["response_format"] = {"type": "json_object"}
    return chat


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    status: Literal["completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class InputTokensDetails(BaseModel):
    # The OpenAI SDK's Response model requires both; cached_tokens: what the backend's prompt cache saved.
    cache_write_tokens: int = 0
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    """A Response's tokens: `input_tokens` (the prompt), `output_tokens` (generated), their sum."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(BaseModel):
    """A Response object as OpenAI serves it (text output, one message); `created_at` in Unix seconds.
    `status` is `incomplete` with `incomplete_details.reason` when the output was cut."""

    id: str = Field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["completed", "incomplete"]
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputMessage]
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    store: bool = False
    temperature: float = 1.0
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str = "auto"
    tools: list[Any] = Field(default_factory=list)
    top_p: float = 1.0
    truncation: str = "disabled"
    usage: ResponseUsage
    metadata: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_chat(cls, body: ResponseBody, completion: dict[str, Any]) -> ResponseObject:
        """The Response of request `body` from the chat completion that answered it: its text, its
        finish reason (`length` -> incomplete, `max_output_tokens`; `content_filter` likewise) and
        its usage."""
        choice = completion["choices"][0]
        reason = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
            choice["finish_reason"]
        )
        usage = completion.get("usage") or {}
        prompt, generated = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        status: Literal["completed", "incomplete"] = "incomplete" if reason else "completed"
        return cls(
            status=status,
            incomplete_details=IncompleteDetails(reason=reason) if reason else None,  # type: ignore[arg-type]
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            model=completion.get("model") or body.model,
            output=[
                OutputMessage(
                    status=status, content=[OutputText(text=choice["message"].get("content") or "")]
                )
            ],
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            text=body.text.model_dump(exclude_none=True)
            if body.text and body.text.format
            else {"format": {"type": "text"}},
            usage=ResponseUsage(
                input_tokens=prompt,
                input_tokens_details=InputTokensDetails(cached_tokens=cached),
                output_tokens=generated,
                total_tokens=prompt + generated,
            ),
            metadata=body.metadata or {},
        )
