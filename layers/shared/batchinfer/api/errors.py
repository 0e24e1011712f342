"""API errors and their OpenAI error envelope (https://platform.openai.com/docs/guides/error-codes)."""

from __future__ import annotations


class ApiError(Exception):
    """An error answered as `{"error": {message, type, param, code}}` with HTTP `status`."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 status: int | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param
        self.headers = headers or {}
        if status is not None:
            self.status = status


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409
