"""`/v1/completions`: OpenAI (legacy) text completions, served by the backends whose `serves` lists it.

Line urls are the template itself; the body is `wire.completions.CompletionBody` (unknown fields pass
through), the model is `body.model`, the result a `wire.completions.CompletionResponse` (one choice
per prompt) whose `usage` counts prompt and completion tokens. A backend answers through its
`text_completion(body)` (the embedded model on the raw prompt, no chat template; an OpenAI-compatible
server at its own `/completions`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from batchinfer.backends.base import BackendError
from batchinfer.endpoints.base import BackendServer, Server
from batchinfer.endpoints.chat import ChatCompletions, streaming_error
from batchinfer.wire.completions import COMPLETION_RULES, CompletionBody, CompletionResponse
from batchinfer.wire.line_errors import LineError, line_errors
from batchinfer.wire.openai import COMPLETIONS_ENDPOINT

__all__ = ["Completions", "CompletionsServer", "check_completion_body"]


def check_completion_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v1/completions` body (empty when valid); see `CompletionBody`. `"stream": true`
    is `streaming_unsupported`, as for chat."""
    if body.get("stream") is True:
        return [streaming_error(line)]
    try:
        CompletionBody.model_validate(body)
    except ValidationError as exc:
        return line_errors(exc, line, "body.", COMPLETION_RULES)
    return []


class CompletionsServer(BackendServer):
    """Completions bodies answered by the backend's `text_completion` (400 `model_not_supported` for
    a backend without one; validation keeps such lines out of a batch)."""

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The `text_completion` object of one body; the backend's errors pass through."""
        complete = getattr(self.backend, "text_completion", None)
        if complete is None:
            raise BackendError(400, "this model does not serve /v1/completions", code="model_not_supported")
        result: dict[str, Any] = await complete(body)
        return result


class Completions(ChatCompletions):
    """The completions endpoint (see the module docstring); the model and usage are read as chat's."""

    template = COMPLETIONS_ENDPOINT
    pattern = re.compile(re.escape(COMPLETIONS_ENDPOINT))
    model_param = "body.model"
    body_model = CompletionBody
    result_model = CompletionResponse
    plain_body = None

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """See `check_completion_body`."""
        return check_completion_body(body, line)

    def server(self, backend: Any) -> Server:
        """A `CompletionsServer` on the backend."""
        return CompletionsServer(backend)
