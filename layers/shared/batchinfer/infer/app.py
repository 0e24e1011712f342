"""The `/v2` resolver: KServe v2 token inference, health and metadata routes (API Gateway HTTP API).

Routes (KServe v2 HTTP/REST, https://kserve.github.io/website/docs/concepts/architecture/data-plane/v2-protocol):

| route                                   | answer                                                       |
|-----------------------------------------|--------------------------------------------------------------|
| `GET /v2`                               | `{"name", "version", "extensions": []}` (server metadata)     |
| `GET /v2/health/live`, `/v2/health/ready` | `{"live": true}`, `{"ready": true}`                        |
| `GET /v2/models/{m}`                    | `{"name", "platform", "inputs", "outputs"}` (model metadata)  |
| `GET /v2/models/{m}/ready`              | `{"name", "ready": true}` once the model is loaded (API key)  |
| `POST /v2/models/{m}/infer`             | token inference, see `batchinfer.wire.kserve` (API key)      |
| `.../versions/{v}/...`                  | 400: model versions are not supported (as in MindIE)          |

Every failure is `{"error": "<message>"}`: 400 for a bad request, 401 without a valid API key (the
same keys as `/v1`, `Authorization: Bearer <key>`, with `WWW-Authenticate: Bearer`), 404 for an
unknown model or route, 429 with `Retry-After` over the account's requests in flight
(`data.inflight`), 504 when a request timed out; only a backend fault is a 5xx. Health and metadata
routes take no key: they cost nothing and tell nothing about any account. A model's readiness loads
the model, so it takes a key and one of the account's slots, as inference does.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from batchinfer.backends import load_registry
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, inflight, keys
from batchinfer.data.items import ApiKey
from batchinfer.infer.service import infer, model_limits, token_backend
from batchinfer.wire.bearer import WWW_AUTHENTICATE, bearer_token
from batchinfer.wire.kserve import DATATYPE, INPUT_NAME, OUTPUT_NAME, InferError, load_json

app = APIGatewayHttpResolver()

SERVER_NAME, SERVER_VERSION = "batchinfer", "0.1.0"  # the version of pyproject.toml
# Leave this much of the Lambda's time to answer when a request has to be cut short.
_ANSWER_MARGIN_S = 1.0
# A slot's lease outlives the invocation by this much (the invocation is killed at its deadline).
_LEASE_MARGIN_S = 5
# Without a Lambda context (tests calling the app directly): the function's 29 s timeout.
_DEFAULT_LEASE_S = 30
# A /v2 request takes seconds: a freed slot is worth asking for again soon.
RETRY_AFTER_S = 1


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(status_code=status, content_type="application/json", body=json.dumps(body))


def _backend(model: str) -> Any:
    return token_backend(load_registry(get_settings().model_registry), model)


def _raw_body() -> str | bytes:
    """The request body as sent: API Gateway base64-encodes bodies that are not UTF-8 text, whose
    decoding `load_json` reports as a 400 (Powertools' `decoded_body` would raise it instead)."""
    event = app.current_event
    if event.is_base64_encoded:
        return base64.b64decode(event.body or "")
    return event.body or ""


def _time_left_s() -> float | None:
    context = app.lambda_context
    if context is None or not hasattr(context, "get_remaining_time_in_millis"):
        return None
    return context.get_remaining_time_in_millis() / 1000 - _ANSWER_MARGIN_S


def _caller() -> ApiKey:
    """The live API key of this request; `InferError(401)` without one."""
    token = bearer_token(dict(app.current_event.headers or {}))
    key = accounts.authenticate(token)
    if key is None:
        message = (
            "no API key: send it as 'Authorization: Bearer YOUR_KEY'"
            if token is None
            else "incorrect API key provided"
        )
        raise InferError(401, message, headers=dict(WWW_AUTHENTICATE))
    return key


def _request_lease_s() -> int:
    context = app.lambda_context
    if context is None or not hasattr(context, "get_remaining_time_in_millis"):
        return _DEFAULT_LEASE_S
    return int(context.get_remaining_time_in_millis() / 1000) + _LEASE_MARGIN_S


def _request_id() -> str:
    return getattr(app.lambda_context, "aws_request_id", None) or app.current_event.request_context.request_id


@app.get("/v2")
def server_metadata() -> Response:
    return _json(200, {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": []})


@app.get("/v2/health/live")
def live() -> Response:
    return _json(200, {"live": True})


@app.get("/v2/health/ready")
def ready() -> Response:
    return _json(200, {"ready": True})


@app.get("/v2/models/<model>")
def model_metadata(model: str) -> Response:
    _backend(model)
    tensor = {"datatype": DATATYPE, "shape": [1, -1]}
    return _json(
        200,
        {
            "name": model,
            "platform": load_registry(get_settings().model_registry).config(model).backend,
            "inputs": [{"name": INPUT_NAME, **tensor}],
            "outputs": [{"name": OUTPUT_NAME, **tensor}],
        },
    )


@contextmanager
def _account_slot(key: ApiKey) -> Iterator[None]:
    """Hold one of the account's `/v2` slots (`max_infer_in_flight`) for the request; `InferError(429)`
    with `Retry-After` when every one is held."""
    limit = accounts.get_account(key.account_id).max_infer_in_flight or get_settings().max_infer_in_flight
    try:
        with inflight.holding(
            keys.infer_slots(key.account_id), limit=limit, owner=_request_id(), lease_s=_request_lease_s()
        ):
            yield
    except inflight.NoSlot:
        raise InferError(
            429,
            f"too many token requests in flight: this account may have {limit} at once; "
            f"retry after {RETRY_AFTER_S} s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None


@app.get("/v2/models/<model>/ready")
def model_ready(model: str) -> Response:
    key = _caller()  # loading a model is work: only for a key, within the account's share
    backend = _backend(model)
    with _account_slot(key):
        asyncio.run(model_limits(backend))  # loads the model: ready means it can answer now
    return _json(200, {"name": model, "ready": True})


@app.post("/v2/models/<model>/infer")
def model_infer(model: str) -> Response:
    key = _caller()  # before anything else: without a key, nothing about the request is answered
    backend = _backend(model)
    body = load_json(_raw_body())
    with _account_slot(key):
        return _json(200, asyncio.run(infer(backend, body, time_limit_s=_time_left_s())))


@app.route("/v2/models/<model>/versions/<version>", method=["GET", "POST"])
@app.route("/v2/models/<model>/versions/<version>/<action>", method=["GET", "POST"])
def model_version(model: str, version: str, action: str = "") -> Response:
    raise InferError(
        400,
        f"model versions are not supported: use /v2/models/{model}/{action or ''}".rstrip("/")
        + f" without /versions/{version}",
    )


@app.exception_handler(InferError)
def _infer_error(error: InferError) -> Response:
    return Response(
        status_code=error.status,
        content_type="application/json",
        headers=error.headers,
        body=json.dumps(error.body()),
    )


@app.not_found
def _not_found(error: NotFoundError) -> Response:
    event = app.current_event
    return _json(404, {"error": f"no route for {event.http_method} {event.path}"})


@app.exception_handler(Exception)
def _unexpected(error: Exception) -> Response:
    logger.exception("unhandled error")
    return _json(500, {"error": "internal error"})
