"""The resolver: one `app` owning the routes, authentication, and the mapping of errors to OpenAI envelopes.

The OpenAPI document is served at `GET /v1/openapi.json` (and a Swagger UI at `/v1/swagger`), both
without a key; every other route needs `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer, Server
from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.api import anthropic, auth, batches, files, models, results, retries, uploads
from batchinfer.api.console import router as console_router
from batchinfer.api.errors import ApiError, ServiceUnavailable, aws_unavailable, over_quota
from batchinfer.core.observability import logger
from batchinfer.data.storage import QuotaExceeded
from batchinfer.wire import strict_json
from batchinfer.wire.messages import describe, loc_path
from batchinfer.wire.openai import PATTERN_RULES, ErrorBody, ErrorEnvelope
from batchinfer.wire.strict_json import JsonErrorKind

TITLE, VERSION = "batchinfer", "0.1.0"
# /v2 is another function's resolver (TokenInferFunction, `batchinfer.infer.app`) on the same HTTP API:
# this document says where it is rather than describing KServe's contract a second time.
DESCRIPTION = (
    "The OpenAI-compatible Batch API (/v1). The same HTTP API also serves token inference in the "
    "KServe v2 / MindIE shape, not described here: POST /v2/models/{model}/infer, GET /v2, "
    "/v2/health/live, /v2/health/ready, /v2/models/{model} and /v2/models/{model}/ready "
    "(https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/); errors there are "
    '{"error": "..."}.'
)
_BEARER = HTTPBearer(description="an API key: `batchinfer keys create`")
_SECURITY = {"security_schemes": {"bearerAuth": _BEARER}, "security": [{"bearerAuth": []}]}


def load_body(text: str) -> Any:
    """Parse a JSON request body strictly (Powertools' `json_body_deserializer`; see `strict_json`).

    Everything that is not plain JSON raises `json.JSONDecodeError`, which request validation turns
    into a 400 `invalid_json`: NaN and Infinity, integers longer than Python converts (4300 digits),
    and values nested deeper than `MAX_JSON_DEPTH` levels (which would otherwise exhaust the
    recursion limit while parsing or validating, a 500).
    """
    try:
        return strict_json.loads(text)
    except strict_json.JsonError as error:  # its `str` names the place of a syntax error
        message = f"the body is {error.msg}" if error.kind is JsonErrorKind.TOO_DEEP else str(error)
        raise json.JSONDecodeError(message, text, error.pos or 0) from None


class BatchApiResolver(APIGatewayHttpResolver):
    """The HTTP API resolver; each request starts unauthenticated (see `auth.request_scope`)."""

    def resolve(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        with auth.request_scope():
            return super().resolve(event, context)


app = BatchApiResolver(enable_validation=True, json_body_deserializer=load_body)
app.use(middlewares=[auth.auth_middleware])
app.include_router(files.router)
app.include_router(uploads.router)
app.include_router(batches.router)
app.include_router(models.router)
app.include_router(anthropic.router)
app.include_router(retries.router)
app.include_router(results.router)
app.enable_swagger(
    path="/v1/swagger",
    title=TITLE,
    version=VERSION,
    description=DESCRIPTION,
    servers=[Server(url="/")],
    **_SECURITY,
)


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi_document():
    """The OpenAPI 3.1 document of this API (the same one the Swagger UI shows)."""
    body = app.get_openapi_json_schema(
        title=TITLE, version=VERSION, description=DESCRIPTION, servers=[Server(url="/")], **_SECURITY
    )
    return Response(status_code=200, content_type="application/json", body=body)


# The web console's page and files (served without a key: `auth.is_open`).
app.include_router(console_router)


def _envelope(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> Response:
    if auth.takes_api_key(app.current_event.path):  # the Message Batches routes: Anthropic's envelope
        return anthropic.error_response(status, body.message, headers)
    return Response(
        status_code=status,
        content_type="application/json",
        headers=headers or {},
        body=ErrorEnvelope(error=body).model_dump_json(),
    )


@app.exception_handler(ApiError)
def _api_error(error: ApiError) -> Response:
    return _envelope(
        error.status,
        ErrorBody(message=error.message, type=error.type, param=error.param, code=error.code),
        error.headers,
    )


@app.exception_handler(QuotaExceeded)
def _over_quota(error: QuotaExceeded) -> Response:
    return _api_error(over_quota(error))


def _unauthenticated() -> Response | None:
    """The 401 for a request that failed before the auth middleware ran, if its key is bad; else None.

    Request validation runs before any middleware; a caller without a valid key must learn that first,
    as OpenAI's API answers 401 before looking at the request.
    """
    if auth.authenticated() or auth.is_open(app.current_event.path):
        return None
    try:
        path = app.current_event.path
        auth.authenticate(dict(app.current_event.headers or {}), x_api_key=auth.takes_api_key(path))
    except ApiError as error:
        return _api_error(error)
    except Exception as error:  # the key's lookup itself failed (raised here, it would be Lambda's 500)
        if aws_unavailable(error) is None:
            raise
        return _unavailable(error)
    return None


@app.exception_handler(RequestValidationError)
def _invalid_request(error: RequestValidationError) -> Response:
    if (denied := _unauthenticated()) is not None:
        return denied
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":  # its `loc` is ("body", <character offset>): no field
        return _envelope(
            400,
            ErrorBody(
                message=f"request body is not valid JSON: {first['ctx']['error']}", code="invalid_json"
            ),
        )
    # Name the first offending field the way OpenAI does: `param` is its path in the body.
    location = [p for p in first.get("loc", ()) if p not in ("body", "query", "path", "header", "form")]
    param = loc_path(location) or None
    message = first.get("msg", "invalid request")
    if first.get("type") == "string_pattern_mismatch" and first["ctx"]["pattern"] in PATTERN_RULES:
        message = f"{describe(first.get('input'))} {PATTERN_RULES[first['ctx']['pattern']]}"
    if param:
        message = f"{param}: {message}"
    return _envelope(400, ErrorBody(message=message, param=param, code="invalid_request"))


@app.exception_handler(RequestUnsupportedContentType)
def _unsupported_content_type(error: RequestUnsupportedContentType) -> Response:
    if (denied := _unauthenticated()) is not None:
        return denied
    content_type = app.current_event.headers.get("content-type", "")
    return _envelope(
        400,
        ErrorBody(
            message=f"Unsupported Content-Type {content_type[:100]!r}: send "
            "application/json (or multipart/form-data to /v1/files).",
            code="unsupported_content_type",
        ),
    )


@app.exception_handler(json.JSONDecodeError)
def _bad_json(error: json.JSONDecodeError) -> Response:
    if (denied := _unauthenticated()) is not None:
        return denied
    return _envelope(
        400, ErrorBody(message=f"request body is not valid JSON: {error.msg}", code="invalid_json")
    )


@app.not_found
def _not_found(error: NotFoundError) -> Response:
    return _envelope(
        404,
        ErrorBody(
            message=f"no route for {app.current_event.http_method} {app.current_event.path}", code="not_found"
        ),
    )


def _unavailable(error: Exception) -> Response:
    """The 503 of AWS shedding load past botocore's retries (`errors.aws_unavailable`), logged as a
    warning with its AWS code: the caller retries (the `openai` SDK by itself), nothing is broken."""
    logger.warning(
        "AWS unavailable", extra={"aws_error_code": aws_unavailable(error), "exception": type(error).__name__}
    )
    return _api_error(ServiceUnavailable())


@app.exception_handler(Exception)
def _unexpected(error: Exception) -> Response:
    if aws_unavailable(error) is not None:
        return _unavailable(error)
    # Before authentication, only the request itself can have failed to parse (a multipart body without
    # a boundary, a body that is not UTF-8...): the caller's mistake, a 400. After it, it is our bug.
    if not auth.authenticated() and isinstance(error, ValueError):
        if (denied := _unauthenticated()) is not None:
            return denied
        reason = "it is not valid UTF-8" if isinstance(error, UnicodeDecodeError) else str(error)[:200]
        return _envelope(
            400, ErrorBody(message=f"the request could not be read: {reason}", code="invalid_request")
        )
    logger.exception("unhandled error")
    return _envelope(500, ErrorBody(message="internal error", type="server_error", code="internal_error"))
