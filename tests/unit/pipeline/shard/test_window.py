"""A window of a shard's requests: bounded and adaptive concurrency, order kept, the time limit,
retries through the limiter, the batch's end while it runs, the per-request deadline."""

import asyncio
import json
from typing import Any

import pytest

from batchinfer.backends.base import BackendError, RequestNotStarted
from batchinfer.endpoints.registry import endpoint_for
from batchinfer.pipeline.shard import retry
from batchinfer.pipeline.shard.limits import limiter_for
from batchinfer.pipeline.shard.parts import render
from batchinfer.pipeline.shard.progress import ENDINGS, Ending
from batchinfer.pipeline.shard.requests import Outcome, Request
from batchinfer.pipeline.shard.retry import MAX_OVERLOADED_ATTEMPTS
from batchinfer.pipeline.shard.window import Window, WindowRun, run_requests
from batchinfer.wire.status import BatchStatus

CHAT = endpoint_for("/v1/chat/completions")


class ScriptedBackend:
    """A backend whose answers a test scripts: the worker's contract is the protocol, not a model."""

    def __init__(self, failures: dict[str, list[BackendError]] | None = None, delay: float = 0.0) -> None:
        self.failures = failures or {}
        self.calls: list[str] = []
        self.in_flight = self.peak = 0
        self.delay = delay

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["messages"][0]["content"]
        self.calls.append(prompt)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.failures.get(prompt):
                raise self.failures[prompt].pop(0)
            return {
                "id": f"chatcmpl-{prompt}",
                "object": "chat.completion",
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        finally:
            self.in_flight -= 1


def _requests(n: int) -> list[Request]:
    return [Request(i + 1, f"c{i}", {"messages": [{"role": "user", "content": f"p{i}"}]}) for i in range(n)]


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_BASE_S", 0.0)
    monkeypatch.setattr(retry, "OVERLOADED_BACKOFF_BASE_S", 0.0)


def test_concurrency_is_bounded_and_order_kept() -> None:
    backend = ScriptedBackend(delay=0.01)
    outcomes = asyncio.run(
        run_requests(
            backend,
            _requests(20),
            "batch_x",
            endpoint=CHAT,
            concurrency=4,
            time_left_ms=lambda: 10**9,
            reserve_ms=0,
        )
    )
    assert backend.peak == 4
    assert [o.request.custom_id for o in outcomes] == [f"c{i}" for i in range(20)]
    assert all(o.status_code == 200 for o in outcomes)


def test_stops_launching_near_the_time_limit() -> None:
    # Given a clock that runs short once 3 requests were sent
    backend = ScriptedBackend(delay=0.001)

    def time_left_ms() -> int:
        return 10_000 if len(backend.calls) < 3 else 100

    # When 10 requests run, with started ones waiting for a permit while others are in flight
    outcomes = asyncio.run(
        run_requests(
            backend,
            _requests(10),
            "batch_x",
            endpoint=CHAT,
            concurrency=1,
            time_left_ms=time_left_ms,
            reserve_ms=1_000,
        )
    )

    # Then the 3 sent ones are the outcomes, and nothing else reached the backend
    assert [o.request.custom_id for o in outcomes] == ["c0", "c1", "c2"]
    assert backend.calls == ["p0", "p1", "p2"]
    assert limiter_for(backend, 1).in_flight == 0


def test_retryable_errors_are_retried_then_recorded() -> None:
    backend = ScriptedBackend(
        failures={
            "p0": [BackendError(503, "busy", retryable=True)],
            "p1": [BackendError(429, "slow down", retryable=True, retry_after=0.0)] * MAX_OVERLOADED_ATTEMPTS,
            "p2": [BackendError(400, "bad", code="context_length_exceeded")],
        }
    )
    outcomes = asyncio.run(
        run_requests(
            backend,
            _requests(3),
            "batch_x",
            endpoint=CHAT,
            concurrency=1,
            time_left_ms=lambda: 10**9,
            reserve_ms=0,
        )
    )
    assert [o.status_code for o in outcomes] == [200, 429, 400]
    assert backend.calls.count("p0") == 2
    assert backend.calls.count("p1") == MAX_OVERLOADED_ATTEMPTS  # overload: more, shorter waits
    assert backend.calls.count("p2") == 1  # a 4xx is the request's fault: never retried
    assert outcomes[2].body == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }


def test_lone_surrogate_is_a_per_line_400_and_never_reaches_the_backend() -> None:
    backend = ScriptedBackend()
    bad = Request(2, "e-2", {"messages": [{"role": "user", "content": "broken \ud800 here"}]})
    outcomes = asyncio.run(
        run_requests(
            backend,
            [bad, *_requests(1)],
            "batch_x",
            endpoint=CHAT,
            concurrency=2,
            time_left_ms=lambda: 10**9,
            reserve_ms=0,
        )
    )
    assert [o.status_code for o in outcomes] == [400, 200]
    assert outcomes[0].body["error"] == {
        "message": "Invalid value at 'messages[0].content': the string contains a lone UTF-16 surrogate "
        "and is not valid Unicode text.",
        "type": "invalid_request_error",
        "param": "messages[0].content",
        "code": "invalid_encoding",
    }
    assert backend.calls == ["p0"]
    assert limiter_for(backend, 2).in_flight == 0  # the refused line's permit was given back


class CapacityBackend(ScriptedBackend):
    """A backend that answers 429 beyond `capacity` requests in flight, like TGI's max_concurrent_requests."""

    def __init__(self, capacity: int, delay: float) -> None:
        super().__init__(delay=delay)
        self.capacity, self.refused = capacity, 0

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.in_flight >= self.capacity:
            self.refused += 1
            raise BackendError(429, "overloaded", retryable=True)
        return await super().chat_completion(body)


def test_concurrency_adapts_to_the_backends_capacity() -> None:
    # Given a backend that takes 5 at a time, and a worker allowed 20
    backend = CapacityBackend(capacity=5, delay=0.01)

    # When 100 requests run
    outcomes = asyncio.run(
        run_requests(
            backend,
            _requests(100),
            "batch_x",
            endpoint=CHAT,
            concurrency=20,
            time_left_ms=lambda: 10**9,
            reserve_ms=0,
        )
    )

    # Then every request succeeded, never more than 5 at once, and the limiter settled near 5
    assert [o.status_code for o in outcomes] == [200] * 100
    assert backend.peak == 5
    assert backend.refused > 0
    assert 4 <= limiter_for(backend, 20).limit <= 6


def test_an_overloaded_backend_is_not_retried_once_time_runs_short() -> None:
    # Given a backend that refuses, and a clock that runs out during the first call
    clock = {"left_ms": 10**9}

    class Refusing(ScriptedBackend):
        async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
            self.calls.append(body["messages"][0]["content"])
            clock["left_ms"] = 500
            raise BackendError(429, "overloaded", retryable=True)

    backend = Refusing()

    # When one request runs with a 1 s reserve
    outcomes = asyncio.run(
        run_requests(
            backend,
            _requests(1),
            "batch_x",
            endpoint=CHAT,
            concurrency=4,
            time_left_ms=lambda: clock["left_ms"],
            reserve_ms=1_000,
        )
    )

    # Then it was tried once and recorded as refused
    assert backend.calls == ["p0"]
    assert [o.status_code for o in outcomes] == [429]


def test_a_request_refused_at_a_checkpoint_is_retried_not_failed() -> None:
    # Given a backend that refuses the first two tries (a backlog at the model), and a window whose
    # time (to its checkpoint) is up once the first answer came, with the invocation's deadline far
    clock = {"window_left_ms": 10**9}

    class Backlogged(ScriptedBackend):
        async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
            clock["window_left_ms"] = 0
            return await super().chat_completion(body)

    backend = Backlogged(failures={"p0": [BackendError(429, "overloaded", retryable=True)] * 2})

    # When one request runs
    window = asyncio.run(
        WindowRun(
            backend,
            _requests(1),
            "batch_x",
            endpoint=CHAT,
            concurrency=4,
            time_left_ms=lambda: clock["window_left_ms"],
            reserve_ms=1_000,
            deadline_ms=lambda: 10**9,
        ).run()
    )
    outcomes = window.prefix()

    # Then it was tried until the model answered: a refusal at a checkpoint is waiting, not a failure
    assert backend.calls == ["p0", "p0", "p0"]
    assert [o.status_code for o in outcomes] == [200]


def test_a_window_whose_checkpoint_passed_before_its_first_launch_still_runs_its_first_request() -> None:
    # Given a window whose time to its checkpoint was up before any request was launched (a short
    # checkpoint on a loaded machine), with the invocation's deadline far
    backend = ScriptedBackend()

    # When it runs three requests
    window = asyncio.run(
        WindowRun(
            backend,
            _requests(3),
            "batch_x",
            endpoint=CHAT,
            concurrency=1,
            time_left_ms=lambda: 0,
            reserve_ms=1_000,
            deadline_ms=lambda: 10**9,
        ).run()
    )

    # Then the first one ran (a window always makes progress) and the rest wait for the next window
    assert backend.calls == ["p0"]
    assert [o.request.custom_id for o in window.prefix()] == ["c0"]


def test_objects_alive_before_the_window_are_not_rescanned_while_requests_are_in_flight() -> None:
    import gc

    frozen_during: list[int] = []

    class Watching(ScriptedBackend):
        async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
            frozen_during.append(gc.get_freeze_count())
            return await super().chat_completion(body)

    asyncio.run(
        run_requests(
            Watching(),
            _requests(2),
            "batch_x",
            endpoint=CHAT,
            concurrency=2,
            time_left_ms=lambda: 10**9,
            reserve_ms=0,
        )
    )

    assert len(frozen_during) == 2 and min(frozen_during) > 0  # frozen while in flight
    assert gc.get_freeze_count() == 0  # and handed back to the collector afterwards


def test_a_retry_after_is_the_limiters_wait_for_every_request() -> None:
    # Given a rate-limited backend: the first request is refused with Retry-After 0.2 s
    backend = ScriptedBackend(
        failures={"p0": [BackendError(429, "rate limit", retryable=True, retry_after=0.2)]}, delay=0.05
    )
    sent: list[tuple[str, float]] = []
    original = backend.chat_completion

    async def timed(body: dict[str, Any]) -> dict[str, Any]:
        sent.append((body["messages"][0]["content"], asyncio.get_running_loop().time()))
        return await original(body)

    backend.chat_completion = timed  # type: ignore[method-assign]

    # When 6 requests run with 2 in flight at most
    outcomes = asyncio.run(
        run_requests(
            backend,
            _requests(6),
            "batch_x",
            endpoint=CHAT,
            concurrency=2,
            time_left_ms=lambda: 10**9,
            reserve_ms=0,
        )
    )

    # Then all succeed; the limiter's gate held the retry and the requests not yet sent until the
    # Retry-After had passed (no request slept it on its own), and it paces from then on
    assert [o.status_code for o in outcomes] == [200] * 6
    limiter = limiter_for(backend, 2)
    assert (limiter.control.rate_limits, limiter.control.refusals) == (1, 0)
    refused_at = sent[0][1] + 0.05
    after = [name for name, at in sent[2:]]
    assert after[0] == "p0"  # the retry first in line
    assert all(at >= refused_at + 0.2 - 0.01 for _, at in sent[2:])
    assert sorted(after) == ["p0", "p2", "p3", "p4", "p5"]


# ---- the batch's end while a window runs ---------------------------------------------------------


class EndingLink:
    """A `ProgressLink` stand-in: records what is published; the batch ends at the `end_at`-th publish."""

    def __init__(self, end_at: int, status: BatchStatus = BatchStatus.CANCELLED) -> None:
        self.end_at, self.published = end_at, []
        self.ending = ENDINGS[status]
        self.windows: list[int | None] = []  # no other worker

    def publish(self, counts: dict[str, int], window: int | None = None) -> Ending | None:
        self.published.append(dict(counts))
        return self.ending if len(self.published) >= self.end_at else None


class QueuedBackend(ScriptedBackend):
    """A model with one slot and a queue in front of it (as the embedded model's thread): requests
    beyond the slot wait in `queued` until the model is free or they are withdrawn."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay=delay)
        self.slot = asyncio.Lock()
        self.withdrawn = 0
        self.waiting: set[asyncio.Future[None]] = set()

    async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        turn = asyncio.get_running_loop().create_future()
        self.waiting.add(turn)
        acquire = asyncio.ensure_future(self.slot.acquire())
        acquire.add_done_callback(lambda _: turn.done() or turn.set_result(None))
        try:
            await turn
        except asyncio.CancelledError:
            acquire.cancel()
            raise RequestNotStarted from None
        finally:
            self.waiting.discard(turn)
        try:
            return await super().chat_completion(body)
        finally:
            self.slot.release()

    def withdraw_waiting(self) -> int:
        pending = [turn for turn in self.waiting if not turn.done()]
        for turn in pending:
            turn.cancel()
        self.withdrawn += len(pending)
        return len(pending)


def window(backend: Any, n: int, link: Any, *, grace: float, concurrency: int = 8) -> Window:
    return asyncio.run(
        WindowRun(
            backend,
            _requests(n),
            "batch_x",
            endpoint=CHAT,
            concurrency=concurrency,
            time_left_ms=lambda: 10**9,
            reserve_ms=0,
            link=link,
            progress_seconds=0.05,
            grace_seconds=grace,
        ).run()
    )


def test_a_cancel_stops_launching_and_lets_the_requests_at_the_model_finish() -> None:
    # Given 8 requests in flight of 20 at 0.3 s each, and a cancel seen at the 2nd publish (0.1 s)
    backend, link = ScriptedBackend(delay=0.3), EndingLink(end_at=2)

    # When the window runs with a grace longer than the requests
    result = window(backend, 20, link, grace=5.0)

    # Then the 8 in flight finished and are kept, the 12 others never reached the backend
    assert result.ending is link.ending
    assert [o is not None and o.ok for o in result.outcomes] == [True] * 8 + [False] * 12
    assert len(backend.calls) == 8
    assert (
        link.published
        == [dict.fromkeys(("completed", "failed", "input_tokens", "output_tokens", "cached_tokens"), 0)] * 2
    )
    lines = result.ended()
    assert len(lines) == 8


def test_requests_queued_for_the_model_are_withdrawn_and_the_gaps_never_ran() -> None:
    # Given a one-slot model with 7 more requests queued for it, and a cancel at the 3rd publish
    backend, link = QueuedBackend(delay=0.12), EndingLink(end_at=3)

    # When the window runs
    result = window(backend, 10, link, grace=5.0)

    # Then the answered ones are kept, the queued ones were withdrawn and are batch_cancelled lines
    answered = [i for i, o in enumerate(result.outcomes) if o is not None]
    assert answered == [0, 1]  # 0.12 s each: two finished by the cancel at 0.15 s, the 2nd was at the model
    assert backend.withdrawn == 7
    assert len(backend.calls) == 2
    assert [o.error["code"] if o.error else o.status_code for o in result.ended()] == [200, 200]


def test_a_request_still_at_the_model_after_the_grace_is_cut_with_its_own_code() -> None:
    # Given requests of 2 s, a cancel at the first publish and a grace of 0.2 s
    backend, link = ScriptedBackend(delay=2.0), EndingLink(end_at=1)

    # When the window runs
    result = window(backend, 3, link, grace=0.2, concurrency=2)

    # Then the two at the model are cut (their own code), the third never ran
    assert [o.error["code"] if o else None for o in result.outcomes] == [
        "batch_cancelled_in_flight",
        "batch_cancelled_in_flight",
        None,
    ]
    assert [o.error["code"] for o in result.ended()] == ["batch_cancelled_in_flight"] * 2


def test_ended_fills_a_gap_before_a_later_answer_with_never_ran() -> None:
    requests = _requests(3)
    answer = Outcome(requests[2], 200, {"id": "x", "usage": {}}, "x")
    ended = Window(requests, [None, None, answer], ENDINGS[BatchStatus.EXPIRED]).ended()
    assert [(o.request.custom_id, o.error["code"] if o.error else o.status_code) for o in ended] == [
        ("c0", "batch_expired"),
        ("c1", "batch_expired"),
        ("c2", 200),
    ]
    data, output_bytes, counts = render("batch_x", ended, CHAT)
    assert counts == {"completed": 1, "failed": 2, "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
    assert [json.loads(line)["error"] for line in data[output_bytes:].splitlines()] == [
        {"code": "batch_expired", "message": "The batch expired before this request ran."}
    ] * 2


# ---- the per-request deadline (commit before the function is killed) --------------------------------


def test_requests_waiting_for_the_model_do_not_outlive_the_reserve() -> None:
    # Given a one-slot model (0.2 s a request) with all 10 requests handed to it at once, and 0.8 s
    # left before the time reserve
    backend = QueuedBackend(delay=0.2)
    loop_time: list[float] = []

    async def scenario() -> list[Outcome]:
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + 1.3

        def time_left_ms() -> int:
            return int((ends_at - loop.time()) * 1000)

        outcomes = await run_requests(
            backend,
            _requests(10),
            "batch_x",
            endpoint=CHAT,
            concurrency=10,
            time_left_ms=time_left_ms,
            reserve_ms=500,
        )
        loop_time.append(1.3 - (ends_at - loop.time()))
        return outcomes

    # When the window runs
    outcomes = asyncio.run(scenario())

    # Then it returns by the reserve (all ten would take 2 s): what could not finish went back unstarted
    assert loop_time[0] < 1.0, loop_time
    assert 2 <= len(outcomes) <= 4 and all(o.ok for o in outcomes)
    assert backend.withdrawn >= 5
    assert len(backend.calls) <= len(outcomes) + 1  # at most the one at the model when time ran out
