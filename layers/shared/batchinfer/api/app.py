"""The resolver: one `app` owning the routes and the mapping of errors to OpenAI envelopes."""

from __future__ import annotations

import json

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from batchinfer.api import batches, files
from batchinfer.api.errors import ApiError
from batchinfer.observability import logger
from batchinfer.schemas import ErrorBody, ErrorEnvelope

app = APIGatewayHttpResolver(enable_validation=True)
app.include_router(files.router)
app.include_router(batches.router)
app.enable_swagger(path="/v1/swagger", title="batchinfer", version="0.1.0")


def _envelope(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> Response:
    return Response(status_code=status, content_type="application/json", headers=headers or {},
                    body=ErrorEnvelope(error=body).model_dump_json())


@app.exception_handler(ApiError)
def _api_error(error: ApiError) -> Response:
    return _envelope(error.status, ErrorBody(message=error.message, type=error.type, param=error.param,
                                             code=error.code), error.headers)


@app.exception_handler(RequestValidationError)
def _invalid_request(error: RequestValidationError) -> Response:
    # Name the first offending field the way OpenAI does: `param` is its dotted path in the body.
    first = error.errors()[0] if error.errors() else {}
    location = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header", "form")]
    param = ".".join(location) or None
    message = first.get("msg", "invalid request")
    if param:
        message = f"{param}: {message}"
    return _envelope(400, ErrorBody(message=message, param=param, code="invalid_request"))


@app.exception_handler(json.JSONDecodeError)
def _bad_json(error: json.JSONDecodeError) -> Response:
    return _envelope(400, ErrorBody(message=f"request body is not valid JSON: {error.msg}", code="invalid_json"))


@app.not_found
def _not_found(error: NotFoundError) -> Response:
    return _envelope(404, ErrorBody(message=f"no route for {app.current_event.http_method} {app.current_event.path}",
                                    code="not_found"))


@app.exception_handler(Exception)
def _unexpected(error: Exception) -> Response:
    logger.exception("unhandled error")
    return _envelope(500, ErrorBody(message="internal error", type="server_error", code="internal_error"))
