"""The AIMD limiter: exact limits after each answer, once-per-window cuts, FIFO waiters, cancellation."""

import asyncio

import pytest

from batchinfer.concurrency import AIMDLimiter, Permit


def test_starts_at_the_maximum_unless_told() -> None:
    assert AIMDLimiter(8).limit == 8
    assert AIMDLimiter(8, initial=3).limit == 3
    assert AIMDLimiter(8, initial=50).limit == 8
    assert AIMDLimiter(8, minimum=2, initial=0).limit == 2


@pytest.mark.parametrize("kwargs", [{"minimum": 0}, {"minimum": 9}, {"decrease": 1.0}, {"decrease": 0.0},
                                    {"increase": 0.0}])
def test_rejects_impossible_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        AIMDLimiter(8, **kwargs)


async def _acquire_all(limiter: AIMDLimiter, n: int) -> list[Permit]:
    return [await limiter.acquire() for _ in range(n)]


def test_success_in_a_full_window_grows_the_limit_by_one_per_window() -> None:
    async def scenario() -> list[float]:
        limiter = AIMDLimiter(10, initial=4)
        windows = []
        for _ in range(2):
            for permit in await _acquire_all(limiter, limiter.limit):
                limiter.release(permit)
                windows.append(limiter.window)
        return windows

    # 4 + 1/4 = 4.25, + 1/4.25 = 4.485..., ...: the permit that filled the window is the 4th one only
    windows = asyncio.run(scenario())
    assert windows[:4] == [4.0, 4.0, 4.0, 4.25]
    assert windows[4:] == [4.25, 4.25, 4.25, 4.25 + 1 / 4.25]


def test_success_below_a_full_window_does_not_grow_it() -> None:
    async def scenario() -> AIMDLimiter:
        limiter = AIMDLimiter(10, initial=4)
        for _ in range(10):
            limiter.release(await limiter.acquire())  # one at a time: the window is never full
        return limiter

    assert asyncio.run(scenario()).window == 4.0


def test_growth_stops_at_the_maximum() -> None:
    async def scenario() -> AIMDLimiter:
        limiter = AIMDLimiter(3, initial=2)
        for _ in range(20):
            for permit in await _acquire_all(limiter, limiter.limit):
                limiter.release(permit)
        return limiter

    limiter = asyncio.run(scenario())
    assert (limiter.window, limiter.limit) == (3.0, 3)


def test_overload_cuts_once_per_window() -> None:
    async def scenario() -> list[float]:
        limiter = AIMDLimiter(10)
        first = await _acquire_all(limiter, 10)
        seen = []
        for permit in first[:3]:  # three refusals of the same window: one cut
            limiter.release(permit, overloaded=True)
            seen.append(limiter.window)
        later = await limiter.acquire()  # sent after the cut: its refusal cuts again
        limiter.release(later, overloaded=True)
        seen.append(limiter.window)
        return seen

    assert asyncio.run(scenario()) == [9.0, 9.0, 9.0, 8.1]


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
        limiter = AIMDLimiter(4, decrease=0.5)
        held = await _acquire_all(limiter, 4)
        waiting = asyncio.create_task(limiter.acquire())
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
