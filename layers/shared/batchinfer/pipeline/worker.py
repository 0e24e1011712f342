"""The shard worker: run a shard's requests on the model backend and commit them exactly once.

A shard message may arrive twice (SQS is at-least-once), concurrently or after the shard is done.
One message at a time holds the shard's lease (`shards.claim`); results go to a deterministic
key with one PUT; `shards.commit` counts them in one transaction guarded by the shard's
`next_index`, so repeated work never counts twice. Near the Lambda time limit the worker stops
launching requests, commits what finished and enqueues a continuation for the rest.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from batchinfer.backends import chaos as backend_chaos
from batchinfer.backends import load_registry
from batchinfer.backends.base import BackendError, ChatBackend, require_utf8
from batchinfer.backends.http import closing
from batchinfer.backends.limiter import AIMDLimiter
from batchinfer.core import chaos, ids
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, s3, shards, sqs
from batchinfer.data.items import ResultPart, Shard
from batchinfer.infer.service import TokenRequests
from batchinfer.wire.openai import CHAT_ENDPOINT, result_line_bytes
from batchinfer.wire.status import BatchStatus

MAX_ATTEMPTS = 4
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.5, 20.0
# An overloaded backend (429, 503) is normal under a batch: the limiter cuts the requests in flight,
# so the refused request retries soon, and more often than after other errors (a batch is patient;
# near the time limit it stops retrying, see `_Limited`).
MAX_OVERLOADED_ATTEMPTS = 20
OVERLOADED_BACKOFF_BASE_S = 0.05
OVERLOADED = frozenset({429, 503})
# One loop per process: backends may keep connection pools bound to it across invocations.
_LOOP = asyncio.new_event_loop()


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a shard: its input `line` (1-based), `custom_id` and OpenAI request `body`."""

    line: int
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request ended in: a status code and a response body (a completion or an error envelope)."""

    request: Request
    status_code: int
    body: dict[str, Any]
    request_id: str

    @property
    def ok(self) -> bool:
        return self.status_code < 400


def parse_shard(data: bytes) -> list[Request]:
    """Requests of a shard file: lines `<line>\\t<request JSON>` written by prepare."""
    requests = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        number, _, line = raw.partition(b"\t")
        obj = json.loads(line)
        requests.append(Request(int(number), obj["custom_id"], obj["body"]))
    return requests


def _overloaded(error: BaseException | None) -> bool:
    return isinstance(error, BackendError) and error.status_code in OVERLOADED


def _wait(state: RetryCallState) -> float:
    """Capped exponential backoff with full jitter, never shorter than the backend's Retry-After.

    The first retry of an overload answer does not wait: the limiter was just cut, so the retry is
    held until a request in flight is answered, which is when the backend has room again.
    """
    error = state.outcome.exception() if state.outcome else None
    attempt = state.attempt_number
    if not _overloaded(error):
        backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1)))
    elif attempt > 1:
        backoff = random.uniform(0, min(BACKOFF_CAP_S, OVERLOADED_BACKOFF_BASE_S * 2 ** (attempt - 2)))
    else:
        backoff = 0.0
    retry_after = getattr(error, "retry_after", None) or 0.0
    return max(backoff, min(retry_after, BACKOFF_CAP_S))


def _stop(state: RetryCallState) -> bool:
    error = state.outcome.exception() if state.outcome else None
    return state.attempt_number >= (MAX_OVERLOADED_ATTEMPTS if _overloaded(error) else MAX_ATTEMPTS)


def for_endpoint(backend: ChatBackend, endpoint: str) -> ChatBackend:
    """What answers the request bodies of a batch with `endpoint`: the backend's `chat_completion` for
    `/v1/chat/completions`, token inference (`batchinfer.infer.service.TokenRequests`) for
    `/v2/models/{model}/infer` bodies."""
    return backend if endpoint == CHAT_ENDPOINT else TokenRequests(backend)


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


class _NotStarted(Exception):
    """The request got its first permit with too little time left: it was not sent."""


class _Limited:
    """One request's view of `backend`: each attempt waits for a permit of `limiter` and holds it while
    in flight; a retry waits outside the window, then goes ahead of the requests not sent yet.

    The first attempt raises `_NotStarted` instead of sending when `out_of_time()`, and an overload
    answer is not retried any more then: the shard must commit.
    """

    def __init__(self, backend: ChatBackend, limiter: AIMDLimiter, out_of_time: Callable[[], bool]) -> None:
        self.backend, self.limiter, self.out_of_time = backend, limiter, out_of_time
        self._started = False

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        permit = await self.limiter.acquire(first_in_line=self._started)
        if not self._started:
            if self.out_of_time():
                self.limiter.give_back(permit)
                raise _NotStarted
            self._started = True
        overloaded = False
        try:
            return await self.backend.chat_completion(body)
        except BackendError as error:
            overloaded = error.status_code in OVERLOADED
            if overloaded and error.retryable and self.out_of_time():
                error.retryable = False
            raise
        finally:
            self.limiter.release(permit, overloaded=overloaded)


_LIMITERS: weakref.WeakKeyDictionary[Any, AIMDLimiter] = weakref.WeakKeyDictionary()


def limiter_for(backend: ChatBackend, maximum: int) -> AIMDLimiter:
    """The process's concurrency limiter for `backend`, at most `maximum` in flight.

    Kept per backend, so what it learned of the backend's capacity outlives one `run_requests`
    (checkpoint windows, warm invocations) instead of being probed again with 429s.
    """
    try:
        limiter = _LIMITERS.get(backend)
    except TypeError:  # not weakly referenceable: a limiter for this run only
        limiter, backend = None, None
    if limiter is None or limiter.maximum != maximum:
        # From the maximum: the first round trip fills the backend, its refusals say its capacity.
        limiter = AIMDLimiter(maximum, initial=maximum)
        if backend is not None:
            _LIMITERS[backend] = limiter
    return limiter


def concurrency_for(backend: Any, ceiling: int) -> int:
    """The most requests to keep in flight on `backend`: its `concurrency_hint` (an in-process engine's
    sequences and a few waiting, see `batchinfer.backends.base.ChatBackend`) when it has one, else
    `ceiling` (WORKER_CONCURRENCY, under which `run_requests` finds a remote backend's capacity);
    never above `ceiling`."""
    hint = getattr(backend, "concurrency_hint", None)
    return min(hint, ceiling) if hint else ceiling


async def run_requests(
    backend: ChatBackend,
    requests: list[Request],
    batch_id: str,
    *,
    concurrency: int,
    time_left_ms: Callable[[], int],
    reserve_ms: int,
) -> list[Outcome]:
    """Run requests, launched in input order, at most `concurrency` in flight.

    How many are really in flight adapts to the backend (`limiter_for`): AIMD between 1 and
    `concurrency`, cut on 429/503 answers and grown back on successes, so the backend is kept full
    without being flooded. Stops launching when `time_left_ms()` drops under `reserve_ms`; every
    launched request finishes, so the outcomes are those of a prefix of `requests`, in input order.
    """
    limiter = limiter_for(backend, concurrency)

    def out_of_time() -> bool:
        return time_left_ms() < reserve_ms

    outcomes: list[Outcome | None] = [None] * len(requests)

    async def one(index: int, request: Request) -> None:
        request_id = ids.request_id(batch_id, request.line)
        try:
            body = await call_backend(_Limited(backend, limiter, out_of_time), request.body)
            outcomes[index] = Outcome(request, 200, body, body.get("id") or request_id)
        except _NotStarted:  # permits are first come, first served: no later request was sent either
            return
        except BackendError as error:
            outcomes[index] = Outcome(request, error.status_code, error.body(), request_id)
        except Exception as error:
            logger.exception("backend raised", extra={"custom_id": request.custom_id})
            outcomes[index] = Outcome(
                request,
                500,
                BackendError(500, f"backend error: {error}", type="server_error").body(),
                request_id,
            )

    # Every request waits for its permit in the limiter from the start (a shard's requests are in
    # memory anyway), its checks done: a finished request hands its permit straight to the next one,
    # in one event loop step, and the backend's freed slot is refilled at once.
    #
    # What is alive now (modules, clients, the shard) outlives this window: the collector need not
    # scan it while requests are in flight (a full collection of it stalls the loop ~70 ms).
    gc.freeze()
    try:
        await asyncio.gather(*(one(index, request) for index, request in enumerate(requests)))
    finally:
        gc.unfreeze()
    return list(itertools.takewhile(lambda outcome: outcome is not None, outcomes))


def render(batch_id: str, outcomes: list[Outcome]) -> tuple[bytes, int, dict[str, int]]:
    """Result lines: successes first, then failures, each in input order.

    Returns (bytes, length of the success part, counts `{completed, failed, input_tokens, output_tokens}`).
    """
    good, bad = bytearray(), bytearray()
    counts = {"completed": 0, "failed": 0, "input_tokens": 0, "output_tokens": 0}
    for outcome in outcomes:
        encoded = result_line_bytes(
            line_id=ids.request_id(batch_id, outcome.request.line),
            custom_id=outcome.request.custom_id,
            status_code=outcome.status_code,
            request_id=outcome.request_id,
            body=outcome.body,
        )
        if outcome.ok:
            good += encoded
            usage = outcome.body.get("usage") or {}
            counts["completed"] += 1
            counts["input_tokens"] += int(usage.get("prompt_tokens") or 0)
            counts["output_tokens"] += int(usage.get("completion_tokens") or 0)
        else:
            bad += encoded
            counts["failed"] += 1
    return bytes(good + bad), len(good), counts


def never_ran(
    batch_id: str, requests: list[Request], code: str, message: str
) -> tuple[bytes, dict[str, int]]:
    """Error lines (`response: null`, `error {code, message}`) for requests that were not answered."""
    data = bytearray()
    for request in requests:
        data += result_line_bytes(
            line_id=ids.request_id(batch_id, request.line),
            custom_id=request.custom_id,
            status_code=None,
            request_id=None,
            body=None,
            error={"code": code, "message": message},
        )
    return bytes(data), {"completed": 0, "failed": len(requests), "input_tokens": 0, "output_tokens": 0}


_COUNTS = ("completed", "failed", "input_tokens", "output_tokens")  # a part's counts, in its S3 metadata


def _recover(batch_id: str, shard_no: int, start: int) -> tuple[ResultPart, dict[str, int]] | None:
    """Results an earlier attempt wrote for `[start, ...)` but died before committing, if any."""
    settings = get_settings()
    key = s3.result_key(batch_id, shard_no, start)
    meta = s3.head_metadata(settings.bucket_name, key)
    if meta is None or "end" not in meta:
        return None
    counts = {name: int(meta[name.replace("_", "-")]) for name in _COUNTS}
    part = ResultPart(
        key=key,
        start=start,
        end=int(meta["end"]),
        output_bytes=int(meta["output-bytes"]),
        bytes=int(meta["bytes"]),
    )
    return part, counts


def _write_part(
    batch_id: str, shard_no: int, start: int, end: int, data: bytes, output_bytes: int, counts: dict[str, int]
) -> ResultPart:
    """One PUT of a part's result lines; its counts ride along as object metadata for `_recover`."""
    key = s3.result_key(batch_id, shard_no, start)
    part = ResultPart(key=key, start=start, end=end, output_bytes=output_bytes, bytes=len(data))
    metadata = {
        "end": str(end),
        "output-bytes": str(output_bytes),
        "bytes": str(len(data)),
        **{name.replace("_", "-"): str(counts[name]) for name in _COUNTS},
    }
    s3.put_bytes(get_settings().bucket_name, key, data, metadata=metadata)
    return part


def process_shard(message: sqs.ShardMessage, *, owner: str, time_left_ms: Callable[[], int]) -> str:
    """Run (the rest of) one shard. Returns what happened, for logs and tests:

    `done` (shard finished), `continued` (time ran short: a continuation was enqueued), `duplicate`
    (done already or leased by another message), `stopped` (batch not running), `conflict` (the
    commit's condition failed: another attempt counted this work).

    Progress is committed every `checkpoint_seconds`, so a crash re-sends to the model at most the
    requests since the last checkpoint; results written by an attempt that died before its commit
    are committed as they are, not run again. A shard claimed more than `max_shard_attempts` times
    (it keeps killing its worker) has its remaining requests written as `processing_failed` errors.
    """
    settings = get_settings()
    batch_id, shard_no = message.batch_id, message.shard
    header = batches.get(batch_id)
    if header is None or header.status != BatchStatus.IN_PROGRESS or header.sealed:
        return "stopped"
    lease_seconds = settings.shard_lease_seconds or time_left_ms() // 1000 + 60
    shard = shards.claim(batch_id, shard_no, owner=owner, lease_seconds=lease_seconds)
    if shard is None:
        return "duplicate"
    start, size = shard.next_index, shard.size
    requests = parse_shard(s3.get_bytes(settings.bucket_name, shard.input_key))
    backend = backend_chaos.wrap(
        for_endpoint(load_registry(settings.model_registry).backend(header.model), header.endpoint)
    )
    recover = shard.attempts > 1
    while start < size:
        found = _recover(batch_id, shard_no, start) if recover else None
        recover = False
        if found:
            part, counts = found
        elif shard.attempts > settings.max_shard_attempts:
            data, counts = never_ran(
                batch_id,
                requests[start:],
                "processing_failed",
                f"The request could not be processed after {settings.max_shard_attempts} attempts.",
            )
            part = _write_part(batch_id, shard_no, start, size, data, 0, counts)
        else:
            checkpoint_at = time.monotonic() + settings.checkpoint_seconds

            def window_left(checkpoint_at: float = checkpoint_at) -> int:
                return min(
                    time_left_ms(), int((checkpoint_at - time.monotonic()) * 1000) + settings.time_reserve_ms
                )

            outcomes = _LOOP.run_until_complete(
                closing(
                    run_requests(
                        backend,
                        requests[start:],
                        batch_id,
                        concurrency=concurrency_for(backend, settings.worker_concurrency),
                        time_left_ms=window_left,
                        reserve_ms=settings.time_reserve_ms,
                    )
                )
            )
            if not outcomes:
                break
            data, output_bytes, counts = render(batch_id, outcomes)
            part = _write_part(batch_id, shard_no, start, start + len(outcomes), data, output_bytes, counts)
        chaos.crash_point("crash_before_commit")
        if not shards.commit(batch_id, shard_no, part, size=size, keep_lease=True, **counts):
            logger.info(
                "shard commit condition failed: counted by another attempt",
                extra={"batch_id": batch_id, "shard": shard_no},
            )
            return "conflict"
        chaos.crash_point("crash_after_commit")
        start = part.end
        if time_left_ms() < settings.time_reserve_ms:
            break
    if start < size:
        shards.release(batch_id, shard_no, owner=owner)
        sqs.send(settings.shards_queue_url, [message])
        return "continued"
    _finalize_if_last(batch_id)
    return "done"


def _finalize_if_last(batch_id: str) -> None:
    """After a shard is done: the commit that completed the last shard asks for aggregation."""
    after = batches.get(batch_id)
    if after and after.shards_done >= after.shards_total:
        sqs.send(get_settings().finalize_queue_url, [sqs.BatchMessage(batch_id=batch_id)])


def fail_shard(batch_id: str, shard: Shard, reason: str) -> bool:
    """Record a shard's unfinished requests as `processing_failed` error lines (its messages keep dying).

    Returns False when another attempt committed first (nothing written counts).
    """
    settings = get_settings()
    start, size = shard.next_index, shard.size
    requests = parse_shard(s3.get_bytes(settings.bucket_name, shard.input_key))[start:]
    data, counts = never_ran(batch_id, requests, "processing_failed", reason)
    part = _write_part(batch_id, shard.shard, start, size, data, 0, counts)
    if not shards.commit(batch_id, shard.shard, part, size=size, **counts):
        return False
    _finalize_if_last(batch_id)
    return True
