"""Who is calling: the request's bearer API key, resolved to its account.

Clients send `Authorization: Bearer <key>`, as with OpenAI's API
(https://platform.openai.com/docs/api-reference/authentication). A missing, unknown or revoked key is
401 `invalid_api_key`. Every route scopes its reads and writes by `current_account()`: another
account's batch or file is answered as if it did not exist (404), and never listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from aws_lambda_powertools.event_handler import Response

from batchinfer.api.console import is_console
from batchinfer.api.errors import ApiError
from batchinfer.data import accounts
from batchinfer.data.items import ApiKey
from batchinfer.wire.bearer import WWW_AUTHENTICATE, bearer_token

# Served without a key: the API's own description.
# The Message Batches routes (Anthropic's dialect) take the key as `x-api-key` too, as older
# `anthropic` SDKs send it.
API_KEY_PATHS = "/v1/messages/"
OPEN_PATHS = frozenset({"/v1/openapi.json", "/v1/swagger"})

_caller: ContextVar[ApiKey | None] = ContextVar("batchinfer_caller", default=None)


class Unauthorized(ApiError):
    """401 with `WWW-Authenticate: Bearer` (RFC 6750)."""

    status = 401

    def __init__(self, message: str, code: str = "invalid_api_key") -> None:
        super().__init__(message, code=code, headers=dict(WWW_AUTHENTICATE))


def idempotency_key(headers: dict[str, str]) -> str | None:
    """The request's `Idempotency-Key` header (any case), or None. A create carrying one names its
    object by (account, key), so a retry returns what the first attempt created (Stripe's and
    Stainless SDKs' header; the `openai` SDK sends it when given `extra_headers`).
    Raises `ApiError` (400 `invalid_idempotency_key`) unless it is 1 to 255 printable characters."""
    key = next((value for name, value in headers.items() if name.lower() == "idempotency-key"), None)
    if key is not None and not (1 <= len(key) <= 255 and key.isprintable()):
        raise ApiError(
            "Idempotency-Key must be 1 to 255 printable characters",
            code="invalid_idempotency_key",
            param="Idempotency-Key",
        )
    return key


def authenticate(headers: dict[str, str], *, x_api_key: bool = False) -> ApiKey:
    """The live API key of a request's headers (`x_api_key`: an `x-api-key` header too, when there is
    no bearer token); raises `Unauthorized`."""
    token = bearer_token(headers)
    if token is None and x_api_key:
        token = next((v.strip() for k, v in headers.items() if k.lower() == "x-api-key"), None) or None
    if token is None:
        value = next((v for k, v in headers.items() if k.lower() == "authorization"), "").strip()
        if value and value.partition(" ")[0].lower() != "bearer":
            raise Unauthorized(
                "The Authorization header has no 'Bearer' scheme: send the key as "
                "'Authorization: Bearer YOUR_KEY'.",
                code="missing_api_key",
            )
        raise Unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    key = accounts.authenticate(token)
    if key is None:
        # OpenAI shows the key's first and last characters; a short preview is enough to spot a typo.
        shown = f"{token[:6]}...{token[-4:]}" if len(token) > 12 else "***"
        raise Unauthorized(f"Incorrect API key provided: {shown}.")
    return key


@contextmanager
def request_scope() -> Iterator[None]:
    """Each request starts unauthenticated (one Lambda environment serves requests one after another)."""
    token = _caller.set(None)
    try:
        yield
    finally:
        _caller.reset(token)


def auth_middleware(app: Any, next_middleware: Callable[..., Response]) -> Response:
    """Powertools middleware: authenticate every route but the open ones (`is_open`), then call the route."""
    path = app.current_event.path
    if not is_open(path):
        _caller.set(authenticate(dict(app.current_event.headers or {}), x_api_key=takes_api_key(path)))
    return next_middleware(app)


def is_open(path: str) -> bool:
    """True for a path served without a key: the API's description and the web console's files
    (the console's page asks for the key and sends it to /v1 itself)."""
    return path in OPEN_PATHS or is_console(path)


def takes_api_key(path: str) -> bool:
    """True for a path whose routes take an `x-api-key` header as well as a bearer token."""
    return path.startswith(API_KEY_PATHS) or path == API_KEY_PATHS.rstrip("/")


def authenticated() -> bool:
    """True once this request's key has been accepted."""
    return _caller.get() is not None


def current_account() -> str:
    """The caller's account id. Raises RuntimeError outside an authenticated request."""
    key = _caller.get()
    if key is None:
        raise RuntimeError("no authenticated caller in this request")
    return key.account_id
