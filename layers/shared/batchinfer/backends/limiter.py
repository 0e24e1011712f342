"""Adaptive concurrency for one model backend: how many requests to keep in flight, found from the
backend's answers (latency, 429/503 refusals, Retry-After), whether it refuses, queues or rate-limits.

The design, its rules and their sources: docs/architecture.md, "Adaptive concurrency". The pure
decision functions (`vegas_queue`, `queue_band`, `probe_step`, `LimitController`) take times as
arguments and have no asyncio, for unit tests; `AdaptiveLimiter` is the asyncio semaphore around the
controller (one loop, not thread-safe).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from batchinfer.backends.limiter_rules import LimitController, Permit, SharedCapacity

__all__ = ["AdaptiveLimiter"]


class AdaptiveLimiter:
    """An asyncio semaphore whose size is `LimitController.limit`; also a gate (Retry-After) and a pacer.

    acquire() -> Permit; send the request; then exactly one of
      release(permit, latency=..., refused=False)          an answer (any status but 429/503)
      release(permit, refused=True, retry_after=seconds)   a 429/503 (retry_after from the header, if any)
      give_back(permit)                                    never sent
    `latency` defaults to the time since acquire. Waiters are served first come, first served, except
    retries (`first_in_line`). Not thread-safe: use it from one loop.
    """

    def __init__(
        self,
        maximum: int = 512,
        *,
        clock=time.monotonic,
        lag_probe: float = 0.01,
        **options,
    ) -> None:
        """`maximum`: the safety cap on requests in flight; `clock`: seconds (monotonic); `lag_probe`:
        seconds between the event-loop lag timer's ticks (0: none); `options`: `LimitController`'s."""
        self.control = LimitController(maximum, **options)
        self.clock = clock
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_send = 0.0
        self.peak_in_flight = 0
        self.trace: list[tuple[float, int, int]] | None = None  # (time, limit, in_flight) if enabled
        # Event loop lag: how late a 10 ms timer fires. An answer waits about that long in our own
        # loop before we see it; it is subtracted from the RTT, so a busy client (or a CPU-starved
        # one: a small Lambda, noisy neighbours) is not taken for a queueing server.
        self.lag = 0.0
        self._probe: asyncio.TimerHandle | None = None
        self._probe_due = 0.0
        self.lag_probe = lag_probe
        self.shared = SharedCapacity()

    @property
    def limit(self) -> int:
        """Requests allowed in flight now."""
        return self.control.limit

    @property
    def maximum(self) -> int:
        """The cap on `limit`. Settable (a per-account share bound, WORKER_CONCURRENCY changed): what
        was learned of the backend is kept, the window clamped to the new cap."""
        return self.control.maximum

    @maximum.setter
    def maximum(self, value: int) -> None:
        control = self.control
        control.maximum = max(control.minimum, value)
        control._set(control.window)
        self._wake()

    def _may_send(self, now: float) -> float:
        """0 when a request may go now, else how long until it may (gate, pacing)."""
        control = self.control
        if now < control.pause_until:
            return control.pause_until - now
        if control.paced(now) and now < self._next_send:
            return self._next_send - now
        return 0.0

    def _grant(self, now: float) -> None:
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        if self.control.paced(now):
            self._next_send = max(now, self._next_send) + self.control.pace_interval()

    def _lag_tick(self) -> None:
        now = self.clock()
        late = max(0.0, now - self._probe_due)
        self.lag = late if late > self.lag else 0.7 * self.lag + 0.3 * late  # fast up, slow down
        if self.in_flight or self._waiters:
            self._probe_due = now + self.lag_probe
            self._probe = asyncio.get_running_loop().call_later(self.lag_probe, self._lag_tick)
        else:
            self._probe = None

    async def acquire(self, *, first_in_line: bool = False) -> Permit:
        """Wait for room in the window (and the Retry-After gate, and pacing); the permit to hand back.

        `first_in_line`: ahead of all waiting (a retry of a refused request)."""
        now = self.clock()
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # timers of a loop that has ended never fire: start afresh
            self._loop, self._probe, self._timer = loop, None, None
        if self._probe is None and self.lag_probe:
            self._probe_due = now + self.lag_probe
            self._probe = asyncio.get_running_loop().call_later(self.lag_probe, self._lag_tick)
        if self.in_flight < self.limit and (first_in_line or not self._waiters) and not self._may_send(now):
            self._grant(now)
        else:
            if self.in_flight >= self.limit:
                self.control.limited = True
            waiter = asyncio.get_running_loop().create_future()
            if first_in_line:
                self._waiters.appendleft(waiter)
            else:
                self._waiters.append(waiter)
            self._wake()
            try:
                await waiter  # `_wake` counted this request in flight before resolving it
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.in_flight -= 1
                    self._wake()
                elif waiter in self._waiters:  # `_wake` drops waiters cancelled before their turn
                    self._waiters.remove(waiter)
                raise
            now = self.clock()
        return Permit(self.control.epoch, now, self.in_flight, self.control.delivered)

    def release(
        self,
        permit: Permit,
        *,
        latency: float | None = None,
        refused: bool = False,
        retry_after: float | None = None,
        sample: bool = True,
    ) -> None:
        """Hand back `permit` once its request was answered.

        `refused`: a 429/503 (`retry_after` seconds when the answer gave them); `latency`: seconds, by
        default since `acquire`; `sample=False`: an answer that says nothing of the backend's queue (an
        error answered at once, a client-side timeout): it frees the place and moves nothing.
        """
        now = self.clock()
        if self._waiters or self.in_flight >= self.limit:
            self.control.limited = True
        self.in_flight -= 1
        if refused:
            self.control.on_refused(now, permit, self.in_flight, retry_after)
        elif sample:
            rtt = now - permit.sent_at if latency is None else latency
            self.control.on_success(now, permit, rtt, self.lag)
        if self.trace is not None:
            self.trace.append((now, self.limit, self.in_flight))
        self._wake()

    def share_with(self, windows: list[int | None]) -> None:
        """Move to this worker's share of what the workers of its batch learned together: `windows`,
        every running worker's published window (`LimitController.published`), this one's included."""
        share = self.shared.share(windows)
        if share is not None and self.control.adopt(share, self.clock()):
            self._wake()

    def give_back(self, permit: Permit) -> None:
        """Hand back a `permit` never used to send a request: the limit does not change."""
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        now = None
        while self._waiters and self.in_flight < self.limit:
            now = self.clock() if now is None else now
            wait = self._may_send(now)
            if wait > 0:
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(wait, self._on_timer)
                return
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._grant(now)
                waiter.set_result(None)

    def _on_timer(self) -> None:
        self._timer = None
        self._wake()
