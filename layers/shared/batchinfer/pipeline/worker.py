"""The shard worker: run a shard's requests on the model backend and commit them exactly once.

A shard message may arrive twice (SQS is at-least-once), concurrently or after the shard is done.
One message at a time holds the shard's lease (`shards.claim`), renewed while it works
(`LeaseHeartbeat`); results go to a key of that write's own with one PUT; `shards.commit` counts
them and names the key in one transaction guarded by the shard's owner and `next_index`, so repeated
work never counts twice and only the committed key is ever read (issue 12).
Near the Lambda time limit the worker stops launching requests, commits what finished and enqueues a
continuation for the rest.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import json
import random
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from batchinfer.backends import chaos as backend_chaos
from batchinfer.backends import load_registry
from batchinfer.backends.base import BackendError, ChatBackend, RequestNotStarted, Withdrawable, require_utf8
from batchinfer.backends.http import closing
from batchinfer.backends.limiter import AdaptiveLimiter
from batchinfer.core import chaos, ids
from batchinfer.core.observability import logger, metrics
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, inflight, keys, s3, shards, sqs
from batchinfer.data.items import BatchHeader, LiveProgress, ResultPart, Shard
from batchinfer.data.table import now
from batchinfer.endpoints.registry import endpoint_for
from batchinfer.pipeline.lease import LeaseHeartbeat
from batchinfer.wire.openai import CHAT_ENDPOINT, result_line_bytes
from batchinfer.wire.status import BatchStatus

MAX_ATTEMPTS = 4
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.5, 20.0
# An overloaded backend (429, 503) is normal under a batch: the limiter cuts the requests in flight
# (and owns a Retry-After wait: its gate holds every request, not only the refused one), so the
# refused request retries soon, and more often than after other errors (a batch is patient; near the
# time limit it stops retrying, see `_Limited`).
MAX_OVERLOADED_ATTEMPTS = 20
OVERLOADED_BACKOFF_BASE_S = 0.05
# The limiter bounds what is in flight and owns Retry-After: a refused request's own wait only spreads
# retries, and a long one is the batch's tail (measured: two shard workers on one refusing C = 512
# server, retries backing off to 20 s, took 58 s for 20 s of work).
OVERLOADED_BACKOFF_CAP_S = 1.0
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
    """What one request ended in: a status code and a response body (a completion or an error envelope),
    or, for a request the model never answered (`status_code` None), a result line's `error`
    `{code, message}`."""

    request: Request
    status_code: int | None
    body: dict[str, Any] | None
    request_id: str | None
    error: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and self.status_code < 400


@dataclass(frozen=True, slots=True)
class Ending:
    """How a batch that stops early ends (issue 17), and what its error lines say: `code` / `message`
    for requests that never reached the model, `cut_code` / `cut_message` for requests that were at
    the model when the grace after the cancel (or expiry) ran out, whose answers were not kept."""

    status: BatchStatus
    code: str
    message: str
    cut_code: str
    cut_message: str

    def never_ran(self, request: Request) -> Outcome:
        """The outcome of `request` that never reached the model."""
        return Outcome(request, None, None, None, {"code": self.code, "message": self.message})

    def cut(self, request: Request) -> Outcome:
        """The outcome of `request` that was stopped at the model after the grace."""
        return Outcome(request, None, None, None, {"code": self.cut_code, "message": self.cut_message})


ENDINGS = {
    BatchStatus.CANCELLED: Ending(
        BatchStatus.CANCELLED,
        "batch_cancelled",
        "The batch was cancelled before this request ran.",
        "batch_cancelled_in_flight",
        "The batch was cancelled while this request was running at the model; it did not finish within "
        "the cancel grace (CANCEL_GRACE_SECONDS) and its answer was not kept.",
    ),
    BatchStatus.EXPIRED: Ending(
        BatchStatus.EXPIRED,
        "batch_expired",
        "The batch expired before this request ran.",
        "batch_expired_in_flight",
        "The batch expired while this request was running at the model; it did not finish within "
        "the grace (CANCEL_GRACE_SECONDS) and its answer was not kept.",
    ),
}


def ending_of(header: BatchHeader | None, at: int) -> Ending | None:
    """The ending `header` asks of its shard workers at Unix time `at`, or None (go on): `cancelling`
    (or `cancelled`) -> cancelled; `finalizing` toward `expired`, `expired`, or `in_progress` with
    `expires_at` passed -> expired. A batch that is gone ends as cancelled."""
    if header is None or header.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        return ENDINGS[BatchStatus.CANCELLED]
    if header.status == BatchStatus.EXPIRED or header.final_status == BatchStatus.EXPIRED:
        return ENDINGS[BatchStatus.EXPIRED]
    if header.status == BatchStatus.IN_PROGRESS and at >= header.expires_at:
        return ENDINGS[BatchStatus.EXPIRED]
    return None


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
    held until a request in flight is answered, which is when the backend has room again. An overload
    answer's Retry-After is the limiter's (`_Limited` hands it over): its gate holds the retry.
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


def for_endpoint(backend: ChatBackend, endpoint: str) -> ChatBackend:
    """What answers the request bodies of a batch with `endpoint` on `backend`: its endpoint's server
    (`batchinfer.endpoints.base.Endpoint.server`; a chat backend is its own)."""
    return endpoint_for(endpoint).server(backend)


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

    Tells the limiter what each answer says of the backend: a success its latency; a 429/503 a refusal
    with its Retry-After (the limiter's gate then owns that wait, `_wait` does not sleep it again);
    any other error nothing (answered at once or timed out: neither is a queue sample).

    The first attempt raises `_NotStarted` instead of sending when `out_of_time()` (the window's time is
    up: a checkpoint, or the deadline). An overload answer is not retried any more once `must_stop()`
    (the invocation's deadline, the batch's end, the lease lost): the shard must commit. At a mere
    checkpoint it is retried as before: the window waits for it, and a refusal is a backend's
    backlog, not the request's failure.
    """

    def __init__(
        self,
        backend: ChatBackend,
        limiter: AdaptiveLimiter,
        out_of_time: Callable[[], bool],
        must_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.backend, self.limiter, self.out_of_time = backend, limiter, out_of_time
        self.must_stop = must_stop or out_of_time
        self._started = False

    @property
    def started(self) -> bool:
        """True once the request was sent (or handed to the backend's queue)."""
        return self._started

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        permit = await self.limiter.acquire(first_in_line=self._started)
        if not self._started:
            if self.out_of_time():
                self.limiter.give_back(permit)
                raise _NotStarted
            self._started = True
        try:
            answer = await self.backend.chat_completion(body)
        except BackendError as error:
            if error.status_code in OVERLOADED:
                retry_after, error.retry_after = error.retry_after, None
                if retry_after is not None:
                    retry_after = min(retry_after, BACKOFF_CAP_S)
                self.limiter.release(permit, refused=True, retry_after=retry_after)
                if error.retryable and self.must_stop():
                    error.retryable = False
            else:
                self.limiter.release(permit, sample=False)
            raise
        except BaseException:
            self.limiter.release(permit, sample=False)
            raise
        self.limiter.release(permit)
        return answer


_LIMITERS: weakref.WeakKeyDictionary[Any, AdaptiveLimiter] = weakref.WeakKeyDictionary()
# The first burst against a backend of unknown kind (see batchinfer.backends.limiter, "Startup").
INITIAL_CONCURRENCY = 64


def limiter_for(backend: ChatBackend, maximum: int) -> AdaptiveLimiter:
    """The process's concurrency limiter for `backend` (one per backend per process), at most `maximum`
    in flight.

    Kept per backend, so what it learned of the backend's capacity outlives one `run_requests`
    (checkpoint windows, warm invocations) instead of being probed again. A new `maximum` (a share
    bound, a changed WORKER_CONCURRENCY) re-caps the same limiter. An in-process engine (a backend with
    a `concurrency_hint`) gets a fixed window: its latency grows with its batch by design.
    """
    try:
        limiter = _LIMITERS.get(backend)
    except TypeError:  # not weakly referenceable: a limiter for this run only
        limiter, backend = None, None
    if limiter is None:
        if getattr(backend, "concurrency_hint", None):
            limiter = AdaptiveLimiter(maximum, initial=maximum, latency=False, lag_probe=0)
        else:
            limiter = AdaptiveLimiter(maximum, initial=INITIAL_CONCURRENCY)
        if backend is not None:
            _LIMITERS[backend] = limiter
    elif limiter.maximum != maximum:
        limiter.maximum = maximum
    return limiter


class Latency:
    """How long a backend has been taking to answer: seconds from sending a request to its answer, a
    queue in front of the model (the embedded model's thread) included. `estimate()` is the longest of
    the last `RECENT` answers (0 before any): what a request started now is expected to take.
    Hand-written: a bounded deque and its maximum, no library needed."""

    RECENT = 32

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=self.RECENT)

    def observe(self, seconds: float) -> None:
        """Record one answer's time."""
        self._recent.append(seconds)

    def estimate(self) -> float:
        """Seconds a request started now is expected to take."""
        return max(self._recent, default=0.0)


_LATENCIES: weakref.WeakKeyDictionary[Any, Latency] = weakref.WeakKeyDictionary()


def latency_for(backend: ChatBackend) -> Latency:
    """The process's `Latency` of `backend` (kept like `limiter_for`'s limiter, across windows and warm
    invocations; a backend that can't be weakly referenced gets one for this call only)."""
    try:
        return _LATENCIES.setdefault(backend, Latency())
    except TypeError:
        return Latency()


class _Timed:
    """`backend` whose answers (and errors) are timed into `latency`."""

    def __init__(self, backend: ChatBackend, latency: Latency) -> None:
        self.backend, self.latency = backend, latency

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        try:
            answer = await self.backend.chat_completion(body)
        except BackendError as error:
            self.latency.observe(time.monotonic() - started)
            if error.status_code in OVERLOADED:
                metrics.add_metric(name="BackendRefusals", unit=MetricUnit.Count, value=1)
            raise
        self.latency.observe(time.monotonic() - started)
        metrics.add_metric(name="BackendLatency", unit=MetricUnit.Milliseconds, value=_ms(started))
        return answer


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


# How often the deadline of the requests in flight is looked at (seconds).
DEADLINE_CHECK_S = 0.05


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
    """Run requests, launched in input order, at most `concurrency` in flight (`run_window` without a
    link to the batch): the outcomes of the prefix of `requests` that finished, in input order."""
    window = await run_window(
        backend, requests, batch_id, concurrency=concurrency, time_left_ms=time_left_ms, reserve_ms=reserve_ms
    )
    return window.prefix()


@dataclass(frozen=True, slots=True)
class Window:
    """What one window of a shard ended in: an outcome per request of `requests` (None: it never
    reached the model) and, when the batch was cancelled or expired meanwhile, its `Ending`."""

    requests: list[Request]
    outcomes: list[Outcome | None]
    ending: Ending | None

    def prefix(self) -> list[Outcome]:
        """The outcomes up to the first request that did not run (those after it run again later)."""
        return list(itertools.takewhile(lambda outcome: outcome is not None, self.outcomes))

    def ended(self) -> list[Outcome]:
        """For an ending batch: the outcomes up to the last request that ran, a request in between that
        never reached the model as the ending's `never_ran` line (it is not run again)."""
        assert self.ending is not None
        last = max((i for i, outcome in enumerate(self.outcomes) if outcome is not None), default=-1)
        return [
            outcome if outcome is not None else self.ending.never_ran(request)
            for outcome, request in zip(self.outcomes[: last + 1], self.requests[: last + 1], strict=True)
        ]


async def run_window(
    backend: ChatBackend,
    requests: list[Request],
    batch_id: str,
    *,
    concurrency: int,
    time_left_ms: Callable[[], int],
    reserve_ms: int,
    link: ProgressLink | None = None,
    progress_seconds: float = 1.0,
    grace_seconds: float = 0.0,
    deadline_ms: Callable[[], int] | None = None,
    lost: Callable[[], bool] | None = None,
) -> Window:
    """Run requests, launched in input order, at most `concurrency` in flight.

    How many are really in flight adapts to the backend (`limiter_for`,
    `batchinfer.backends.limiter.AdaptiveLimiter`) between 1 and `concurrency`: cut on 429/503 answers,
    on latency that shows a queue, and on Retry-After, grown back on successes, so the backend is kept
    full without being flooded or queued. Stops launching when `time_left_ms()` (this window's time, e.g. to a
    checkpoint) drops under `reserve_ms`, but for the first request: it is launched unless the
    invocation must stop (the deadline, the batch's end, the lease lost), so every window makes progress.

    The per-request deadline (issue 12) is the invocation's remaining time `deadline_ms()` (default
    `time_left_ms`) minus `reserve_ms`: no request is launched that the backend's observed latency
    (`latency_for`) says cannot finish by then; once that is so, requests still waiting in the
    backend's queue are withdrawn (`backends.base.Withdrawable`: back unstarted, they run in the next
    invocation); at the deadline itself the requests still in flight are dropped unstarted too (sent
    again later), so the caller commits before the function is killed.

    With a `link`, every `progress_seconds` the finished requests' counts are published on the batch
    (`ProgressLink.publish`, in a thread: the loop goes on) and its answer may end the batch: then no
    request is launched any more, requests waiting in the backend's queue are withdrawn
    (`backends.base.Withdrawable`: they never reach the model), and those at the model get
    `grace_seconds` (never past `reserve_ms` before the deadline) before they are cut off (the
    ending's `cut` outcome). The publish in flight is awaited before returning, so it never lands
    after the caller's commit.

    Once `lost()` (the shard's lease was taken over: `LeaseHeartbeat.lost`), nothing more is launched
    and the requests in flight are dropped (their answers would not be committed): the window returns
    within `DEADLINE_CHECK_S`.
    """
    limiter, latency = limiter_for(backend, concurrency), latency_for(backend)
    deadline = deadline_ms or time_left_ms
    timed = _Timed(backend, latency)
    endings: list[Ending] = []  # the ending, once the link reported one

    def budget_s() -> float:
        return (deadline() - reserve_ms) / 1000

    def lease_lost() -> bool:
        return lost is not None and lost()

    def must_stop() -> bool:
        return bool(endings) or lease_lost() or budget_s() < latency.estimate()

    def out_of_time() -> bool:
        return must_stop() or time_left_ms() < reserve_ms

    outcomes: list[Outcome | None] = [None] * len(requests)
    finished = dict.fromkeys(_COUNTS, 0)

    async def one(index: int, request: Request) -> None:
        request_id = ids.request_id(batch_id, request.line)
        # The first request (first in line for a permit) goes unless the invocation must stop: a window
        # always makes progress, however short its checkpoint or busy the machine.
        limited = _Limited(timed, limiter, must_stop if index == 0 else out_of_time, must_stop)
        try:
            body = await call_backend(limited, request.body)
            outcome = Outcome(request, 200, body, body.get("id") or request_id)
        except (_NotStarted, RequestNotStarted):  # permits are first come, first served
            return
        except asyncio.CancelledError:  # the grace after the batch's end, or the deadline, ran out
            if not limited.started or not endings:
                return  # sent again later
            outcome = endings[0].cut(request)
        except BackendError as error:
            outcome = Outcome(request, error.status_code, error.body(), request_id)
        except Exception as error:
            logger.exception("backend raised", extra={"custom_id": request.custom_id})
            outcome = Outcome(
                request,
                500,
                BackendError(500, f"backend error: {error}", type="server_error").body(),
                request_id,
            )
        outcomes[index] = outcome
        _tally(finished, outcome)

    publishing: list[asyncio.Future[Ending | None]] = []
    tasks: list[asyncio.Future[None]] = []

    async def guard() -> None:
        withdrawn = False
        while (left := budget_s()) > 0 and not lease_lost():
            if not withdrawn and left < latency.estimate() and isinstance(backend, Withdrawable):
                withdrawn = True
                backend.withdraw_waiting()
            await asyncio.sleep(min(DEADLINE_CHECK_S, left))
        for task in tasks:
            task.cancel()

    async def watch(link: ProgressLink) -> None:
        while True:
            await asyncio.sleep(progress_seconds)
            publishing[:] = [asyncio.ensure_future(asyncio.to_thread(link.publish, dict(finished)))]
            try:
                ending = await asyncio.shield(publishing[0])
            except Exception:  # a throttled write: the next interval tries again
                logger.warning("progress not published", exc_info=True, extra={"batch_id": batch_id})
                continue
            if ending is not None:
                endings.append(ending)
                if isinstance(backend, Withdrawable):
                    backend.withdraw_waiting()
                return

    # Every request waits for its permit in the limiter from the start (a shard's requests are in
    # memory anyway), its checks done: a finished request hands its permit straight to the next one,
    # in one event loop step, and the backend's freed slot is refilled at once.
    #
    # What is alive now (modules, clients, the shard) outlives this window: the collector need not
    # scan it while requests are in flight (a full collection of it stalls the loop ~70 ms).
    gc.freeze()
    tasks += [asyncio.ensure_future(one(index, request)) for index, request in enumerate(requests)]
    everything = asyncio.gather(*tasks)
    guarding = asyncio.ensure_future(guard())
    watcher = asyncio.ensure_future(watch(link)) if link is not None else None
    try:
        if watcher is None:
            await everything
        else:
            await asyncio.wait({everything, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not everything.done():  # the batch is ending: the requests at the model get the grace
                grace = max(0.0, min(grace_seconds, budget_s()))
                if not (await asyncio.wait({everything}, timeout=grace))[0]:
                    for task in tasks:
                        task.cancel()
                    await everything
    finally:
        guarding.cancel()
        if watcher is not None:
            watcher.cancel()
            if publishing and not publishing[0].done():
                await asyncio.wait(publishing)
        gc.unfreeze()
    return Window(requests, outcomes, endings[0] if endings else None)


def _tally(counts: dict[str, int], outcome: Outcome, endpoint: str = CHAT_ENDPOINT) -> None:
    """Add one outcome to `counts` `{completed, failed, input_tokens, output_tokens}`, its tokens as
    the batch's `endpoint` counts them."""
    if outcome.ok:
        usage = endpoint_for(endpoint).usage(outcome.body or {})
        counts["completed"] += 1
        counts["input_tokens"] += usage.input_tokens
        counts["output_tokens"] += usage.output_tokens
    else:
        counts["failed"] += 1


def render(
    batch_id: str, outcomes: list[Outcome], endpoint: str = CHAT_ENDPOINT
) -> tuple[bytes, int, dict[str, int]]:
    """Result lines: successes first, then failures, each in input order; tokens counted by the
    batch's `endpoint`.

    Returns (bytes, length of the success part, counts `{completed, failed, input_tokens, output_tokens}`).
    """
    good, bad = bytearray(), bytearray()
    counts = dict.fromkeys(_COUNTS, 0)
    for outcome in outcomes:
        encoded = result_line_bytes(
            line_id=ids.request_id(batch_id, outcome.request.line),
            custom_id=outcome.request.custom_id,
            status_code=outcome.status_code,
            request_id=outcome.request_id,
            body=outcome.body,
            error=outcome.error,
        )
        if outcome.ok:
            good += encoded
        else:
            bad += encoded
        _tally(counts, outcome, endpoint)
    return bytes(good + bad), len(good), counts


class ProgressLink:
    """The shard worker's live link to its batch (issues 13 and 17): one write per interval.

    `publish(counts)` SETs the header's `live.<shard>` to the absolute counts of the current window's
    finished requests (`batches.publish_progress`) and reads the batch's status in the same write's
    answer: `ending` is set once the batch is cancelled or expired (`ending_of`). What it publishes is
    never below what an earlier holder of the shard had published for the same window (`floor`, from
    the header read when the shard was claimed): a crashed worker's progress that is lost and redone
    does not make GET's counts go down. One `publish` at a time (`run_window` awaits each).
    """

    def __init__(self, batch_id: str, shard_no: int, start: int, published: LiveProgress | None) -> None:
        self.batch_id, self.shard_no, self.start = batch_id, shard_no, start
        same = published is not None and published.start == start
        self.floor = {name: getattr(published, name) if same else 0 for name in _COUNTS}
        self.ending: Ending | None = None

    def publish(self, counts: dict[str, int]) -> Ending | None:
        """Publish `counts` (the window's finished requests); the batch's ending, if it is ending."""
        at = now()
        progress = LiveProgress(
            start=self.start, at=at, **{n: max(counts[n], self.floor[n]) for n in _COUNTS}
        )
        header = batches.publish_progress(self.batch_id, self.shard_no, progress)
        self.ending = self.ending or ending_of(header, at)
        return self.ending

    def rest_after(self, counts: dict[str, int], end: int) -> LiveProgress | None:
        """What stays published once `counts` (of requests up to `end`) are committed: the part of the
        floor they do not cover yet (None: nothing), shown until the redo reaches it."""
        rest = {n: max(0, self.floor[n] - counts[n]) for n in _COUNTS}
        return LiveProgress(start=end, at=now(), **rest) if any(rest.values()) else None

    def committed(self, counts: dict[str, int], end: int) -> None:
        """The commit of `counts` up to `end` went through: the next window starts there."""
        self.floor = {n: max(0, self.floor[n] - counts[n]) for n in _COUNTS}
        self.start = end


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


@dataclass(frozen=True, slots=True)
class Recovered:
    """Results an earlier writer put for a part of a shard and never committed, copied to a key of this
    writer's own (`part.key`): the part, its counts, and the earlier writer's key (`source`: garbage
    once `part` is committed, `discard`)."""

    part: ResultPart
    counts: dict[str, int]
    source: str


def recover_part(batch_id: str, shard_no: int, start: int) -> Recovered | None:
    """Results an earlier attempt wrote for `[start, ...)` of a shard but died (or lost its lease)
    before committing, if any: the first such object (a ListObjectsV2, a HeadObject for its counts, see
    `_write_part`) copied to a key of this writer's own, ready to commit.

    Copied, not committed under the earlier writer's key, so each key is only ever committed by its
    own writer: a refused writer may delete its key (`discard`) without racing a recovery of it."""
    bucket = get_settings().bucket_name
    for source in s3.keys_under(bucket, s3.result_prefix(batch_id, shard_no, start)):
        meta = s3.head_metadata(bucket, source)
        if meta is None or "end" not in meta:
            continue
        key = s3.result_key(batch_id, shard_no, start, ids.write_token())
        if not s3.copy(bucket, source, key):
            continue  # its writer deleted it meanwhile
        counts = {name: int(meta[name.replace("_", "-")]) for name in _COUNTS}
        part = ResultPart(
            key=key,
            start=start,
            end=int(meta["end"]),
            output_bytes=int(meta["output-bytes"]),
            bytes=int(meta["bytes"]),
        )
        return Recovered(part, counts, source)
    return None


def discard(key: str) -> None:
    """Delete a result key no commit names (a refused writer's own, or a recovered part's source).
    Safe: a key is committed only by the writer that made it, and never after its commit was refused."""
    s3.delete(get_settings().bucket_name, key)


def _write_part(
    batch_id: str, shard_no: int, start: int, end: int, data: bytes, output_bytes: int, counts: dict[str, int]
) -> ResultPart:
    """One PUT of a part's result lines to a key of this write's own (`s3.result_key`: a writer that
    lost the lease can't overwrite what its new holder commits); its counts ride along as object
    metadata for `recover_part`."""
    key = s3.result_key(batch_id, shard_no, start, ids.write_token())
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
    (done already or leased by another message), `stopped` (batch not running, or it was cancelled or
    expired while this shard ran: what finished is committed), `conflict` (the commit's condition
    failed: another attempt counted this work, or took the lease), `lost` (another message took the
    lease while this one worked, e.g. it was paused past it: it stopped launching requests, wrote and
    committed nothing more, and left the shard to its new holder), `waiting` (the account's shards
    hold every slot of its share of the model's workers: the message comes back in
    `SLOT_WAIT_SECONDS`, nothing counted, the backend not called).

    One account's shards run at most `settings.account_shard_slots` at once on one model
    (`AccountShardShare` of `MaxShardWorkers`; slots of `data.inflight`, taken before the claim and
    held for the invocation), so one account's backlog never holds every worker of a backend.

    The lease lasts `shard_lease_seconds` and is renewed every third of it while the worker works
    (`LeaseHeartbeat`), so a live worker keeps its shard however long it runs, and a crashed one's
    shard can be claimed one lease after its last beat.

    While requests run, the worker publishes its uncommitted progress every `progress_seconds` and
    learns from the same write whether the batch is ending (`ProgressLink`, `run_window`): then it
    launches nothing more, gives the requests at the model `cancel_grace_seconds`, and commits.

    Progress is committed every `checkpoint_seconds`, so a crash re-sends to the model at most the
    requests since the last checkpoint; results written by an attempt that died before its commit
    are copied to its own key and committed, not run again. A shard claimed more than
    `max_shard_attempts` times (it keeps killing its worker; a continuation hands its claim back) has
    its remaining requests written as `processing_failed` errors.
    """
    settings = get_settings()
    batch_id = message.batch_id
    header = batches.get(batch_id)
    if header is None or header.status != BatchStatus.IN_PROGRESS or header.sealed:
        return "stopped"
    ending = ending_of(header, now())
    if ending is not None:  # past expires_at, before the sweeper saw it
        _end_early(header, ending)
        return "stopped"
    share = settings.account_shard_slots
    if share is None:
        return _run_shard(message, header, owner=owner, time_left_ms=time_left_ms)
    slots = keys.shard_slots(header.account_id, header.model)
    try:
        slot = inflight.acquire(
            slots, limit=share, owner=owner, lease_s=time_left_ms() // 1000 + SLOT_MARGIN_S
        )
    except inflight.NoSlot:
        return _wait_for_slot(message, header)
    try:
        return _run_shard(message, header, owner=owner, time_left_ms=time_left_ms)
    finally:
        inflight.release(slots, slot, owner=owner)


# A shard slot's lease beyond the invocation's remaining time (a crashed worker's slot is free then).
SLOT_MARGIN_S = 60
# How long a shard whose account holds all its slots waits before its message is received again.
SLOT_WAIT_SECONDS = 5


def _wait_for_slot(message: sqs.ShardMessage, header: BatchHeader) -> str:
    """The account's shards hold every slot of its share on the model: send the message again, received
    in `SLOT_WAIT_SECONDS`, and mark the shard waiting (`shards.mark_waiting`: no attempt, no re-drive,
    so the sweeper sees a queued message, not a stuck shard; waiting is never failure, issue 12).

    A new message rather than the same one with a shorter visibility timeout: every receive counts
    toward the queue's maxReceiveCount (5), and a shard that waits its turn must never reach the DLQ.
    Returns `waiting`, or `duplicate` when the shard is done or a live lease holds it (nothing sent)."""
    if not shards.mark_waiting(message.batch_id, message.shard, at=now()):
        return "duplicate"
    sqs.send(
        get_settings().shards_queue_url,
        [message],
        group_id=header.account_id,
        delay_seconds=SLOT_WAIT_SECONDS,
    )
    metrics.add_metric(name="ShardSlotWaits", unit=MetricUnit.Count, value=1)
    return "waiting"


def _run_shard(
    message: sqs.ShardMessage, header: BatchHeader, *, owner: str, time_left_ms: Callable[[], int]
) -> str:
    """`process_shard` from the claim on (the account's slot, if bounded, is held)."""
    settings = get_settings()
    batch_id, shard_no = message.batch_id, message.shard
    lease_seconds = settings.shard_lease_seconds
    shard = shards.claim(batch_id, shard_no, owner=owner, lease_seconds=lease_seconds)
    if shard is None:
        return "duplicate"
    start, size = shard.next_index, shard.size
    link = ProgressLink(batch_id, shard_no, start, header.live.get(str(shard_no)))
    renew = functools.partial(shards.renew, batch_id, shard_no, owner=owner, lease_seconds=lease_seconds)
    with LeaseHeartbeat(renew, lease_seconds, batch_id=batch_id, shard=shard_no) as lease:
        requests = parse_shard(s3.get_bytes(settings.bucket_name, shard.input_key))
        backend = backend_chaos.wrap(
            for_endpoint(load_registry(settings.model_registry).backend(header.model), header.endpoint)
        )
        recover = shard.attempts > 1
        while start < size:
            found = recover_part(batch_id, shard_no, start) if recover else None
            recover = False
            if found:
                part, counts = found.part, found.counts
            elif shard.attempts > settings.max_shard_attempts:
                data, counts = never_ran(
                    batch_id,
                    requests[start:],
                    "processing_failed",
                    f"The request could not be processed after {settings.max_shard_attempts} attempts.",
                )
                if not lease.held():
                    break
                part = _write_part(batch_id, shard_no, start, size, data, 0, counts)
            else:
                checkpoint_at = time.monotonic() + settings.checkpoint_seconds

                def window_left(checkpoint_at: float = checkpoint_at) -> int:
                    return min(
                        time_left_ms(),
                        int((checkpoint_at - time.monotonic()) * 1000) + settings.time_reserve_ms,
                    )

                window = _LOOP.run_until_complete(
                    closing(
                        run_window(
                            backend,
                            requests[start:],
                            batch_id,
                            concurrency=concurrency_for(backend, settings.worker_concurrency),
                            time_left_ms=window_left,
                            reserve_ms=settings.time_reserve_ms,
                            link=link,
                            progress_seconds=settings.progress_seconds,
                            grace_seconds=settings.cancel_grace_seconds,
                            deadline_ms=time_left_ms,
                            lost=lambda: lease.lost,
                        )
                    )
                )
                # An ending batch keeps every answer; what never reached the model is not run again.
                outcomes = window.ended() if window.ending else window.prefix()
                # The result key is the new holder's once the lease is lost: no PUT.
                if not outcomes or not lease.held():
                    break
                data, output_bytes, counts = render(batch_id, outcomes)
                part = _write_part(
                    batch_id, shard_no, start, start + len(outcomes), data, output_bytes, counts
                )
            chaos.crash_point("crash_before_commit")
            rest = link.rest_after(counts, part.end) if part.end < size else None
            # An ending batch: the commit gives the lease up, so the aggregator need not wait for it.
            keep = link.ending is None
            if not keep or part.end >= size:
                lease.stop()  # the commit ends the lease: no beat after it
            if not shards.commit(
                batch_id, shard_no, part, owner=owner, size=size, keep_lease=keep, live_rest=rest, **counts
            ):
                logger.info(
                    "shard commit condition failed: counted by another attempt, or the lease was taken",
                    extra={"batch_id": batch_id, "shard": shard_no},
                )
                lease.stop()
                shards.release(batch_id, shard_no, owner=owner)  # nobody need wait for this lease
                discard(part.key)  # no commit names it
                return "conflict"
            if found:
                discard(found.source)
            link.committed(counts, part.end)
            _count_commit(counts)
            chaos.crash_point("crash_after_commit")
            start = part.end
            if link.ending is not None or time_left_ms() < settings.time_reserve_ms:
                break
    if lease.lost:
        logger.info(
            "shard lease lost: left to its new holder", extra={"batch_id": batch_id, "shard": shard_no}
        )
        return "lost"
    if start < size and link.ending is not None:
        shards.release(batch_id, shard_no, owner=owner)
        _end_early(header, link.ending)
        return "stopped"
    if start < size:
        # Sent only while this message still held the shard: else its new holder has a message.
        if not shards.release(batch_id, shard_no, owner=owner, continuation=True):
            return "lost"
        sqs.send(settings.shards_queue_url, [message], group_id=header.account_id)
        metrics.add_metric(name="Continuations", unit=MetricUnit.Count, value=1)
        return "continued"
    _finalize_if_last(batch_id)
    return "done"


def _count_commit(counts: dict[str, int]) -> None:
    """Metrics of one committed part (counted once: only the commit that won its condition)."""
    for name, key in _COMMIT_METRICS:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=counts.get(key, 0))


_COMMIT_METRICS = (
    ("RequestsCompleted", "completed"),
    ("RequestsFailed", "failed"),
    ("InputTokens", "input_tokens"),
    ("OutputTokens", "output_tokens"),
)


def _end_early(header: BatchHeader, ending: Ending) -> None:
    """After a worker stopped for `ending`: an expiry it found itself (`expires_at` passed) is begun
    here (`batches.begin_expiry`) and handed to the aggregator; a cancel was handed over by the API."""
    if ending.status == BatchStatus.EXPIRED and batches.begin_expiry(header.id):
        sqs.send(
            get_settings().finalize_queue_url,
            [sqs.BatchMessage(batch_id=header.id)],
            group_id=header.account_id,
        )


def _finalize_if_last(batch_id: str) -> None:
    """After a shard is done: the commit that completed the last shard asks for aggregation."""
    after = batches.get(batch_id)
    if after and after.shards_done >= after.shards_total:
        sqs.send(
            get_settings().finalize_queue_url,
            [sqs.BatchMessage(batch_id=batch_id)],
            group_id=after.account_id,
        )


# The lease owner of the sweeper's claims (`fail_shard`): not a worker.
SWEEPER_OWNER = "sweeper/"


def fail_shard(batch_id: str, shard: Shard, reason: str) -> bool:
    """Record a shard's unfinished requests as `processing_failed` error lines (its messages keep dying).

    The shard is claimed first, as a worker would, so no worker runs it meanwhile, and its result key
    is its own (`_write_part`: a worker paused past its lease can't overwrite it, issue 12). Returns
    False when a live lease holds it or another attempt committed first (nothing written counts, its
    key is deleted; the sweeper looks again later).
    """
    settings = get_settings()
    owner = f"{SWEEPER_OWNER}{batch_id}/{ids.write_token()}"  # its own: an overlapping sweep's differs
    claimed = shards.claim(batch_id, shard.shard, owner=owner, lease_seconds=settings.shard_lease_seconds)
    if claimed is None:
        return False
    start, size = claimed.next_index, claimed.size
    shard = claimed
    requests = parse_shard(s3.get_bytes(settings.bucket_name, shard.input_key))[start:]
    data, counts = never_ran(batch_id, requests, "processing_failed", reason)
    part = _write_part(batch_id, shard.shard, start, size, data, 0, counts)
    # The commit ends the lease (one PUT and one commit: well within it, no heartbeat).
    if not shards.commit(batch_id, shard.shard, part, owner=owner, size=size, **counts):
        shards.release(batch_id, shard.shard, owner=owner)
        discard(part.key)
        return False
    _count_commit(counts)
    _finalize_if_last(batch_id)
    return True
