"""HTTP for the remote model backends (`openai`, `kserve_v2`): one POST of a JSON body, with the
transport's failures and the server's error statuses mapped to `BackendError`s the shard worker
knows how to retry (`upstream_error`, `parse_retry_after`). Nothing here retries: the shard worker
is the one place that does.

The client is aiohttp, one session (connection pool) per event loop. A shard worker keeps tens of
requests in flight all the time; measured side by side against the simulated backend
(`benchmarks/saturation.py`), aiohttp spends ~0.4 ms of CPU per request where httpx 0.28 spends
~2 ms (its pool scans every connection for every request), and Lambda bills that CPU time.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from batchinfer.backends.base import BackendError
from batchinfer.core.observability import logger

__all__ = [
    "RETRYABLE_4XX",
    "Answer",
    "closing",
    "parse_retry_after",
    "post_json",
    "retry_after_of",
    "retryable_status",
    "upstream_error",
]

T = TypeVar("T")

# A session's pool belongs to the loop it was made on: one per live loop, closed when the loop shuts
# down (`_close_at_shutdown`) or by `closing`.
_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, Any]] = (
    weakref.WeakKeyDictionary()
)
_JSON = {"Content-Type": "application/json"}
# 408 and 429 are the 4xx that RFC 9110 / RFC 6585 describe as "try again later".
RETRYABLE_4XX = frozenset({408, 429})
_MAX_ERROR_TEXT = 500


@dataclass(frozen=True, slots=True)
class Answer:
    """A server's whole answer: `status`, `reason` phrase, `headers` (case-insensitive) and `body` bytes."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON; raises ValueError (or UnicodeDecodeError) when it is not JSON."""
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def summary(self) -> str:
        """The body's text for an error message (its first 500 characters), else the status line."""
        return self.text.strip()[:_MAX_ERROR_TEXT] or f"HTTP {self.status} {self.reason}"


async def _close_at_shutdown(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    # An async generator the loop knows of: `asyncio.run` (loop.shutdown_asyncgens) closes it, and
    # with it the session, before the loop closes.
    try:
        yield
    finally:
        await session.close()


PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")


def proxied() -> bool:
    """Whether the environment names an HTTP proxy (`PROXY_VARIABLES`, as urllib and aiohttp read)."""
    return any(os.environ.get(name) for name in PROXY_VARIABLES)


async def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session, _ = _SESSIONS.get(loop, (None, None))
    if session is None or session.closed:
        # No pool limit: the worker's limiter bounds the requests in flight, and a pool that holds
        # fewer connections than that would open and close one per request. trust_env: honour
        # HTTP(S)_PROXY / NO_PROXY, as the other HTTP clients of a deployment do; only when a proxy is
        # set, since with it aiohttp looks up the proxy and ~/.netrc in a thread for every request (two
        # thread hops, ~0.1 ms of CPU each, at thousands of requests/s).
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=proxied())
        closer = _close_at_shutdown(session)
        await anext(closer)
        _SESSIONS[loop] = (session, closer)
    return session


async def post_json(
    url: str, payload: Any, *, timeout: float, headers: Mapping[str, str] | None = None
) -> Answer:
    """POST `payload` as compact UTF-8 JSON to `url`; return the whole answer, whatever its status.

    Raises `UnicodeEncodeError` (nothing sent) when a string of `payload` is not valid Unicode (a lone
    surrogate). Raises `BackendError`, retryable: 504 `timeout` when the answer is not complete within
    `timeout` seconds (connecting included); 502 `upstream_unavailable` when the server cannot be
    reached or breaks the connection or the protocol (its message names the failure, never the host).
    """
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    try:
        async with (await _session()).post(
            url, data=data, headers={**_JSON, **(headers or {})}, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            return Answer(response.status, response.reason or "", response.headers, await response.read())
    except TimeoutError:
        raise BackendError(
            504,
            f"The model server did not answer within {timeout:g} s.",
            type="server_error",
            code="timeout",
            retryable=True,
        ) from None
    except aiohttp.ClientError as error:
        # The tenant's error line says what failed, not where: the server's host and port stay in the log.
        logger.warning("model server unreachable", extra={"error": f"{type(error).__name__}: {error}"})
        raise BackendError(
            502,
            f"Cannot reach the model server ({type(error).__name__}).",
            type="server_error",
            code="upstream_unavailable",
            retryable=True,
        ) from None


async def closing(awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, then close the running loop's HTTP session: for a loop that lives on after
    the call (the shard worker's), so no connection outlives the work it was opened for."""
    try:
        return await awaitable
    finally:
        _, closer = _SESSIONS.pop(asyncio.get_running_loop(), (None, None))
        if closer is not None:
            await closer.aclose()


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
    return max(0.0, seconds) if seconds == seconds else None


def retry_after_of(headers: Any) -> float | None:
    """Seconds to wait from an answer's headers (a case-insensitive mapping), or None: `retry-after-ms`
    (milliseconds; OpenAI and Azure OpenAI send it, the `openai` SDK reads it first) before
    `retry-after` (`parse_retry_after`): whole seconds are far too coarse for a token bucket that
    refills every few milliseconds."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            ms = float(value)
        except ValueError:
            ms = float("nan")
        if ms == ms and ms >= 0:
            return ms / 1000
    return parse_retry_after(headers.get("retry-after"))


def retryable_status(status: int) -> bool:
    """Whether an upstream answer with HTTP `status` may succeed when sent again (408, 429, 5xx)."""
    return status in RETRYABLE_4XX or status >= 500


def upstream_error(
    answer: Answer,
    message: str,
    *,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> BackendError:
    """The `BackendError` for a server's error `answer` (not 2xx), with the server's own `message`
    and, when it gave them, its OpenAI error `type`, `code` and `param`.

    - 408, 429 and 5xx keep their status and are `retryable`, with `retry_after` from the Retry-After
      header; type `server_error` (429: `requests`, code `rate_limit_exceeded`) unless given.
    - Another 4xx keeps its status, not retryable (the request is at fault), type
      `invalid_request_error` unless given.
    - Anything else (1xx, 3xx) is a 502 `bad_response`.
    """
    status = answer.status
    if retryable_status(status):
        if status == 429:  # OpenAI's own rate-limit error: type "requests", code "rate_limit_exceeded"
            type, code = type or "requests", code or "rate_limit_exceeded"
        return BackendError(
            status,
            message,
            type=type or "server_error",
            code=code,
            param=param,
            retryable=True,
            retry_after=retry_after_of(answer.headers),
        )
    if 400 <= status < 500:
        return BackendError(status, message, type=type or "invalid_request_error", code=code, param=param)
    return BackendError(
        502,
        f"The model server answered with unexpected HTTP {status}: {message}",
        type="server_error",
        code="bad_response",
    )
