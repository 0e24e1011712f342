"""`/v1/responses`: the OpenAI Responses API (text), on every backend whose `serves` lists it.

Line urls are the template itself; the body is `wire.responses.ResponseBody` (unknown fields pass
through), the model is `body.model`, the result a `wire.responses.ResponseObject` whose `usage` counts
`input_tokens` and `output_tokens` (not chat's names: a batch of Responses counts its tokens too).
A backend with `create_response(body)` (an OpenAI-compatible server) answers natively; any other is
asked the same request as chat (`wire.responses.chat_body`) and its chat completion becomes the
Response (`ResponseObject.from_chat`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from batchinfer.endpoints.base import BackendServer, Server, Usage
from batchinfer.endpoints.chat import ChatCompletions, streaming_error
from batchinfer.wire.line_errors import ErrorCode, LineError, line_errors
from batchinfer.wire.openai import RESPONSES_ENDPOINT
from batchinfer.wire.responses import RESPONSE_RULES, ResponseBody, ResponseObject, chat_body

__all__ = ["Responses", "ResponsesServer", "check_response_body"]

# Input parts a text model cannot read, and what they are.
_NOT_TEXT = {"input_image": "an image", "input_file": "a file", "input_audio": "audio"}


def _not_text_input(body: dict[str, Any], line: int) -> list[LineError]:
    """`invalid_parameter` for the first input item that is not a message or holds a non-text part."""
    items = body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        if item.get("type", "message") != "message":
            what = f"body.input[{i}] is a {item.get('type')!r} item; only message items are supported"
            return [_input_error(line, what)]
        parts = item.get("content")
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _NOT_TEXT:
                what = f"body.input[{i}].content[{j}] is {_NOT_TEXT[kind]} ({kind}); only text is supported"
                return [_input_error(line, what)]
    return []


def _input_error(line: int, what: str) -> LineError:
    return LineError(
        code=ErrorCode.INVALID_PARAMETER, message=f"Line {line}: {what}.", param="body.input", line=line
    )


def check_response_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v1/responses` body (empty when valid); see `ResponseBody`. `"stream": true` is
    `streaming_unsupported` as for chat; an item other than a message, or an image, file or audio
    part, is `invalid_parameter` with param `body.input`."""
    if body.get("stream") is True:
        return [streaming_error(line)]
    if errors := _not_text_input(body, line):
        return errors
    try:
        ResponseBody.model_validate(body)
    except ValidationError as exc:
        return line_errors(exc, line, "body.", RESPONSE_RULES)
    return []


class ResponsesServer(BackendServer):
    """Responses bodies answered by the backend's `create_response`, else translated to chat."""

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Response object of one body; the backend's errors pass through."""
        native = getattr(self.backend, "create_response", None)
        if native is not None:
            answer: dict[str, Any] = await native(body)
            return answer
        request = ResponseBody.model_validate(body)
        completion = await self.backend.chat_completion(chat_body(request))
        return ResponseObject.from_chat(request, completion).model_dump()


class Responses(ChatCompletions):
    """The Responses endpoint (see the module docstring); the model is read as chat's."""

    template = RESPONSES_ENDPOINT
    pattern = re.compile(re.escape(RESPONSES_ENDPOINT))
    body_model = ResponseBody
    result_model = ResponseObject
    plain_body = None

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """See `check_response_body`."""
        return check_response_body(body, line)

    def server(self, backend: Any) -> Server:
        """A `ResponsesServer` on the backend."""
        return ResponsesServer(backend)

    def usage(self, result: dict[str, Any]) -> Usage:
        """`usage.input_tokens` in, `usage.output_tokens` out, `usage.input_tokens_details.cached_tokens`
        cached (0 where absent)."""
        usage = result.get("usage") or {}
        cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        return Usage(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0), cached)
