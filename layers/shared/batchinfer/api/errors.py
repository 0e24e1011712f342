"""API errors and their OpenAI error envelope (https://platform.openai.com/docs/guides/error-codes)."""

from __future__ import annotations

from typing import Any

from batchinfer.wire.openai import ErrorEnvelope


class ApiError(Exception):
    """An error answered as `{"error": {message, type, param, code}}` with HTTP `status`."""

    status = 400
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param
        self.headers = headers or {}
        if status is not None:
            self.status = status


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class TooManyRequests(ApiError):
    """429 with `Retry-After` (seconds); OpenAI's rate-limit envelope has type `requests`."""

    status = 429
    type = "requests"

    def __init__(self, message: str, *, code: str, retry_after: int) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after)})


_DESCRIPTIONS = {
    400: "Bad request (OpenAI error envelope; `param` names the field)",
    401: "Missing, unknown or revoked API key",
    403: "A bucket outside the account's allowlist",
    404: "No such object for this account",
    409: "The object is in a state that does not allow this",
    429: "Over a rate limit; see Retry-After",
}


def documented(
    success: dict[str, Any] | None = None, *codes: int, links: dict[str, dict[str, Any]] | None = None
) -> dict[int, dict[str, Any]]:
    """OpenAPI `responses` of a route: its success response (default: 200 with the return type)
    with `links` (see `batchinfer.api.links`), plus 400, 401 and `codes`, each an `ErrorEnvelope`."""
    responses: dict[int, dict[str, Any]] = {200: success or {"description": "Successful Response"}}
    if links:
        responses[200] = {**responses[200], "links": links}
    for code in sorted({400, 401, *codes}):
        responses[code] = {
            "description": _DESCRIPTIONS[code],
            "content": {"application/json": {"model": ErrorEnvelope}},
        }
        if code == 429:
            responses[code]["headers"] = {
                "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
            }
    return responses
