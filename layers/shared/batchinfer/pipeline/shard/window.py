"""One window of a shard: its requests run concurrently on the backend, until they are done, the
window's time is up (a checkpoint, the invocation's deadline), the batch ends or the lease is lost.

`WindowRun(...).run()` -> `Window` (what each request ended in); `run_requests` for a window without
a link to the batch (benchmarks, tests).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from batchinfer.backends.base import BackendError, ChatBackend, RequestNotStarted, Withdrawable
from batchinfer.backends.limiter import AdaptiveLimiter
from batchinfer.core import ids
from batchinfer.core.observability import logger
from batchinfer.endpoints.base import Endpoint
from batchinfer.pipeline.shard.grouping import grouped_order
from batchinfer.pipeline.shard.limits import (
    Latency,
    Limited,
    NotStarted,
    Timed,
    latency_for,
    limiter_for,
)
from batchinfer.pipeline.shard.parts import tally
from batchinfer.pipeline.shard.progress import Ending, ProgressLink
from batchinfer.pipeline.shard.requests import COUNTS, Outcome, Request
from batchinfer.pipeline.shard.retry import call_backend

# How often the deadline of the requests in flight is looked at (seconds).
DEADLINE_CHECK_S = 0.05
# Requests are grouped by their prompt's start within blocks of this many times the concurrency.
GROUP_BLOCK = 4


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


async def run_requests(
    backend: ChatBackend,
    requests: list[Request],
    batch_id: str,
    *,
    endpoint: Endpoint,
    concurrency: int,
    time_left_ms: Callable[[], int],
    reserve_ms: int,
) -> list[Outcome]:
    """Run requests, launched in input order (sharers of a prompt prefix together), at most
    `concurrency` in flight (`WindowRun` without a link to the batch): the outcomes of the prefix of
    `requests` that finished, in input order."""
    window = await WindowRun(
        backend,
        requests,
        batch_id,
        endpoint=endpoint,
        concurrency=concurrency,
        time_left_ms=time_left_ms,
        reserve_ms=reserve_ms,
    ).run()
    return window.prefix()


@dataclass(eq=False)
class WindowRun:
    """Run `requests` of batch `batch_id` on `backend`, at most `concurrency` in flight (`run()` ->
    `Window`; one run per instance), launched in input order but for requests starting with the same
    prompt text, launched together (`grouping.grouped_order`, in blocks of `GROUP_BLOCK *
    concurrency`) so that the backend's prefix cache holds their prefix while they run.

    How many are really in flight adapts to the backend (`limiter_for`,
    `batchinfer.backends.limiter.AdaptiveLimiter`) between 1 and `concurrency`: cut on 429/503 answers,
    on latency that shows a queue, and on Retry-After, grown back on successes, so the backend is kept
    full without being flooded or queued. Stops launching when `time_left_ms()` (this window's time,
    e.g. to a checkpoint) drops under `reserve_ms`, but for the first request: it is launched unless
    the invocation must stop (the deadline, the batch's end, the lease lost), so every window makes
    progress.

    The per-request deadline (so the shard commits what finished before Lambda kills the function)
    is the invocation's remaining time `deadline_ms()` (default `time_left_ms`) minus `reserve_ms`: no
    request is launched that the backend's observed latency (`latency_for`) says cannot finish by
    then; once that is so, requests still waiting in the backend's queue are withdrawn
    (`backends.base.Withdrawable`: back unstarted, they run in the next invocation); at the deadline
    itself the requests still in flight are dropped unstarted too (sent again later), so the caller
    commits before the function is killed.

    With a `link`, every `progress_seconds` the finished requests' counts are published on the batch
    (`ProgressLink.publish`, in a thread: the loop goes on) with the limiter's window, the limiter takes
    its share of what the batch's running workers found (`AdaptiveLimiter.share_with`: they split the
    backend fairly, and a worker that ends leaves its share to the others), and the answer may end the
    batch: then no request is launched any more, requests waiting in the backend's queue are withdrawn
    (`backends.base.Withdrawable`: they never reach the model), and those at the model get
    `grace_seconds` (never past `reserve_ms` before the deadline) before they are cut off (the
    ending's `cut` outcome). The publish in flight is awaited before returning, so it never lands
    after the caller's commit.

    Once `lost()` (the shard's lease was taken over: `LeaseHeartbeat.lost`), nothing more is launched
    and the requests in flight are dropped (their answers would not be committed): the window returns
    within `DEADLINE_CHECK_S`.
    """

    backend: ChatBackend
    requests: list[Request]
    batch_id: str
    _: KW_ONLY
    endpoint: Endpoint
    concurrency: int
    time_left_ms: Callable[[], int]
    reserve_ms: int
    link: ProgressLink | None = None
    progress_seconds: float = 1.0
    grace_seconds: float = 0.0
    deadline_ms: Callable[[], int] | None = None
    lost: Callable[[], bool] | None = None
    # What the run finds: one outcome per request, the batch's ending once the link reported one, the
    # counts of the finished requests (what the link publishes), the requests' tasks, the publish.
    outcomes: list[Outcome | None] = field(init=False, default_factory=list)
    endings: list[Ending] = field(init=False, default_factory=list)
    finished: dict[str, int] = field(init=False, default_factory=lambda: dict.fromkeys(COUNTS, 0))
    tasks: list[asyncio.Future[None]] = field(init=False, default_factory=list)
    publishing: list[asyncio.Future[Ending | None]] = field(init=False, default_factory=list)
    limiter: AdaptiveLimiter = field(init=False)
    latency: Latency = field(init=False)
    timed: Timed = field(init=False)

    def _budget_s(self) -> float:
        return ((self.deadline_ms or self.time_left_ms)() - self.reserve_ms) / 1000

    def _lease_lost(self) -> bool:
        return self.lost is not None and self.lost()

    def _must_stop(self) -> bool:
        return bool(self.endings) or self._lease_lost() or self._budget_s() < self.latency.estimate()

    def _out_of_time(self) -> bool:
        return self._must_stop() or self.time_left_ms() < self.reserve_ms

    async def run(self) -> Window:
        """Run the window's requests (see the class); what each one ended in."""
        self.limiter = limiter_for(self.backend, self.concurrency)
        self.limiter.control.restart(self.limiter.clock())
        if self.link is not None and self.limiter.control.latency:  # start at the share the others found
            self.limiter.share_with(self.link.windows)
        self.latency = latency_for(self.backend)
        self.timed = Timed(self.backend, self.latency)
        self.outcomes = [None] * len(self.requests)
        # Every request waits for its permit in the limiter from the start (a shard's requests are in
        # memory anyway), its checks done: a finished request hands its permit straight to the next
        # one, in one event loop step, and the backend's freed slot is refilled at once.
        #
        # What is alive now (modules, clients, the shard) outlives this window: the collector need not
        # scan it while requests are in flight (a full collection of it stalls the loop ~70 ms).
        gc.freeze()
        order = grouped_order(self.requests, GROUP_BLOCK * self.concurrency)
        self.tasks += [asyncio.ensure_future(self._one(index, self.requests[index])) for index in order]
        everything = asyncio.gather(*self.tasks)
        guarding = asyncio.ensure_future(self._guard())
        watcher = asyncio.ensure_future(self._watch(self.link)) if self.link is not None else None
        try:
            if watcher is None:
                await everything
            else:
                await asyncio.wait({everything, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not everything.done():  # the batch is ending: the requests at the model get the grace
                    grace = max(0.0, min(self.grace_seconds, self._budget_s()))
                    if not (await asyncio.wait({everything}, timeout=grace))[0]:
                        for task in self.tasks:
                            task.cancel()
                        await everything
        finally:
            guarding.cancel()
            if watcher is not None:
                watcher.cancel()
                if self.publishing and not self.publishing[0].done():
                    await asyncio.wait(self.publishing)
            gc.unfreeze()
        return Window(self.requests, self.outcomes, self.endings[0] if self.endings else None)

    async def _one(self, index: int, request: Request) -> None:
        request_id = ids.request_id(self.batch_id, request.line)
        # The first request (first in line for a permit) goes unless the invocation must stop: a window
        # always makes progress, however short its checkpoint or busy the machine.
        out_of_time = self._must_stop if index == 0 else self._out_of_time
        limited = Limited(self.timed, self.limiter, out_of_time, self._must_stop)
        try:
            body = await call_backend(limited, request.body)
            outcome = Outcome(request, 200, body, body.get("id") or request_id)
        except (NotStarted, RequestNotStarted):  # permits are first come, first served
            return
        except asyncio.CancelledError:  # the grace after the batch's end, or the deadline, ran out
            if not limited.started or not self.endings:
                return  # sent again later
            outcome = self.endings[0].cut(request)
        except BackendError as error:
            outcome = Outcome(request, error.status_code, error.body(), request_id)
        except Exception as error:
            logger.exception("backend raised", extra={"custom_id": request.custom_id})
            outcome = Outcome(
                request,
                500,
                # Logged in full above; the tenant's line names the failure, not where (hosts, ports).
                BackendError(500, f"backend error ({type(error).__name__})", type="server_error").body(),
                request_id,
            )
        self.outcomes[index] = outcome
        tally(self.finished, outcome, self.endpoint)

    async def _guard(self) -> None:
        backend, withdrawn = self.backend, False
        while (left := self._budget_s()) > 0 and not self._lease_lost():
            if not withdrawn and left < self.latency.estimate() and isinstance(backend, Withdrawable):
                withdrawn = True
                backend.withdraw_waiting()
            await asyncio.sleep(min(DEADLINE_CHECK_S, left))
        for task in self.tasks:
            task.cancel()

    async def _watch(self, link: ProgressLink) -> None:
        while True:
            await asyncio.sleep(self.progress_seconds)
            window = self.limiter.control.published()
            self.publishing[:] = [
                asyncio.ensure_future(asyncio.to_thread(link.publish, dict(self.finished), window))
            ]
            try:
                ending = await asyncio.shield(self.publishing[0])
            except Exception:  # a throttled write: the next interval tries again
                logger.warning("progress not published", exc_info=True, extra={"batch_id": self.batch_id})
                continue
            if self.limiter.control.latency:  # an in-process engine's window is fixed
                self.limiter.share_with(link.windows)
            if ending is not None:
                self.endings.append(ending)
                if isinstance(self.backend, Withdrawable):
                    self.backend.withdraw_waiting()
                return
