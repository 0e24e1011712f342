"""The HTTP backend: any server speaking OpenAI's `POST /chat/completions` (vLLM, TGI, Ollama, ...).

It sends one request and maps the outcome to a `chat.completion` dict or a `BackendError`; it never
retries (the shard worker owns retries and their budget), it only says whether a retry may succeed.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
import weakref
from typing import TYPE_CHECKING, Any

import httpx

from batchinfer.backends.base import BackendError
from batchinfer.backends.common import HTTP_POOL_LIMITS, require_utf8

if TYPE_CHECKING:
    from batchinfer.backends.registry import OpenAICompatConfig

__all__ = ["OpenAICompatBackend", "parse_retry_after"]

# 408 and 429 are the 4xx that RFC 9110 / RFC 6585 describe as "try again later".
_RETRYABLE_4XX = frozenset({408, 429})
_MAX_ERROR_TEXT = 500


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header value, or None when absent or unparsable.

    RFC 9110 §10.2.3 allows delay-seconds (`"120"`) or an HTTP-date (`"Wed, 21 Oct 2015 07:28:00 GMT"`,
    counted from `now`, Unix seconds, default the current time; a past date gives 0.0).
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # RFC 9110: HTTP-dates are always GMT
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if seconds == seconds else None  # NaN -> None


def _upstream_error(response: httpx.Response) -> tuple[str, str | None, str | None, str | None]:
    """(message, type, code, param) from an error response of any common server flavour."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):  # OpenAI, vLLM
            code = error.get("code")
            return (
                error["message"],
                error.get("type") if isinstance(error.get("type"), str) else None,
                str(code) if code is not None else None,
                error.get("param") if isinstance(error.get("param"), str) else None,
            )
        if isinstance(error, str):  # TGI ({"error", "error_type"}), Ollama
            return (
                error,
                None,
                data.get("error_type") if isinstance(data.get("error_type"), str) else None,
                None,
            )
        for key in ("message", "detail"):  # FastAPI, generic
            if key in data:
                detail = data[key]
                return (
                    (detail if isinstance(detail, str) else json.dumps(detail))[:_MAX_ERROR_TEXT],
                    None,
                    None,
                    None,
                )
    text = response.text.strip()[:_MAX_ERROR_TEXT]
    return text or f"HTTP {response.status_code} {response.reason_phrase}", None, None, None


class OpenAICompatBackend:
    """A `ChatBackend` answering as registry model `name` by forwarding to an OpenAI-compatible server.

    The body goes to `{base_url}/chat/completions` with `model` replaced by the upstream name and any
    `stream` flag removed (a batch never streams); the answer comes back with `model` set to `name`.
    Construction raises `RegistryError` when `api_key_env` names an unset environment variable.
    """

    def __init__(self, name: str, config: OpenAICompatConfig) -> None:
        from batchinfer.backends.registry import RegistryError

        self.name = name
        self.config = config
        self.url = str(config.base_url).rstrip("/") + "/chat/completions"
        self.timeout = config.timeout
        api_key: str | None = None
        if config.api_key is not None:
            api_key = config.api_key.get_secret_value()
        elif config.api_key_env is not None:
            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise RegistryError(
                    f"model '{name}': environment variable {config.api_key_env} (api_key_env) is not set"
                )
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # An AsyncClient's pool belongs to the event loop that used it; a Lambda may run a new loop per
        # invocation (asyncio.run), so keep one client per live loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(headers=self._headers, timeout=httpx.Timeout(self.timeout),
                                       limits=HTTP_POOL_LIMITS)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the running loop's HTTP client (a later request opens a new one)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send one chat completions body upstream; return its `chat.completion` with our model name.

        Raises `BackendError`:
        - 400 `invalid_encoding`: a string of `body` is not valid Unicode (never sent);
        - the upstream 4xx with its message/type/code/param (408 and 429 retryable, with
          `retry_after` from Retry-After);
        - the upstream 5xx, retryable, with `retry_after`;
        - 502 `bad_response`, retryable: a 2xx whose body is not a JSON chat completion;
        - 502 `upstream_unavailable`, retryable: connection refused/reset, protocol errors;
        - 504 `timeout`, retryable: no full answer within `timeout` seconds.
        """
        require_utf8(body)
        payload = {key: value for key, value in body.items() if key not in ("stream", "stream_options")}
        payload["model"] = self.config.model
        try:
            async with asyncio.timeout(self.timeout):
                response = await self._client().post(self.url, json=payload)
        except (TimeoutError, httpx.TimeoutException):
            raise BackendError(
                504,
                f"The model server did not answer within {self.timeout:g} s.",
                type="server_error",
                code="timeout",
                retryable=True,
            ) from None
        except httpx.TransportError as exc:
            raise BackendError(
                502,
                f"Cannot reach the model server: {type(exc).__name__}: {exc}",
                type="server_error",
                code="upstream_unavailable",
                retryable=True,
            ) from None
        status = response.status_code
        if 200 <= status < 300:
            return self._completion(response)
        message, err_type, code, param = _upstream_error(response)
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        if status in _RETRYABLE_4XX or status >= 500:
            if status == 429:  # OpenAI's own rate-limit error: type "requests", code "rate_limit_exceeded"
                err_type, code = err_type or "requests", code or "rate_limit_exceeded"
            raise BackendError(
                status,
                message,
                type=err_type or "server_error",
                code=code,
                param=param,
                retryable=True,
                retry_after=retry_after,
            )
        if 400 <= status < 500:
            raise BackendError(
                status, message, type=err_type or "invalid_request_error", code=code, param=param
            )
        raise BackendError(
            502,
            f"The model server answered with unexpected HTTP {status}: {message}",
            type="server_error",
            code="bad_response",
        )

    def _completion(self, response: httpx.Response) -> dict[str, Any]:
        try:
            data = response.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise BackendError(
                502,
                f"The model server sent malformed JSON: {exc}",
                type="server_error",
                code="bad_response",
                retryable=True,
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise BackendError(
                502,
                "The model server's answer is not a chat completion (no 'choices' list).",
                type="server_error",
                code="bad_response",
                retryable=True,
            )
        data["model"] = self.name
        return data
