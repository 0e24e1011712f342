"""The endpoints a batch may call, how a line's url is matched to one, and each one's body checks.

- `/v1/chat/completions`: line urls the same, bodies `wire.chat.ChatCompletionBody`, the model in
  `body.model`.
- `/v2/models/{model}/infer`: line urls `/v2/models/<name>/infer`, the model in the url, bodies the
  KServe v2 token request (`wire.kserve.parse_infer_request` without a model).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from batchinfer.validation.errors import ErrorCode, LineError, line_errors
from batchinfer.wire.chat import RULES, ChatCompletionBody, plain_chat_body
from batchinfer.wire.kserve import InferError, parse_infer_request
from batchinfer.wire.messages import safe
from batchinfer.wire.openai import CHAT_ENDPOINT

__all__ = [
    "ENDPOINTS",
    "OTHER_OPENAI_URLS",
    "Endpoint",
    "check_chat_body",
    "check_infer_body",
    "find_endpoint",
    "url_hint",
]


def check_chat_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v1/chat/completions` body (empty when valid); see `ChatCompletionBody`."""
    if plain_chat_body(body):
        return []
    errors = []
    if body.get("stream") is True:
        errors.append(
            LineError(
                code=ErrorCode.STREAMING_UNSUPPORTED,
                message=f'Line {line}: "stream": true is not supported in a batch; '
                "remove it or set it to false.",
                param="body.stream",
                line=line,
            )
        )
    try:
        ChatCompletionBody.model_validate(body)
    except ValidationError as exc:
        errors += line_errors(exc, line, "body.", RULES)
    return errors


def check_infer_body(body: dict[str, Any], line: int) -> list[LineError]:
    """Errors of a `/v2/models/{model}/infer` body (KServe v2 token request; empty when valid).

    The model-independent rules of `batchinfer.wire.kserve.parse_infer_request` (structure, types,
    ranges, shape against data, UINT32 ids); the first problem is reported, with `param`
    `body.<path>`. What needs the model (ids below its vocabulary size, the prompt-length limit, the
    input name "input0") is checked by the worker, as a per-line 400 in error.jsonl.
    """
    try:
        parse_infer_request(body)
    except InferError as error:
        code = ErrorCode.MISSING_REQUIRED_PARAMETER if error.missing else ErrorCode.INVALID_PARAMETER
        param = f"body.{error.param}" if error.param else "body"
        return [LineError(code=code, message=f"Line {line}: body: {error.message}", param=param, line=line)]
    return []


def _body_model(match: re.Match[str], body: dict[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) and model else None


def _url_model(match: re.Match[str], body: dict[str, Any]) -> str | None:
    return match["model"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A url this service serves in batches, and how its request lines are checked.

    `template` is the batch's `endpoint` value; `pattern` matches the urls of request lines;
    `check_body(body, line)` returns the body's errors; `model_of(match, body)` finds the model name
    (`None` when absent) and `model_param` is where it comes from, for error messages.
    """

    template: str
    pattern: re.Pattern[str]
    check_body: Callable[[dict[str, Any], int], list[LineError]]
    model_of: Callable[[re.Match[str], dict[str, Any]], str | None]
    model_param: str


ENDPOINTS: dict[str, Endpoint] = {
    e.template: e
    for e in (
        Endpoint(
            CHAT_ENDPOINT, re.compile(re.escape(CHAT_ENDPOINT)), check_chat_body, _body_model, "body.model"
        ),
        Endpoint(
            "/v2/models/{model}/infer",
            re.compile(r"/v2/models/(?P<model>[^/]+)/infer"),
            check_infer_body,
            _url_model,
            "url",
        ),
    )
}
# Endpoints of the OpenAI Batch API that this service does not serve: a line naming one of them is
# in the wrong batch (`url_mismatch`), not a typo (`invalid_url`).
OTHER_OPENAI_URLS = frozenset({"/v1/responses", "/v1/embeddings", "/v1/completions", "/v1/moderations"})


def find_endpoint(url: str) -> tuple[Endpoint, re.Match[str]] | None:
    """The endpoint whose pattern matches the whole `url`, with the match; None when none does."""
    for endpoint in ENDPOINTS.values():
        if match := endpoint.pattern.fullmatch(url):
            return endpoint, match
    return None


def url_hint(url: str) -> str:
    """What to use instead of an unknown url: the fix for a missing slash, or the closest match."""
    known = [*ENDPOINTS, *sorted(OTHER_OPENAI_URLS)]
    if not url.startswith("/") and find_endpoint("/" + url):
        return f'urls start with "/": use "/{safe(url)}".'
    if close := difflib.get_close_matches(url, known, n=1, cutoff=0.8):
        return f'did you mean "{close[0]}"?'
    return "known urls: " + ", ".join(f'"{u}"' for u in ENDPOINTS)
