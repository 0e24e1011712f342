"""Adaptive concurrency for one model backend: how many requests to keep in flight, found from the
backend's answers, whatever kind of backend it is.

Model servers overload in three ways, and a client sees each differently:

- refusing (TGI `max_concurrent_requests`, most gateways): 429/503 at once beyond C in flight;
- queueing (vLLM, Triton): never refuse; beyond C in flight requests wait in a FIFO, so latency rises
  (by L per C queued) while throughput stays C/L;
- rate-limited (OpenAI, Azure OpenAI, Bedrock: tokens per minute): 429 with Retry-After when a token
  bucket is empty, whatever the concurrency.

One controller handles all three, from three signals a request's answer carries: its latency (RTT),
whether it was refused (429/503), and a Retry-After.

Latency (queueing): TCP Vegas (Brakmo & Peterson, 1995) estimates the queue a sender keeps at the
bottleneck as  q = W * (1 - base_rtt / rtt)  (W: requests in flight, base_rtt: the RTT with no queue,
rtt: the RTT now). For a FIFO server with C slots and W > C in flight, rtt = L * W / C, so
W * base_rtt / rtt = C: one RTT sample measures the capacity directly. Netflix's concurrency-limits
(`GradientLimit`, `Gradient2Limit`) uses the same ratio as a "gradient": new = limit * base/rtt + headroom.
Here, once per round (one RTT: until a request sent after the round began has been answered), with rtt
the *mean* over the round's answers minus the client's own event-loop lag (a deterministic server
answers in waves: a queue of k makes k requests of each wave wait a whole L and the rest none, so the
minimum shows nothing) and W the mean in flight when they were sent:

    q > high(W)  (5% of W, at least 0.75):  limit = 0.95 * W * base_rtt / rtt   (cut 5% below the
                                            estimate of C; at once when q > 10% of W, else when the
                                            next round agrees)
    q < low(W)   (2% of W, at least 0.5):   limit += s * 2^max(0, k - 2), s = max(1, sqrt(limit) / 4),
                                            k the rounds in a row without queue, at most doubling
                                            the limit (probe, if the limit held requests back)
    otherwise hold.

A latency cut after which the RTT does not fall by at least half the predicted amount, or after
which the throughput (Little's law, w / rtt over the round) falls by 10% or more, is undone and
the base RTT re-set to today's (the delay was not our queue: a slower backend, a CPU-starved client;
Vegas's known weak spot, a stale base RTT; measured: on a machine at load 5-12, a client on a
refusing C = 512 server that cut on such delays ran at 40-70% of the same client with a fixed window).

The band is a fraction of W, so the standing queue is a few % of C at any size. base_rtt is
a windowed minimum (the last 30-60 s) of successful answers' RTTs, never of refusals (those are fast).
Samples from requests sent before a cut are ignored (the cut's effect is not in them yet), as Vegas
and the AIMD limiter before this one do.

Refusals (refusing servers): AIMD, as TCP Reno and the AIMD limiter before this one. In startup the
first refusals say how much the backend holds: at most what is still in flight, so each refusal sets
the limit to that (the first burst finds C exactly). Then the first refusal of a request sent since the
last cut multiplies the limit by `refused_decrease` (0.95) and starts a new epoch; each further refusal
of a request sent before it takes one off (k refusals of one window say the backend holds k fewer).
A refused request is retried at once, first in line, so a limit a little above C costs only cheap
refusals while a limit below C costs throughput: the decrease is mild and the probe steady.

Retry-After (rate limits): a 429 with Retry-After is a rate signal, not a capacity one. The limiter
closes a gate for everyone until Retry-After has passed (no retry storm: the refused requests and all
others wait, in order), cuts the limit as for a refusal (`rate_decrease`), and from then on *paces*
its sends: at most one every base_rtt / limit seconds, so the limit W gives a steady W / base_rtt
requests per second instead of bursts that empty the bucket. AIMD on W then finds rate * RTT.

Startup: from `initial` (64), slow start (each answer that comes back without queueing and while the
limit holds requests back adds `startup_growth`, 2: the limit triples per round) until a refusal, a
Retry-After or a queue ends it. In startup a queue is found from delivery, not from W * base/rtt: the
answers delivered during one request's RTT, scaled by base/rtt (BBR's bandwidth x min RTT),
max-filtered over 1.5 base RTTs, is the capacity we get, right in a transient too.
Starting at the ceiling would fill a refusing server in one round trip,
but would put the whole ceiling in a queueing server's queue (512 requests queued in front of a
C = 8 vLLM is 64 round trips of latency); `initial` is that trade-off: a refusing C = 512 costs about
1.5 round trips to reach, a queueing C >= 64 a transient queue of up to ~2.5 C for one or two.

`latency=False` turns the latency rules off (a fixed window up to `maximum` that only refusals move):
for an in-process engine, whose latency grows with its batch by design.

Fairness (workers sharing one server, each with its own limiter and no word with the others): AIMD
converges to equal shares because every decrease is multiplicative and every increase the same for all
(Chiu & Jain 1989); it needs both. Decreases: a refusal cuts by `refused_decrease` and a queue by
`queue_decrease` (0.95) below the estimate. A cut only to the estimate would make every split of the
server an equilibrium: each worker sees the same RTT, so each one's q is the same fraction of its W and
nobody moves (Vegas with a band, alpha < beta, shares by order of arrival: Boutremans & Le Boudec, "A
Note on the Fairness of TCP Vegas", 2000). Increases: the probe grows with the rounds since the worker's
last cut (doubling each round after the second, as BBRv2's ProbeBW_UP raises inflight_hi by 1 <<
bw_probe_up_rounds per round, BBRRaiseInflightHiSlope in
draft-cardwell-iccrg-bbr-congestion-control-02), not with its window (CUBIC's growth is likewise a
function of the time since the last loss, Ha, Rhee & Xu 2008), so a worker that starts while another
holds the server, cut to a few by its first refusals, is back at its share in log2(C) rounds instead of
C. On a refusing server a slot freed by one worker's answer goes to whichever request reaches the server
first, so refusals fall on the workers in proportion to the slots they hold (rate-dependent losses,
under which even MIMD shares fairly: Altman, Avrachenkov & Prabhu, "Fairness in MIMD Congestion Control
Algorithms", 2005). Cost on one worker alone (the model): none on a refusing server; on a queueing one a
deeper cut, 5% for about two rounds after each queue.

Hand-written: no library in common use implements adaptive concurrency for asyncio (aiolimiter and
friends limit rates; Netflix's concurrency-limits is Java), and the rules above are the domain.

The pure decision functions (`vegas_queue`, `queue_band`, `probe_step`, `LimitController`) take
times as arguments and have no asyncio, for unit tests; `AdaptiveLimiter` is the asyncio semaphore
around the controller (one loop, not thread-safe). Tuned against a discrete-event model of the three
server kinds (tests/unit/backends/test_limiter.py) and the grid of `make bench` (benchmarks/grid.py).

Sources: L. Brakmo, L. Peterson, "TCP Vegas: End to End Congestion Avoidance on a Global Internet"
(IEEE JSAC 1995); Netflix concurrency-limits, `VegasLimit`, `GradientLimit`, `Gradient2Limit`
(github.com/Netflix/concurrency-limits); D. Chiu, R. Jain, "Analysis of the Increase and Decrease
Algorithms for Congestion Avoidance" (1989) for AIMD fairness; BBR (Cardwell et al., 2016) for
pacing, round counting and "a signal from a request sent before the change is stale".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from batchinfer.backends.limiter_rules import LimitController, Permit

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
