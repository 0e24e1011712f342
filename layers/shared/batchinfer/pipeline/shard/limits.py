"""What the window knows of each backend, per process, and the wrappers a request goes through.

`limiter_for` (how many requests in flight the backend takes, learned across windows and warm
invocations), `latency_for` (how long it takes to answer), `concurrency_for` (the ceiling);
`Limited` (one request waits for a permit and tells the limiter what the answer says) and `Timed`
(answers timed into the latency).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from batchinfer.backends.base import BackendError, ChatBackend
from batchinfer.backends.limiter import AdaptiveLimiter
from batchinfer.core.observability import metrics
from batchinfer.pipeline.shard.retry import BACKOFF_CAP_S, OVERLOADED

_LIMITERS: weakref.WeakKeyDictionary[Any, AdaptiveLimiter] = weakref.WeakKeyDictionary()
# The first burst against a backend of unknown kind (docs/architecture.md, "Adaptive concurrency", Startup).
INITIAL_CONCURRENCY = 64


class NotStarted(Exception):
    """The request got its first permit with too little time left: it was not sent."""


class Limited:
    """One request's view of `backend`: each attempt waits for a permit of `limiter` and holds it while
    in flight; a retry waits outside the window, then goes ahead of the requests not sent yet.

    Tells the limiter what each answer says of the backend: a success its latency; a 429/503 a refusal
    with its Retry-After (the limiter's gate then owns that wait, `retry._wait` does not sleep it again);
    any other error nothing (answered at once or timed out: neither is a queue sample).

    The first attempt raises `NotStarted` instead of sending when `out_of_time()` (the window's time is
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
        """The backend's answer to `body`, sent with a permit; raises `NotStarted` (see the class) or
        what the backend raised."""
        permit = await self.limiter.acquire(first_in_line=self._started)
        if not self._started:
            if self.out_of_time():
                self.limiter.give_back(permit)
                raise NotStarted
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


class Timed:
    """`backend` whose answers (and errors) are timed into `latency`."""

    def __init__(self, backend: ChatBackend, latency: Latency) -> None:
        self.backend, self.latency = backend, latency

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The backend's answer to `body` (or its error), timed."""
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


def concurrency_for(backend: Any, ceiling: int) -> int:
    """The most requests to keep in flight on `backend`: its `concurrency_hint` (an in-process engine's
    sequences and a few waiting, see `batchinfer.backends.base.ChatBackend`) when it has one, else
    `ceiling` (WORKER_CONCURRENCY, under which `run_requests` finds a remote backend's capacity);
    never above `ceiling`."""
    hint = getattr(backend, "concurrency_hint", None)
    return min(hint, ceiling) if hint else ceiling
