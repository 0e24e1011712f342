"""The retry policy of a request (`call_backend`: the one place a request is retried).

Overload answers (429, 503) are retried often and soon; other retryable errors less often, later.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from batchinfer.backends.base import BackendError, ChatBackend, require_utf8

MAX_ATTEMPTS = 4
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.5, 20.0
# An overloaded backend (429, 503) is normal under a batch: the limiter cuts the requests in flight
# (and owns a Retry-After wait: its gate holds every request, not only the refused one), so the
# refused request retries soon, and more often than after other errors (a batch is patient; near the
# time limit it stops retrying, see `limits.Limited`).
MAX_OVERLOADED_ATTEMPTS = 20
OVERLOADED_BACKOFF_BASE_S = 0.05
# The limiter bounds what is in flight and owns Retry-After: a refused request's own wait only spreads
# retries, and a long one is the batch's tail (measured: two shard workers on one refusing C = 512
# server, retries backing off to 20 s, took 58 s for 20 s of work).
OVERLOADED_BACKOFF_CAP_S = 1.0
OVERLOADED = frozenset({429, 503})


def _overloaded(error: BaseException | None) -> bool:
    return isinstance(error, BackendError) and error.status_code in OVERLOADED


def _wait(state: RetryCallState) -> float:
    """Capped exponential backoff with full jitter, never shorter than the backend's Retry-After.

    The first retry of an overload answer does not wait: the limiter was just cut, so the retry is
    held until a request in flight is answered, which is when the backend has room again. An overload
    answer's Retry-After is the limiter's (`limits.Limited` hands it over): its gate holds the retry.
    """
    error = state.outcome.exception() if state.outcome else None
    attempt = state.attempt_number
    if not _overloaded(error):
        backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1)))
    elif attempt > 1:
        backoff = random.uniform(
            0, min(OVERLOADED_BACKOFF_CAP_S, OVERLOADED_BACKOFF_BASE_S * 2 ** (attempt - 2))
        )
    else:
        backoff = 0.0
    retry_after = getattr(error, "retry_after", None) or 0.0
    return max(backoff, min(retry_after, BACKOFF_CAP_S))


def _stop(state: RetryCallState) -> bool:
    error = state.outcome.exception() if state.outcome else None
    return state.attempt_number >= (MAX_OVERLOADED_ATTEMPTS if _overloaded(error) else MAX_ATTEMPTS)


async def call_backend(backend: ChatBackend, body: dict[str, Any]) -> dict[str, Any]:
    """One request with retries of retryable `BackendError`s (429, 5xx, timeouts); re-raises the last.

    The one place a request is retried: backends send each request once and say whether it may be
    tried again (`BackendError.retryable`, `retry_after`).

    Overload answers (429, 503) get `MAX_OVERLOADED_ATTEMPTS` tries with short waits, other retryable
    errors `MAX_ATTEMPTS` with longer ones; a Retry-After is always honoured (up to `BACKOFF_CAP_S`).
    """
    # A string that can't be UTF-8 encoded (lone surrogate) can't be sent to any model. Encoding finds
    # one faster than a walk of every body; the walk then names it.
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        require_utf8(body)  # raises BackendError(400, invalid_encoding, param=<its path>)
        raise
    async for attempt in AsyncRetrying(
        stop=_stop,
        wait=_wait,
        reraise=True,
        retry=retry_if_exception(lambda e: isinstance(e, BackendError) and e.retryable),
    ):
        with attempt:
            return await backend.chat_completion(body)
    raise AssertionError("unreachable")
