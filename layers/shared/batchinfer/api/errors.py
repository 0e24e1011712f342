"""API errors and their OpenAI error envelope (https://platform.openai.com/docs/guides/error-codes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from botocore.exceptions import ClientError
from botocore.retries.standard import ThrottledRetryableChecker, TransientRetryableChecker

from batchinfer.data.storage import QuotaExceeded
from batchinfer.data.table import TransactionConflict, cancellation_reasons
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


class InsufficientQuota(ApiError):
    """429 over a storage quota, as OpenAI answers a spent quota (type `insufficient_quota`), with
    `x-should-retry: false`: the `openai` SDK retries a 429 unless told so, and waiting frees nothing."""

    status = 429
    type = "insufficient_quota"


def over_quota(error: QuotaExceeded) -> ApiError:
    """The answer to a store refused by a storage quota: 413 when the object alone is over it (it can
    never fit), else 429 `insufficient_quota` (the running total is: deleting files makes room)."""
    if error.too_large:
        return ApiError(error.message, code=error.code, status=413)
    return InsufficientQuota(error.message, code=error.code, headers={"x-should-retry": "false"})


class ServiceUnavailable(ApiError):
    """503 with `Retry-After`: an AWS call of the request failed past botocore's retries (see
    `aws_unavailable`). Nothing of AWS's own text reaches the caller."""

    status = 503
    type = "server_error"

    def __init__(self) -> None:
        super().__init__(
            "The service is temporarily unavailable (its storage is shedding load); retry the request.",
            code="service_unavailable",
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
        )


# DynamoDB's capacity is per second (read/write units, and the burst an on-demand table absorbs) and so
# is S3's per-prefix request rate: a second later is a fresh second of capacity. botocore has already
# backed off for several seconds (5 attempts), so a longer wait buys little; the `openai` SDK waits
# exactly this long (a Retry-After of 0 < s <= 120 replaces its own backoff).
UNAVAILABLE_RETRY_AFTER_S = 1
# Botocore's own lists (`botocore.retries.standard`, what its standard retry mode retries): throttling
# codes, transient codes and HTTP statuses 500/502/503/504, and no answer at all (its ConnectionError
# family: EndpointConnectionError, ConnectTimeoutError; HTTPClientError: ReadTimeoutError...).
_THROTTLING_CODES = frozenset(ThrottledRetryableChecker._THROTTLED_ERROR_CODES)
_TRANSIENT_CODES = frozenset(TransientRetryableChecker._TRANSIENT_ERROR_CODES)
_TRANSIENT_STATUSES = frozenset(TransientRetryableChecker._TRANSIENT_STATUS_CODES)
_NO_ANSWER = TransientRetryableChecker._TRANSIENT_EXCEPTION_CLS
# A DynamoDB transaction cancelled only for load or contention (the other reasons are "None"):
# https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_TransactWriteItems.html
_TRANSIENT_CANCELLATIONS = frozenset(
    {"None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
)


def aws_unavailable(error: BaseException) -> str | None:
    """The AWS error code (or exception class name) of `error` when it is AWS shedding load or not
    answering, the request worth retrying as it is; None for anything else (a bug: a 500).

    Throttling, transient codes and 5xx statuses are botocore's standard retry mode's own lists
    (`botocore.retries.standard`: `ThrottledRetryableChecker`, `TransientRetryableChecker`), so what
    botocore retried and gave up on is exactly what this names; `TransactionCanceledException` counts
    when every cancellation reason is load or contention, and so does `data.table.TransactionConflict`
    (a transaction conflicting past its retries). E.g. "ProvisionedThroughputExceededException",
    "SlowDown", "ReadTimeoutError".
    """
    if isinstance(error, TransactionConflict):
        return "TransactionConflict"
    if isinstance(error, _NO_ANSWER):
        return type(error).__name__
    if not isinstance(error, ClientError):
        return None
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _THROTTLING_CODES or code in _TRANSIENT_CODES or status in _TRANSIENT_STATUSES:
        return code or str(status)
    if code == "TransactionCanceledException":
        reasons = set(cancellation_reasons(error))
        if reasons <= _TRANSIENT_CANCELLATIONS and reasons != {"None"}:
            return code
    return None


T = TypeVar("T")


def stored_despite(error: Exception, read: Callable[[], T | None]) -> T:
    """What `read()` finds stored when a create's write failed past botocore's retries and yet may
    have taken effect (`aws_unavailable`: a 5xx or a timeout after DynamoDB committed): then the
    create succeeded and that is its answer, where a 503 would have the caller create a second.
    Raises `error` again when it is not AWS being unavailable, when `read()` finds nothing (nothing
    was created: the caller's retry is safe, a 503) or when the read fails too."""
    if aws_unavailable(error) is None:
        raise error
    try:
        stored = read()
    except Exception:
        raise error from None
    if stored is None:
        raise error
    return stored


_DESCRIPTIONS = {
    400: "Bad request (OpenAI error envelope; `param` names the field)",
    401: "Missing, unknown or revoked API key",
    403: "A bucket outside the account's allowlist",
    404: "No such object for this account",
    409: "The object is in a state that does not allow this",
    413: "Larger than the account's storage quota (or, for a part, than its upload may hold)",
    429: "Over a rate limit; see Retry-After",
    503: "AWS storage shedding load or not answering; retry after Retry-After seconds",
}


def documented(
    success: dict[str, Any] | None = None, *codes: int, links: dict[str, dict[str, Any]] | None = None
) -> dict[int, dict[str, Any]]:
    """OpenAPI `responses` of a route: its success response (default: 200 with the return type)
    with `links` (see `batchinfer.api.links`), plus 400, 401, 503 (every route reads the key from
    DynamoDB) and `codes`, each an `ErrorEnvelope`."""
    responses: dict[int, dict[str, Any]] = {200: success or {"description": "Successful Response"}}
    if links:
        responses[200] = {**responses[200], "links": links}
    for code in sorted({400, 401, 503, *codes}):
        responses[code] = {
            "description": _DESCRIPTIONS[code],
            "content": {"application/json": {"model": ErrorEnvelope}},
        }
        if code in (429, 503):
            responses[code]["headers"] = {
                "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
            }
    return responses
