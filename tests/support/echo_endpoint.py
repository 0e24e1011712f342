"""A made-up batch endpoint, `/v1/echo`, as a plug-in would add one: this module and one `register`.

A line's body is `{"model", "text"}`; the model's backend answers it as a one-message chat request,
and the result body is `{"object": "echo", "model", "text", "usage"}` with the chat answer's text and
token counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batchinfer.endpoints import registry
from batchinfer.endpoints.base import Endpoint, Server, Usage
from batchinfer.wire.chat import CompletionUsage
from batchinfer.wire.line_errors import LineError, line_errors
from batchinfer.wire.openai import CHAT_ENDPOINT

ECHO = "/v1/echo"


class EchoBody(BaseModel):
    """An echo request: the `model` to ask and the `text` to send it."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str = Field(min_length=1)
    text: str = Field(min_length=1)


class EchoResult(BaseModel):
    """An echo result: the model's answer to `text`, and its usage."""

    object: Literal["echo"] = "echo"
    model: str
    text: str
    usage: CompletionUsage


class EchoServer:
    """Echo bodies answered through a chat backend's `chat_completion`."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.concurrency_hint: int | None = getattr(backend, "concurrency_hint", None)

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The `EchoResult` of one echo body; the backend's errors pass through."""
        chat = {"model": body["model"], "messages": [{"role": "user", "content": body["text"]}]}
        completion = await self.backend.chat_completion(chat)
        return EchoResult(
            model=body["model"],
            text=completion["choices"][0]["message"]["content"],
            usage=CompletionUsage.model_validate(completion["usage"]),
        ).model_dump()


class Echo(Endpoint):
    """`/v1/echo` (see the module docstring)."""

    template = ECHO
    pattern = re.compile(re.escape(ECHO))
    model_param = "body.model"
    body_model = EchoBody
    result_model = EchoResult

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """`EchoBody`'s errors, in pydantic's words."""
        try:
            EchoBody.model_validate(body)
        except ValidationError as exc:
            return line_errors(exc, line, "body.", {"text": "a non-empty string"})
        return []

    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        """`body.model`."""
        model = body.get("model")
        return model if isinstance(model, str) and model else None

    def served_by(self, serves: frozenset[str]) -> bool:
        """Every chat backend: an echo body is asked as chat."""
        return CHAT_ENDPOINT in serves

    def server(self, backend: Any) -> Server:
        """An `EchoServer` on the backend."""
        return EchoServer(backend)

    def usage(self, result: dict[str, Any]) -> Usage:
        """The chat answer's prompt and completion tokens."""
        usage = result["usage"]
        return Usage(usage["prompt_tokens"], usage["completion_tokens"])


@contextmanager
def echo_registered() -> Iterator[Echo]:
    """`/v1/echo` served while the context lasts."""
    endpoint = registry.register(Echo())
    try:
        yield endpoint
    finally:
        del registry.ENDPOINTS[ECHO]
