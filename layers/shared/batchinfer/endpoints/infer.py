"""`/v2/models/{model}/infer`: KServe v2 token requests (MindIE's token interface) on one model.

Line urls name the model (`/v2/models/<name>/infer`); the body is the token request of
`wire.kserve` (checked without the model here; what needs the model is checked by the worker, as a
per-line 400), served by `batchinfer.infer.service.TokenRequests` on the model's token backend. The
result is a `wire.kserve.InferResponse`, which carries no usage: token batches count no tokens.
"""

from __future__ import annotations

import re
from typing import Any

from batchinfer.endpoints.base import Endpoint, Server, Usage
from batchinfer.infer.service import TokenRequests
from batchinfer.wire.kserve import InferError, InferRequestBody, InferResponse, parse_infer_request
from batchinfer.wire.line_errors import ErrorCode, LineError

__all__ = ["TokenInfer", "check_infer_body"]


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


class TokenInfer(Endpoint):
    """The token inference endpoint (see the module docstring)."""

    template = "/v2/models/{model}/infer"
    pattern = re.compile(r"/v2/models/(?P<model>[^/]+)/infer")
    model_param = "url"
    body_model = InferRequestBody
    result_model = InferResponse

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        """See `check_infer_body`."""
        return check_infer_body(body, line)

    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        """The `{model}` of the url."""
        return match["model"]

    def server(self, backend: Any) -> Server:
        """`TokenRequests` on the backend (a 400 per line when the model takes no token ids)."""
        return TokenRequests(backend)

    def usage(self, result: dict[str, Any]) -> Usage:
        """Nothing: a KServe v2 response has no usage."""
        return Usage()
