"""Adaptive concurrency: how many requests a shard worker keeps in flight against a model backend.

A backend's capacity is not known in advance and is shared with the other shard workers of the
batch (and other users). The limiter finds it the way TCP congestion control does:

- slow start: from a small `initial` limit, every request that completes while the limit holds
  others back adds one (the limit doubles per round trip) until the first overload answer (429, 503);
- the first overload answers say how much the backend holds: at most the requests still in flight,
  so each refusal of a request sent before any cut brings the limit down to that number. Starting at
  the maximum (what the shard worker does) fills a backend of unknown capacity in the first round
  trip, and the refusals of that first burst bring the limit to the capacity exactly;
- then AIMD (additive increase, multiplicative decrease): such a completion adds `increase / limit`
  (about `increase` per round trip), and an overload answer multiplies the limit by `decrease`, once
  per round trip: further refusals of requests sent before that cut each take one off the limit
  instead (k refusals of one window say the backend holds k fewer), so a limit far above the
  backend's capacity comes down in one round trip, not in dozens of 3% cuts.

Several workers sharing one backend converge to equal shares, and the backend stays close to full.

No library in common use implements this for asyncio (aiolimiter and friends limit rates, not
concurrency), hence this module.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

__all__ = ["AIMDLimiter", "Permit"]


@dataclass(frozen=True, slots=True)
class Permit:
    """One request's right to be in flight; hand it back with `AIMDLimiter.release`.

    `epoch` counts the limiter's cuts when the permit was granted.
    """

    epoch: int


class AIMDLimiter:
    """An asyncio semaphore whose size adapts to the backend, between `minimum` and `maximum`.

    It starts at `initial` (clamped to the bounds) in slow start, then runs AIMD (see the module
    docstring). Waiters are served first come, first served, except retries (`first_in_line`).
    Not thread-safe: use it from one loop.
    """

    def __init__(
        self,
        maximum: int,
        *,
        minimum: int = 1,
        initial: int = 16,
        increase: float = 1.0,
        decrease: float = 0.97,
    ) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum} and {maximum}")
        if not 0 < decrease < 1 or increase <= 0:
            raise ValueError("need 0 < decrease < 1 and increase > 0")
        self.minimum, self.maximum = minimum, maximum
        self.increase, self.decrease = increase, decrease
        self._window = float(min(maximum, max(minimum, initial)))
        self._threshold = float(maximum)  # slow start below it; set by the first cut
        self.in_flight = 0
        self.epoch = 0
        self.overloads = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def limit(self) -> int:
        """Requests allowed in flight now."""
        return int(self._window)

    @property
    def window(self) -> float:
        """The fractional limit that additive increase accumulates into."""
        return self._window

    async def acquire(self, *, first_in_line: bool = False) -> Permit:
        """Wait for room in the window; return the permit to `release` when the request is answered.

        `first_in_line` puts the request ahead of all waiting ones (a retry of a refused request, so it
        is sent in the next free place rather than after everything queued meanwhile).
        """
        if self.in_flight < self.limit and (first_in_line or not self._waiters):
            self.in_flight += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            if first_in_line:
                self._waiters.appendleft(waiter)
            else:
                self._waiters.append(waiter)
            try:
                await waiter  # `_wake` counted this request in flight before resolving it
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.in_flight -= 1  # granted, then cancelled: give the room back
                    self._wake()
                elif waiter in self._waiters:  # `_wake` drops waiters cancelled before their turn
                    self._waiters.remove(waiter)
                raise
        return Permit(self.epoch)

    def release(self, permit: Permit, *, overloaded: bool = False) -> None:
        """Hand back `permit`: `overloaded` when the backend refused for lack of capacity (429, 503).

        A success grows the limit only while the limit is what holds requests back (some wait, or
        the window is full): a limit that is not used says nothing about the backend.
        """
        limiting = bool(self._waiters) or self.in_flight >= self.limit
        self.in_flight -= 1
        if overloaded:
            self.overloads += 1
            if permit.epoch == 0:  # the first probe: the backend holds at most the requests still out
                self.epoch = max(self.epoch, 1)
                window = min(self._window, float(self.in_flight))
            elif permit.epoch == self.epoch:  # the first refusal since the last cut
                self.epoch += 1
                window = self._window * self.decrease
            else:  # one more refusal of the window that was cut
                window = self._window - 1
            self._window = self._threshold = max(float(self.minimum), window)
        elif limiting and self._window < self.maximum:
            step = self.increase if self._window < self._threshold else self.increase / self._window
            self._window = min(float(self.maximum), self._window + step)
        self._wake()

    def give_back(self, permit: Permit) -> None:
        """Hand back a `permit` that was never used to send a request: the limit does not change."""
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)
