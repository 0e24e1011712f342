"""`/v1/chat/completions`: OpenAI chat completions, served by every backend's `chat_completion`.

Line urls are the template itself; the body is `wire.chat.ChatCompletionBody` (unknown fields pass
through), the model is `body.model`, the result a `wire.chat.ChatCompletionResponse` whose `usage`
counts prompt and completion tokens.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from batchinfer.endpoints.base import Endpoint, Usage
from batchinfer.wire.chat import RULES, ChatCompletionBody, ChatCompletionResponse, plain_chat_body
from batchinfer.wire.line_errors import ErrorCode, LineError, line_errors
from batchinfer.wire.openai import CHAT_ENDPOINT

__all__ = ["ChatCompletions", "check_chat_body", "streaming_error"]


def streaming_error(line: int) -> LineError:
    """The `streaming_unsupported` error of a body with `"stream": true` on input line `line`."""
    return LineError(
        code=ErrorCode.STREAMING_UNSUPPORTED,
        message=f'Line {line}: "stream": true is not supported in a batch; remove it or set it to false.',
        param="body.stream",
        line=line,
    )


def check_chat_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v1/chat/completions` body (empty when valid); see `ChatCompletionBody`."""
    if plain_chat_body(body):
        return []
    errors = []
    if body.get("stream") is True:
        errors.append(streaming_error(line))
    try:
        ChatCompletionBody.model_validate(body)
    except ValidationError as exc:
        errors += line_errors(exc, line, "body.", RULES)
    return errors


class ChatCompletions(Endpoint):
    """The chat completions endpoint (see the module docstring)."""

    template = CHAT_ENDPOINT
    pattern = re.compile(re.escape(CHAT_ENDPOINT))
    model_param = "body.model"
    body_model = ChatCompletionBody
    result_model = ChatCompletionResponse
    plain_body = staticmethod(plain_chat_body)

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """See `check_chat_body`."""
        return check_chat_body(body, line)

    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        """`body.model` when it is a non-empty string."""
        model = body.get("model")
        return model if isinstance(model, str) and model else None

    def usage(self, result: dict[str, Any]) -> Usage:
        """`usage.prompt_tokens` in, `usage.completion_tokens` out, `usage.prompt_tokens_details.
        cached_tokens` cached (0 where absent)."""
        usage = result.get("usage") or {}
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), cached)
