"""A thin HTTP client of the Batch API (local stack or deployed stack alike), on httpx.

Every failure is one exception type the CLI can print as one line: `ApiError` (an HTTP answer of
4xx/5xx, with the server's OpenAI error envelope `{"error": {"message", "type", "param", "code"}}`
read out, or API Gateway's `{"message": ...}`) or `Unreachable` (no answer at all).

A 5xx answer (a 503: the service's storage shedding load; a 500, 502 or 504: a failed or timed-out
invocation, e.g. on an overloaded stack) is retried after its `Retry-After`, as the `openai` SDK does
(tenacity), unless it says `x-should-retry: false`; creates send an `Idempotency-Key` (one per call,
the same on its retries), so a retry never makes a second file or batch.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

TERMINAL = {"completed", "failed", "expired", "cancelled"}

# Files above this go through the Uploads API: a request carries at most 6 MB into Lambda, and
# API Gateway base64-encodes a multipart body (4/3 of its size) in the invocation event.
SINGLE_REQUEST_BYTES = 4 * 1024 * 1024
# Attempts of a request answered 5xx (the openai SDK's default is 3): the API has already retried
# each AWS call 5 times, so a 5xx is rare and two in a row rarer still.
UNAVAILABLE_ATTEMPTS = 5
# The statuses tried again (the openai SDK retries every status >= 500; 501 would answer the same).
RETRIED_STATUSES = frozenset({500, 502, 503, 504})
# The wait before retrying a 5xx without a usable `Retry-After` (seconds), and the longest one honoured.
DEFAULT_RETRY_AFTER_S, MAX_RETRY_AFTER_S = 1.0, 60.0


class ApiError(Exception):
    """The API answered with an error status.

    Attributes: `status` (HTTP status), `message` (the server's own message), `code` and `param`
    (OpenAI envelope fields, None when absent), `url` (the request's URL).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        url: str = "",
        retry_after: float | None = None,
        should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.url = status, message, code, param, url
        self.retry_after = retry_after  # seconds, from the `Retry-After` header (None: absent or a date)
        self.should_retry = should_retry  # the `x-should-retry` header (None: absent)

    @property
    def retryable(self) -> bool:
        """Worth another attempt: a status in `RETRIED_STATUSES` unless the server said not to."""
        return self.status in RETRIED_STATUSES if self.should_retry is None else self.should_retry

    @classmethod
    def of(cls, response: httpx.Response) -> ApiError:
        """Read the error out of `response`: OpenAI's envelope, KServe's `{"error": "..."}` or API
        Gateway's `{"message": "..."}`; else the status line."""
        message, code, param = response.reason_phrase or f"HTTP {response.status_code}", None, None
        try:
            body = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if isinstance(body, dict):
            error = body.get("error")
            if isinstance(error, dict):
                message = str(error.get("message") or message)
                code, param = error.get("code"), error.get("param")
            elif isinstance(error, str):
                message = error
            elif isinstance(body.get("message"), str):
                message = body["message"]
        elif response.text.strip():
            message = response.text.strip().splitlines()[0][:300]
        try:
            retry_after: float | None = float(response.headers.get("retry-after", ""))
        except ValueError:
            retry_after = None
        should_retry = {"true": True, "false": False}.get(response.headers.get("x-should-retry", ""))
        return cls(
            response.status_code,
            message,
            code=code,
            param=param,
            url=str(response.request.url),
            retry_after=retry_after,
            should_retry=should_retry,
        )


def _retry_after(state: RetryCallState) -> float:
    """Seconds before the next attempt: the answer's `Retry-After` (within 0 and `MAX_RETRY_AFTER_S`)."""
    error = state.outcome.exception() if state.outcome else None
    seconds = getattr(error, "retry_after", None)
    if seconds is None or not math.isfinite(seconds):
        return DEFAULT_RETRY_AFTER_S
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class Unreachable(Exception):
    """No HTTP answer at all from `url` (connection refused, DNS, timeout)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url, self.reason = url, reason


class BatchClient:
    """Calls `<base_url>/files`, `/uploads`, `/batches` and `/models`; `base_url` ends in `/v1`.

    Raises `ApiError` on a 4xx/5xx answer and `Unreachable` when no answer came.
    `single_request_bytes`: files larger than this are sent through the Uploads API (default
    `SINGLE_REQUEST_BYTES`).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        single_request_bytes: int | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.single_request_bytes = single_request_bytes or SINGLE_REQUEST_BYTES
        self.http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, follow_redirects=True
        )

    @contextmanager
    def _calling(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as error:
            url = str(error.request.url) if error.request else self.base_url
            raise Unreachable(
                url, f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            ) from None

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request to `path` (relative to base_url, or absolute), tried again after `Retry-After`
        while its answer is `ApiError.retryable`, up to `UNAVAILABLE_ATTEMPTS` times; raises ApiError on
        >= 400."""
        for attempt in Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, ApiError) and e.retryable),
            stop=stop_after_attempt(UNAVAILABLE_ATTEMPTS),
            wait=_retry_after,
            reraise=True,
        ):
            with attempt:
                with self._calling():
                    response = self.http.request(method, path, **kwargs)
                if response.status_code >= 400:
                    raise ApiError.of(response)
        return response

    def _create(self, path: str, **kwargs: Any) -> Any:
        """POST a create with a fresh `Idempotency-Key`: its retries return the first attempt's object."""
        return self._json("POST", path, headers={"Idempotency-Key": str(uuid.uuid4())}, **kwargs)

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    # ------------------------------------------------------------------ files
    def upload(self, path: Path) -> dict[str, Any]:
        """Upload `path` as a `purpose=batch` File: one POST /files, or the Uploads API above
        `single_request_bytes`. Returns the File object. Raises FileNotFoundError for a missing path."""
        size = path.stat().st_size
        if size > self.single_request_bytes:
            return self.upload_large(path, size)
        # Bytes, not the open file: a retry sends them again (at most `single_request_bytes`).
        return self._create(
            "/files",
            data={"purpose": "batch"},
            files={"file": (path.name, path.read_bytes(), "application/jsonl")},
        )

    def upload_large(self, path: Path, size: int) -> dict[str, Any]:
        """POST /uploads, PUT the bytes to its presigned `upload_url`, then complete: the File object."""
        upload = self._json(
            "POST",
            "/uploads",
            json={"filename": path.name, "purpose": "batch", "bytes": size, "mime_type": "application/jsonl"},
        )
        with path.open("rb") as handle, self._calling():
            put = httpx.put(
                upload["upload_url"], content=handle, headers=upload.get("upload_headers") or {}, timeout=300
            )
        if put.status_code >= 400:
            raise ApiError.of(put)
        done = self._json("POST", f"/uploads/{upload['id']}/complete", json={})
        return done["file"]

    def files(self, *, purpose: str | None = None, limit: int = 100) -> dict[str, Any]:
        """GET /files: the list object `{"data": [File, ...], "has_more": ...}`."""
        params: dict[str, Any] = {"limit": limit, **({"purpose": purpose} if purpose else {})}
        return self._json("GET", "/files", params=params)

    def delete_file(self, file_id: str) -> dict[str, Any]:
        """DELETE /files/{id}: `{"id", "object": "file", "deleted": true}`."""
        return self._json("DELETE", f"/files/{file_id}")

    def content(self, file_id: str) -> bytes:
        """GET /files/{id}/content (a 302 to S3 is followed)."""
        return self.request("GET", f"/files/{file_id}/content").content

    def fetch_url(self, url: str) -> bytes:
        """GET a presigned URL (TokenHub's `output_file_url`) without the API key."""
        with self._calling():
            response = httpx.get(url, timeout=self.http.timeout, follow_redirects=True)
        if response.status_code >= 400:
            raise ApiError.of(response)
        return response.content

    # ------------------------------------------------------------------ batches
    def create(
        self,
        input_file_id: str,
        *,
        endpoint: str = "/v1/chat/completions",
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        output_expires_after: int | None = None,
    ) -> dict[str, Any]:
        """POST /batches; `output_expires_after` in seconds after creation (OpenAI's `created_at` anchor)."""
        body: dict[str, Any] = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
        }
        if metadata:
            body["metadata"] = metadata
        if output_expires_after is not None:
            body["output_expires_after"] = {"anchor": "created_at", "seconds": output_expires_after}
        return self._create("/batches", json=body)

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        """GET /batches/{id}: the Batch object."""
        return self._json("GET", f"/batches/{batch_id}")

    def batches(self, *, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        """GET /batches (newest first): the list object."""
        return self._json("GET", "/batches", params={"limit": limit, **({"after": after} if after else {})})

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """POST /batches/{id}/cancel: the Batch object (`cancelling` or already `cancelled`)."""
        return self._json("POST", f"/batches/{batch_id}/cancel")

    def retry(self, batch_id: str) -> dict[str, Any]:
        """POST /batches/{id}/retry: the Batch object of the retry of an ended batch's failed lines
        (the same one on every call)."""
        return self._json("POST", f"/batches/{batch_id}/retry")

    def output_page(self, batch_id: str, after: int = 0) -> tuple[bytes, int, bool, bool]:
        """GET /batches/{id}/output?after=N: the output lines committed so far from line `after` + 1, as
        (JSONL bytes, the next `after`, more lines committed already, the batch ended and these are its
        last lines)."""
        response = self.request("GET", f"/batches/{batch_id}/output", params={"after": after})
        headers = response.headers
        return (
            response.content,
            int(headers["x-batchinfer-next-after"]),
            headers["x-batchinfer-more"] == "true",
            headers["x-batchinfer-complete"] == "true",
        )

    def dry_run(self, input_file_id: str, *, endpoint: str, completion_window: str = "24h") -> dict[str, Any]:
        """POST /batches with `dry_run: true`: the file checked and its cost estimated, nothing created."""
        body = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
            "dry_run": True,
        }
        return self._json("POST", "/batches", json=body)

    # ------------------------------------------------------------------ Message Batches (Anthropic's dialect)
    def create_message_batch(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """POST /messages/batches with `requests` (`{"custom_id", "params"}` each): the MessageBatch."""
        return self._create("/messages/batches", json={"requests": requests})

    def message_batch_results(self, batch_id: str) -> bytes:
        """GET /messages/batches/{id}/results: an ended Message Batch's results as JSON Lines."""
        return self.request("GET", f"/messages/batches/{batch_id}/results").content

    def wait(
        self,
        batch_id: str,
        *,
        poll_s: float = 1.0,
        timeout_s: float = 3600.0,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the batch is terminal; `on_update` sees every polled Batch object.

        Raises TimeoutError after `timeout_s` seconds (the batch itself goes on).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.retrieve(batch_id)
            if on_update:
                on_update(batch)
            if batch["status"] in TERMINAL:
                return batch
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still {batch['status']} after {timeout_s:.0f} s")
            time.sleep(poll_s)
