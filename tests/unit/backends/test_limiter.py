"""The AIMD limiter: exact limits after each answer (slow start, additive increase, cuts), FIFO
waiters, cancellation."""

import asyncio

import pytest

from batchinfer.backends.limiter import AIMDLimiter, Permit


def test_starts_at_initial_clamped_to_the_bounds() -> None:
    assert AIMDLimiter(64).limit == 16
    assert AIMDLimiter(8).limit == 8
    assert AIMDLimiter(8, initial=3).limit == 3
    assert AIMDLimiter(8, minimum=2, initial=0).limit == 2


@pytest.mark.parametrize(
    "kwargs", [{"minimum": 0}, {"minimum": 9}, {"decrease": 1.0}, {"decrease": 0.0}, {"increase": 0.0}]
)
def test_rejects_impossible_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        AIMDLimiter(8, **kwargs)


async def _acquire_all(limiter: AIMDLimiter, n: int) -> list[Permit]:
    return [await limiter.acquire() for _ in range(n)]


async def _past_the_probe(limiter: AIMDLimiter, holds: int) -> None:
    """A first refusal with `holds` requests still out (the limit becomes `holds`), then nothing in flight."""
    permits = await _acquire_all(limiter, holds + 1)
    limiter.release(permits[0], overloaded=True)
    for permit in permits[1:]:
        limiter.give_back(permit)


def test_slow_start_adds_one_per_success_while_requests_wait() -> None:
    async def scenario() -> tuple[float, int, int]:
        limiter = AIMDLimiter(100, initial=4)
        held = await _acquire_all(limiter, 4)
        waiting = [asyncio.create_task(limiter.acquire()) for _ in range(10)]
        await asyncio.sleep(0)
        for permit in held:  # each success frees one place and adds one: two waiters go each time
            limiter.release(permit)
        await asyncio.sleep(0)
        admitted = sum(task.done() for task in waiting)
        for task in waiting:
            task.cancel()
        return limiter.window, admitted, limiter.in_flight

    assert asyncio.run(scenario()) == (8.0, 8, 8)


def test_a_success_that_no_request_waited_for_does_not_grow_the_limit() -> None:
    async def scenario() -> float:
        limiter = AIMDLimiter(10, initial=4)
        for _ in range(10):
            limiter.release(await limiter.acquire())  # one at a time: the limit holds nothing back
        return limiter.window

    assert asyncio.run(scenario()) == 4.0


def test_after_a_cut_a_full_window_grows_by_one_over_the_limit_per_success() -> None:
    async def scenario() -> list[float]:
        limiter = AIMDLimiter(100, initial=11, decrease=0.5)
        await _past_the_probe(limiter, 10)
        held = await _acquire_all(limiter, 10)
        limiter.release(held[0], overloaded=True)  # 10 -> 5
        seen = [limiter.window]
        for permit in held[1:]:  # 9, 8, 7, 6, 5 in flight: at or above the limit of 5; then below it
            limiter.release(permit)
            seen.append(limiter.window)
        return seen

    w = [5.0]
    for _ in range(5):
        w.append(w[-1] + 1 / w[-1])
    assert asyncio.run(scenario()) == w + [w[-1]] * 4
    assert w[1:3] == [5.2, 5.392307692307693]


def test_growth_stops_at_the_maximum() -> None:
    async def scenario() -> AIMDLimiter:
        limiter = AIMDLimiter(3, initial=1)

        async def one() -> None:
            permit = await limiter.acquire()
            await asyncio.sleep(0)
            limiter.release(permit)

        await asyncio.gather(*(one() for _ in range(50)))
        return limiter

    limiter = asyncio.run(scenario())
    assert (limiter.window, limiter.limit, limiter.in_flight) == (3.0, 3, 0)


def test_refusals_of_the_first_probe_bring_the_limit_to_what_the_backend_holds() -> None:
    async def scenario() -> tuple[int, int]:
        limiter = AIMDLimiter(64, initial=64)
        permits = await _acquire_all(limiter, 64)
        for permit in permits[32:]:  # a backend of capacity 32 refuses the other 32
            limiter.release(permit, overloaded=True)
        return limiter.limit, limiter.epoch

    assert asyncio.run(scenario()) == (32, 1)


def test_an_overload_cuts_once_then_each_refusal_of_that_window_takes_one_off() -> None:
    async def scenario() -> list[float]:
        limiter = AIMDLimiter(20, initial=20)
        await _past_the_probe(limiter, 10)
        seen = [limiter.window]
        first = await _acquire_all(limiter, 6)
        for permit in first[:3]:  # three refusals of one window: a 3% cut, then one off for each other
            limiter.release(permit, overloaded=True)
            seen.append(limiter.window)
        later = await limiter.acquire()  # sent after the cut: its refusal is news, a new 3% cut
        limiter.release(later, overloaded=True)
        seen.append(limiter.window)
        return seen

    assert asyncio.run(scenario()) == pytest.approx([10.0, 9.7, 8.7, 7.7, 7.469])  # 7.7 * 0.97


def test_a_burst_far_above_capacity_comes_down_in_one_window() -> None:
    async def scenario() -> int:
        limiter = AIMDLimiter(64, initial=16)
        permits = await _acquire_all(limiter, 16)
        for permit in permits[5:]:  # a backend of capacity 5 refuses the other 11
            limiter.release(permit, overloaded=True)
        return limiter.limit

    assert asyncio.run(scenario()) == 5  # at most the 5 still out


def test_cuts_stop_at_the_minimum() -> None:
    async def scenario() -> AIMDLimiter:
        limiter = AIMDLimiter(4, minimum=2, decrease=0.5)
        for _ in range(5):
            limiter.release(await limiter.acquire(), overloaded=True)
        return limiter

    limiter = asyncio.run(scenario())
    assert (limiter.window, limiter.limit, limiter.overloads, limiter.epoch) == (2.0, 2, 5, 5)


def test_waiters_are_served_in_order_as_room_frees() -> None:
    async def scenario() -> list[int]:
        limiter = AIMDLimiter(2)
        held = await _acquire_all(limiter, 2)
        order: list[int] = []

        async def waiter(n: int) -> None:
            permit = await limiter.acquire()
            order.append(n)
            limiter.release(permit)

        tasks = [asyncio.create_task(waiter(n)) for n in range(4)]
        await asyncio.sleep(0)
        assert order == [] and limiter.in_flight == 2
        for permit in held:
            limiter.release(permit)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_a_cut_holds_waiters_back_until_in_flight_drops_under_the_new_limit() -> None:
    async def scenario() -> tuple[int, int, int]:
        limiter = AIMDLimiter(5, initial=5, decrease=0.5)
        await _past_the_probe(limiter, 4)
        held = await _acquire_all(limiter, 4)
        waiting = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        limiter.release(held[0], overloaded=True)  # limit 2, 3 still in flight: no room
        await asyncio.sleep(0)
        assert not waiting.done()
        limiter.release(held[1])  # 2 in flight: still none
        await asyncio.sleep(0)
        assert not waiting.done()
        limiter.release(held[2])  # 1 in flight: room for the waiter
        await waiting
        return limiter.limit, limiter.in_flight, len(limiter._waiters)

    assert asyncio.run(scenario()) == (2, 2, 0)


def test_a_cancelled_waiter_takes_no_room() -> None:
    async def scenario() -> tuple[int, int]:
        limiter = AIMDLimiter(1)
        held = await limiter.acquire()
        waiting = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        limiter.release(held)
        return limiter.in_flight, len(limiter._waiters)

    assert asyncio.run(scenario()) == (0, 0)


def test_a_permit_given_back_unused_frees_its_place_and_leaves_the_limit() -> None:
    async def scenario() -> tuple[float, int, bool]:
        limiter = AIMDLimiter(8, initial=2)
        held = await _acquire_all(limiter, 2)
        waiter = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        limiter.give_back(held[0])  # never used: says nothing about the backend
        await asyncio.sleep(0)
        return limiter.window, limiter.in_flight, waiter.done()

    assert asyncio.run(scenario()) == (2.0, 2, True)


def test_a_retry_goes_ahead_of_the_requests_waiting() -> None:
    async def scenario() -> list[str]:
        limiter = AIMDLimiter(1, initial=1)
        held = await limiter.acquire()
        served: list[str] = []

        async def request(name: str, first_in_line: bool) -> None:
            permit = await limiter.acquire(first_in_line=first_in_line)
            served.append(name)
            limiter.give_back(permit)

        waiting = [asyncio.create_task(request("new", False)), asyncio.create_task(request("retry", True))]
        await asyncio.sleep(0)  # both wait, "new" first
        limiter.give_back(held)
        await asyncio.gather(*waiting)
        return served

    assert asyncio.run(scenario()) == ["retry", "new"]


def test_waiters_cancelled_together_with_the_holder_leave_the_count_exact() -> None:
    # Given one permit held by a task and a second task waiting, both cancelled at once (a batch's end)
    async def scenario() -> tuple[int, list[bool]]:
        limiter = AIMDLimiter(1, initial=1)

        async def hold() -> None:
            permit = await limiter.acquire()
            try:
                await asyncio.sleep(10)
            finally:
                limiter.release(permit)

        tasks = [asyncio.ensure_future(hold()) for _ in range(2)]
        await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return limiter.in_flight, [isinstance(r, asyncio.CancelledError) for r in results]

    # Then both end cancelled (no ValueError from a waiter the wake-up had dropped) and nothing is held
    assert asyncio.run(scenario()) == (0, [True, True])
