"""The worker's pure parts: shard parsing, bounded concurrency, the time limit, retries, rendering."""

import asyncio
import json
from typing import Any

import pytest

from batchinfer.backends.base import BackendError
from batchinfer.pipeline import worker
from batchinfer.pipeline.worker import Outcome, Request, parse_shard, render, run_requests


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
    monkeypatch.setattr(worker, "BACKOFF_BASE_S", 0.0)
    monkeypatch.setattr(worker, "OVERLOADED_BACKOFF_BASE_S", 0.0)


def test_parse_shard_keeps_line_numbers_and_u2028() -> None:
    data = b'3\t{"custom_id":"a","body":{"x":"one\xe2\x80\xa8two"}}\n7\t{"custom_id":"b","body":{}}\n'
    assert parse_shard(data) == [Request(3, "a", {"x": "one\u2028two"}), Request(7, "b", {})]


def test_concurrency_is_bounded_and_order_kept() -> None:
    backend = ScriptedBackend(delay=0.01)
    outcomes = asyncio.run(
        run_requests(
            backend, _requests(20), "batch_x", concurrency=4, time_left_ms=lambda: 10**9, reserve_ms=0
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
            backend, _requests(10), "batch_x", concurrency=1, time_left_ms=time_left_ms, reserve_ms=1_000
        )
    )

    # Then the 3 sent ones are the outcomes, and nothing else reached the backend
    assert [o.request.custom_id for o in outcomes] == ["c0", "c1", "c2"]
    assert backend.calls == ["p0", "p1", "p2"]
    assert worker.limiter_for(backend, 1).in_flight == 0


def test_retryable_errors_are_retried_then_recorded() -> None:
    backend = ScriptedBackend(
        failures={
            "p0": [BackendError(503, "busy", retryable=True)],
            "p1": [BackendError(429, "slow down", retryable=True, retry_after=0.0)]
            * worker.MAX_OVERLOADED_ATTEMPTS,
            "p2": [BackendError(400, "bad", code="context_length_exceeded")],
        }
    )
    outcomes = asyncio.run(
        run_requests(
            backend, _requests(3), "batch_x", concurrency=1, time_left_ms=lambda: 10**9, reserve_ms=0
        )
    )
    assert [o.status_code for o in outcomes] == [200, 429, 400]
    assert backend.calls.count("p0") == 2
    assert backend.calls.count("p1") == worker.MAX_OVERLOADED_ATTEMPTS  # overload: more, shorter waits
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
            backend, [bad, *_requests(1)], "batch_x", concurrency=2, time_left_ms=lambda: 10**9, reserve_ms=0
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
    assert worker.limiter_for(backend, 2).in_flight == 0  # the refused line's permit was given back


def test_render_puts_successes_first_and_counts_tokens() -> None:
    ok = Outcome(Request(1, "a", {}), 200, {"usage": {"prompt_tokens": 3, "completion_tokens": 2}}, "r1")
    bad = Outcome(Request(2, "b", {}), 400, {"error": {"message": "m"}}, "r2")
    ok2 = Outcome(Request(3, "c", {}), 200, {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}, "r3")
    data, output_bytes, counts = render("batch_x", [ok, bad, ok2])
    lines = [json.loads(line) for line in data.splitlines()]
    assert [line["custom_id"] for line in lines] == ["a", "c", "b"]
    assert data[:output_bytes].count(b"\n") == 2
    assert lines[2]["response"] == {
        "status_code": 400,
        "request_id": "r2",
        "body": {"error": {"message": "m"}},
    }
    assert counts == {"completed": 2, "failed": 1, "input_tokens": 4, "output_tokens": 3}


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
            backend, _requests(100), "batch_x", concurrency=20, time_left_ms=lambda: 10**9, reserve_ms=0
        )
    )

    # Then every request succeeded, never more than 5 at once, and the limiter settled near 5
    assert [o.status_code for o in outcomes] == [200] * 100
    assert backend.peak == 5
    assert backend.refused > 0
    assert 4 <= worker.limiter_for(backend, 20).limit <= 6


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
            concurrency=4,
            time_left_ms=lambda: clock["left_ms"],
            reserve_ms=1_000,
        )
    )

    # Then it was tried once and recorded as refused
    assert backend.calls == ["p0"]
    assert [o.status_code for o in outcomes] == [429]


def test_objects_alive_before_the_window_are_not_rescanned_while_requests_are_in_flight() -> None:
    import gc

    frozen_during: list[int] = []

    class Watching(ScriptedBackend):
        async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
            frozen_during.append(gc.get_freeze_count())
            return await super().chat_completion(body)

    asyncio.run(
        run_requests(
            Watching(), _requests(2), "batch_x", concurrency=2, time_left_ms=lambda: 10**9, reserve_ms=0
        )
    )

    assert len(frozen_during) == 2 and min(frozen_during) > 0  # frozen while in flight
    assert gc.get_freeze_count() == 0  # and handed back to the collector afterwards


def test_an_in_process_engine_gets_its_concurrency_hint_never_above_the_ceiling() -> None:
    from batchinfer.backends.chaos import ChaosBackend
    from batchinfer.infer.service import TokenRequests

    engine = ScriptedBackend()
    engine.concurrency_hint = 20  # type: ignore[attr-defined]

    assert worker.concurrency_for(engine, 64) == 20
    assert worker.concurrency_for(engine, 8) == 8  # WORKER_CONCURRENCY still caps it
    assert worker.concurrency_for(ScriptedBackend(), 64) == 64  # a remote backend: found below 64
    # Token batches and chaos mode wrap the backend; the hint passes through both.
    assert worker.concurrency_for(ChaosBackend(TokenRequests(engine)), 64) == 20
    assert worker.concurrency_for(TokenRequests(ScriptedBackend()), 64) == 64
