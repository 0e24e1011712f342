"""The rules of the adaptive limiter (`batchinfer.backends.limiter`), pure: the limit and what moves it
(`LimitController`), the signals it reads (`vegas_queue`, `capacity_estimate`, `queue_band`,
`probe_step`, `WindowedMin`) and what the workers of one batch learned together (`SharedCapacity`).
No asyncio: the caller passes times (seconds, any monotonic origin) and counts, so unit tests drive
them with exact values.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "LimitController",
    "LimiterState",
    "Permit",
    "SharedCapacity",
    "WindowedMin",
    "capacity_estimate",
    "probe_step",
    "queue_band",
    "vegas_queue",
]

# In startup, an answer whose RTT is this fraction over the base RTT waited in a queue.
STARTUP_WAITED = 0.1
# A latency cut is undone when the next round's throughput (w / rtt) is this fraction below the last.
CUT_LOSS = 0.1
# A window is moved to its share of what the workers learned together (`LimitController.adopt`) when it
# is further than this fraction from it: closer, it is the limiter's own probing.
SHARE_TOLERANCE = 0.05


class LimiterState(StrEnum):
    """Where `LimitController` is: finding the backend's capacity from its first burst (`STARTUP`,
    slow start), or holding it (`STEADY`, after the first cut)."""

    STARTUP = "startup"
    STEADY = "steady"


def vegas_queue(in_flight: float, base_rtt: float, rtt: float) -> float:
    """Vegas's estimate of the requests this sender keeps queued at the server: W * (1 - base/rtt)."""
    if rtt <= 0 or base_rtt <= 0 or rtt <= base_rtt:
        return 0.0
    return in_flight * (1.0 - base_rtt / rtt)


def capacity_estimate(delivered: int, base_rtt: float, rtt: float) -> float:
    """Requests the backend serves at once for us: `delivered` answers during one request's `rtt`,
    scaled to the RTT without queue (`base_rtt`). For a FIFO server of C slots that we keep full,
    delivered = C * rtt / base_rtt, so this is C whatever the queue."""
    if rtt <= 0:
        return float(delivered)
    return delivered * min(1.0, base_rtt / rtt)


def queue_band(window: float, low: float = 0.02, high: float = 0.05) -> tuple[float, float]:
    """(grow below, cut above): the queue this sender may keep, a fraction of its window with floors."""
    return max(0.5, low * window), max(0.75, high * window)


def probe_step(window: float, factor: float = 0.25) -> float:
    """The first step of a probe (requests): sublinear in the window (a small overshoot); it doubles
    over the rounds without queue that follow (`LimitController`)."""
    return max(1.0, factor * math.sqrt(window))


class WindowedMin:
    """The minimum of the samples of the last `window`..2*`window` seconds (two rotating buckets)."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self._current = math.inf
        self._previous = math.inf
        self._rotated = None  # type: float | None

    def add(self, now: float, value: float) -> None:
        """Record `value` at time `now` (seconds)."""
        if self._rotated is None:
            self._rotated = now
        elif now - self._rotated >= self.window:
            self._previous, self._current, self._rotated = self._current, math.inf, now
        if value < self._current:
            self._current = value

    def reset(self, value: float) -> None:
        """Forget every sample: `value` is the minimum from now on (a re-based RTT)."""
        self._current = self._previous = value

    @property
    def value(self) -> float | None:
        """The minimum, or None before any sample."""
        best = min(self._current, self._previous)
        return None if best == math.inf else best


class SharedCapacity:
    """What the shard workers of one batch learned of their backend together, from the windows they
    publish with their progress (`pipeline.shard.progress.ProgressLink`): the backend holds about the
    sum of the steady windows (each cut by the refusals or the queue it met), so each worker's fair
    share is that sum over the workers running. When fewer workers run than at the last look (one
    ended, its window left the sum), the last sum stands: the ended worker's share goes to those left
    instead of being probed for again.
    """

    def __init__(self) -> None:
        self._last: tuple[int, int] = (0, 0)  # (workers, sum) at the last look

    def share(self, windows: list[int | None]) -> float | None:
        """Each worker's share, given every running worker's published window (None: a worker still in
        startup, or one that does not adapt); None when no window is known."""
        known = [w for w in windows if w is not None]
        if not known:
            return None
        workers, total = len(windows), sum(known)
        if workers < self._last[0]:
            total = max(total, self._last[1])
        self._last = (workers, total)
        return total / workers


@dataclass(slots=True)
class Permit:
    """One request's right to be in flight: the cut `epoch`, the time, the in-flight count and the
    answers delivered so far when granted."""

    epoch: int
    sent_at: float
    in_flight: int
    delivered: int


class LimitController:
    """The limit and the rules that move it (see `batchinfer.backends.limiter`); no asyncio: the caller
    passes times (seconds, any monotonic origin) and counts.

    `limit` is the whole number of requests allowed in flight, between `minimum` and `maximum`;
    `window` its fractional value. Raises ValueError unless 1 <= minimum <= maximum.
    """

    def __init__(
        self,
        maximum: int = 512,
        *,
        minimum: int = 1,
        initial: int = 64,
        refused_decrease: float = 0.95,
        queue_decrease: float = 0.95,
        rate_decrease: float = 0.85,
        base_window: float = 30.0,
        band: tuple[float, float] = (0.02, 0.05),
        probe: float = 0.25,
        pace_for: float = 60.0,
        startup_growth: float = 2.0,
        latency: bool = True,
    ) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum} and {maximum}")
        self.minimum, self.maximum = minimum, maximum
        self.refused_decrease, self.rate_decrease = refused_decrease, rate_decrease
        self.queue_decrease = queue_decrease
        self.band, self.probe, self.pace_for = band, probe, pace_for
        self.startup_growth = startup_growth
        self.latency = latency
        self.window = float(min(maximum, max(minimum, initial)))
        self.state = LimiterState.STARTUP
        self.epoch = 0
        self.base = WindowedMin(base_window)
        self.pause_until = 0.0
        self.paced_until = -math.inf
        # the round in progress
        self._round_start = 0.0
        self._round_mark = None  # type: float | None
        self._round_rtt = 0.0
        self._round_lag = 0.0
        # (rtt, in flight) of the last latency cut, until the next round judged it
        self._check = None  # type: tuple[float, float] | None
        self._unjudged = False  # the round in progress is the first burst of a run (`restart`)
        self.rebased = 0
        self._suspect = False  # the last round showed a small queue
        self._round_w = 0.0
        self._round_n = 0
        self._recent: deque[tuple[float, float]] = deque()  # (time, estimate), decreasing estimates
        self.clear_rounds = 0  # rounds in a row without queue: the probe grows with them
        self.limited = False  # did the limit hold requests back during this round
        self.delivered = 0  # successful answers so far
        self.estimate = None  # type: float | None  # the last round's capacity estimate
        # counters, for logs and tests
        self.refusals = self.rate_limits = self.cuts = self.rounds = self.adopted = 0

    @property
    def limit(self) -> int:
        """Requests allowed in flight: the window rounded, within the bounds."""
        return max(self.minimum, min(self.maximum, int(self.window + 0.5)))

    def paced(self, now: float) -> bool:
        """Whether sends are paced at `now` (for `pace_for` s after a Retry-After)."""
        return now < self.paced_until

    def pace_interval(self) -> float:
        """Seconds between two paced sends: base RTT / window (0 before any RTT)."""
        base = self.base.value
        return 0.0 if base is None else base / max(1.0, self.window)

    def _set(self, window: float) -> None:
        self.window = max(float(self.minimum), min(float(self.maximum), window))

    def _cut(self, window: float, now: float) -> None:
        self._set(window)
        self.epoch += 1
        self.cuts += 1
        self.clear_rounds = 0
        self.state = LimiterState.STEADY
        self._round_mark = None
        self._new_round(now)  # of requests sent from now on

    def published(self) -> int | None:
        """The window this worker tells the others (`SharedCapacity`): its limit once steady (a window
        in startup says nothing of the backend yet); None when the limit does not adapt."""
        return self.limit if self.latency and self.state == LimiterState.STEADY else None

    def adopt(self, share: float, now: float) -> bool:
        """Take `share` (`SharedCapacity.share`) as the window: in startup (the others found the
        backend's capacity: this worker leaves startup at its share, a new epoch), or when the window is
        more than `SHARE_TOLERANCE` from it (the round and the probe go on: a new round at every share
        would never end one on a backend slower than the shares come, L = 1 s). Returns whether the
        window moved."""
        if self.state == LimiterState.STARTUP:
            self._cut(share, now)
            self.cuts -= 1  # not a cut: counted in `adopted`
        elif abs(self.window - share) > max(1.0, SHARE_TOLERANCE * share):
            self._set(share)
        else:
            return False
        self.adopted += 1
        return True

    def restart(self, now: float) -> None:
        """A new run of requests starts at `now` (a shard's next window, a warm worker's next shard):
        the round in progress, of answers to a run that has ended, is dropped, and the first round of
        the new run is not judged: its requests were granted one after another from an empty window
        (their in-flight counts a ramp from 1, their RTTs holding the burst's own sending), which reads
        as a queue of half the window (measured: a warm worker's next batch cut from 132 to 51 on a
        queueing server of C = 128, then 20 s to grow back)."""
        self._check, self._suspect = None, False
        self._round_mark = None
        self._new_round(now)
        self._unjudged = self.state == LimiterState.STEADY

    def on_success(self, now: float, permit: Permit, rtt: float, lag: float = 0.0) -> None:
        """A request sent with `permit` was answered after `rtt` seconds; `lag`: how late our own event
        loop runs now (part of `rtt` that is ours, not the backend's)."""
        self.delivered += 1
        self.base.add(now, rtt)
        base = self.base.value or rtt
        if permit.epoch != self.epoch:
            return  # sent before the last cut: says nothing about the limit now
        if not self.latency:
            if self.limited:
                self._set(
                    self.window
                    + (self.startup_growth if self.state == LimiterState.STARTUP else 1 / self.window)
                )
            return
        if self.state == LimiterState.STARTUP:
            # What the backend delivered to us while this request was out, per base RTT: the capacity
            # we get (BBR's bandwidth x min RTT). Unlike W * base/rtt it is right in a transient too
            # (a burst queued in waves of C, or the first wave after the window passed C, which comes
            # back at L while the requests behind it wait).
            own = max(base, rtt - lag)
            estimate = self._max_recent(
                now, capacity_estimate(self.delivered - permit.delivered, base, own), 1.5 * base
            )
            _, high = queue_band(permit.in_flight, *self.band)
            # Only an answer that waited says the server queues: the first burst's answers come back in
            # the order the server took its new connections, not the order they were sent, so one of
            # them can see fewer delivered before it than were sent before it, without any queue.
            waited = own > (1.0 + STARTUP_WAITED) * base
            if waited and permit.in_flight - estimate > max(high, 2.0):  # a queue: C is the estimate
                self._cut(estimate, now)
            elif self.limited:
                self._set(self.window + self.startup_growth)
            return
        # Rounds: the answers to the requests sent during one RTT under one window. A round counts the
        # requests sent from its start until its first answer came back (`_round_mark`); it ends at the
        # first answer to a request sent after that.
        if permit.sent_at < self._round_start:
            return  # sent under an earlier window
        if self._round_mark is None:
            self._round_mark = now
        elif permit.sent_at >= self._round_mark:
            self._end_round(now, base)
            if permit.sent_at < self._round_start:
                return
            if self._round_mark is None:
                self._round_mark = now
        self._round_rtt += rtt
        self._round_lag += lag
        self._round_w += permit.in_flight
        self._round_n += 1

    def _end_round(self, now: float, base: float) -> None:
        self.rounds += 1
        if self._unjudged:  # the burst that started a run (`restart`): the next round is judged
            self._unjudged = False
            self._new_round(now, False)
            return
        w = self._round_w / self._round_n
        rtt = max(base, (self._round_rtt - self._round_lag) / self._round_n)
        if self._check is not None:  # the first round after a latency cut: did the latency follow?
            before = self._check
            self._check = None
            # (Little's law: w / rtt is the round's throughput; a cut to a real queue's estimate keeps
            # it, a cut below what the backend serves loses it.)
            lost = w / rtt < (1.0 - CUT_LOSS) * before[1] / before[0]
            if lost or rtt - base > 0.5 * (before[0] - base):
                # It did not: the delay is not a queue of ours (a slower backend, shared load, our CPU).
                # Take today's RTT as the base and undo the cut (Vegas's weak spot, a stale base RTT).
                self.base.reset(rtt)
                self.rebased += 1
                self._set(max(self.window, before[1]))
                self._new_round(now, changed=True)
                return
        # Little's law over the round: throughput = w / mean rtt, so the backend serves w * base/rtt
        # at once for us. The *mean* RTT, not the minimum: a deterministic server answers in waves,
        # where a queue of k means k requests of each wave wait a whole L and the rest none.
        estimate = self.estimate = w * min(1.0, base / rtt)
        q = w - estimate
        low, high = queue_band(w, *self.band)
        if q > high:
            # A queue: cut below the estimate (fairness, module docstring) at once if it is large,
            # else when the next round shows it too (a standing queue stays; a spike of our own CPU or
            # of the network passes).
            if q > min(2 * high, 0.1 * w) or self._suspect:
                self._suspect = False
                self._cut(self.queue_decrease * estimate, now)
                self._check = (rtt, w)
                return
            self._suspect = True
            self._new_round(now, False)
            return
        self._suspect = False
        changed = False
        if q < low and self.limited:
            self.clear_rounds += 1
            before = self.limit
            # the probe doubles each round without queue after the second, at most doubling the window
            step = probe_step(self.window, self.probe) * 2 ** max(0, self.clear_rounds - 2)
            self._set(self.window + min(step, max(1.0, self.window)))
            changed = self.limit != before
        else:
            self.clear_rounds = 0
        self._new_round(now, changed)

    def _new_round(self, now: float, changed: bool = True) -> None:
        # after a change, only requests sent from now on tell about it; else the next round goes on
        # with the requests sent since this one's mark
        self._round_start = now if changed or self._round_mark is None else self._round_mark
        self._round_mark = None
        self._round_rtt, self._round_w, self._round_n, self._round_lag = 0.0, 0.0, 0, 0.0
        self.limited = False

    def _max_recent(self, now: float, estimate: float, span: float) -> float:
        """The largest estimate of the last `span` seconds, this one included (a monotonic deque):
        answers that come back together (a wave of C) see different counts delivered before them."""
        recent = self._recent
        while recent and recent[0][0] < now - span:
            recent.popleft()
        while recent and recent[-1][1] <= estimate:
            recent.pop()
        recent.append((now, estimate))
        return recent[0][1]

    def on_refused(
        self, now: float, permit: Permit, in_flight: int, retry_after: float | None = None
    ) -> None:
        """A request sent with `permit` was refused (429/503) at `now`; `in_flight`: the others still out.

        With `retry_after` (seconds, a rate limit): close the gate until then and pace from now on.
        """
        if retry_after is not None:
            self.rate_limits += 1
            self.pause_until = max(self.pause_until, now + retry_after)
            self.paced_until = now + self.pace_for
        else:
            self.refusals += 1
        if self.state == LimiterState.STARTUP or (permit.epoch == 0 and self.epoch == 1):
            # the first burst: the backend holds at most what is still in flight
            if self.state == LimiterState.STARTUP:
                self._cut(min(self.window, float(max(in_flight, self.minimum))), now)
            else:
                self._set(min(self.window, float(max(in_flight, self.minimum))))
        elif permit.epoch == self.epoch:  # the first refusal since the last cut
            factor = self.rate_decrease if retry_after is not None else self.refused_decrease
            self._cut(self.window * factor, now)
        elif retry_after is None:  # one more refusal of the window that was cut
            self._set(self.window - 1.0)
