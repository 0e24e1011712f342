"""The one protocol every model backend implements; backends know nothing of batches."""

from __future__ import annotations

from typing import Any, Protocol


class BackendError(Exception):
    """A request the backend rejected or could not serve.

    `status_code` is the HTTP status to report in the result line (4xx: the request is at fault,
    5xx: the backend is), `code`/`message` fill the OpenAI error body, and `retryable` says whether
    trying again may succeed (429, 5xx, timeouts, connection resets).
    """

    def __init__(self, status_code: int, message: str, *, code: str | None = None,
                 type: str = "invalid_request_error", param: str | None = None,
                 retryable: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.code = code
        self.type = type
        self.param = param
        self.retryable = retryable
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The OpenAI error envelope `{"error": {message, type, param, code}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ChatBackend(Protocol):
    """A model that answers OpenAI `/v1/chat/completions` request bodies."""

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Return a `chat.completion` object (with `usage`) for a request body; raise `BackendError`."""
        ...
