"""Priority and timeout of token requests queued for the one embedded model (real SmolLM2 GGUF).

Requests for a llama.cpp model run one at a time on its thread; waiting ones are taken lowest
`priority` first (FIFO within a priority), and a request past its `timeout` ends with a 504 whether
it was waiting (dropped) or running (stopped before its next token), freeing the model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from batchinfer.backends import BackendError, load_registry
from batchinfer.backends.llama_cpp import LlamaCppBackend
from batchinfer.wire.kserve import SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

PROMPT = [5, 6, 7]
QUICK = SamplingParams(max_new_tokens=1)  # greedy, one token: a few tens of ms
# Sampling over the whole vocabulary at a high temperature: 50-150 ms a token on 2 cores, and an
# end-of-generation token is very unlikely, so 400 tokens would take far longer than its `timeout`:
# it keeps the model busy for exactly that long, then ends with a 504.
SLOW = SamplingParams(do_sample=True, temperature=5.0, top_k=49152, seed=3, max_new_tokens=400, timeout=2)


@pytest.fixture(scope="module")
def smollm2() -> LlamaCppBackend:
    backend = load_registry().backend("smollm2-135m-instruct")
    assert isinstance(backend, LlamaCppBackend)
    asyncio.run(backend.token_limits())  # load the weights once, outside the timed parts
    return backend


async def _timed(
    backend: LlamaCppBackend,
    label: str,
    params: SamplingParams,
    done: list[tuple[str, Any, float]],
    t0: float,
) -> None:
    try:
        result: Any = await backend.generate_tokens(PROMPT, params)
    except BackendError as error:
        result = error
    done.append((label, result, time.monotonic() - t0))


def test_waiting_requests_run_lowest_priority_first_fifo_within_a_priority(smollm2: LlamaCppBackend) -> None:
    async def scenario() -> list[tuple[str, Any, float]]:
        done: list[tuple[str, Any, float]] = []
        t0 = time.monotonic()
        # Given the model busy with a slow request
        tasks = [asyncio.create_task(_timed(smollm2, "busy", SLOW, done, t0))]
        await asyncio.sleep(0.3)
        # When requests of priorities 5, 3, 1, 4, 2, 3 queue behind it
        for label, priority in [
            ("p5", 5),
            ("p3-first", 3),
            ("p1", 1),
            ("p4", 4),
            ("p2", 2),
            ("p3-second", 3),
        ]:
            params = SamplingParams(max_new_tokens=1, priority=priority)
            tasks.append(asyncio.create_task(_timed(smollm2, label, params, done, t0)))
        await asyncio.gather(*tasks)
        return done

    done = asyncio.run(scenario())

    # Then they ran 1 first, 5 last, the two 3s in their arrival order, all after the busy one
    assert [label for label, _, _ in done] == ["busy", "p1", "p2", "p3-first", "p3-second", "p4", "p5"]
    assert [type(result).__name__ for _, result, _ in done] == ["BackendError"] + ["TokenResult"] * 6


def test_timeout_while_waiting_drops_the_request(smollm2: LlamaCppBackend) -> None:
    async def scenario() -> list[tuple[str, Any, float]]:
        done: list[tuple[str, Any, float]] = []
        t0 = time.monotonic()
        busy = dataclasses.replace(SLOW, timeout=3)
        tasks = [asyncio.create_task(_timed(smollm2, "busy", busy, done, t0))]
        await asyncio.sleep(0.3)
        # A 1 s request queued behind the slow one, and a patient one after it
        tasks.append(
            asyncio.create_task(
                _timed(smollm2, "impatient", SamplingParams(max_new_tokens=1, timeout=1), done, t0)
            )
        )
        tasks.append(asyncio.create_task(_timed(smollm2, "patient", QUICK, done, t0)))
        await asyncio.gather(*tasks)
        return done

    done = asyncio.run(scenario())

    labels = [label for label, _, _ in done]
    assert labels == ["impatient", "busy", "patient"]
    _, error, failed_at = done[0]
    assert isinstance(error, BackendError)
    assert (error.status_code, error.code, error.param, error.retryable) == (
        504,
        "timeout",
        "parameters.timeout",
        False,
    )
    assert error.message == (
        "parameters.timeout: the request did not finish within 1 s (it was still waiting for "
        "the model); it was stopped and the model moved on. Allowed timeout: (0, 3600] s."
    )
    assert 1.2 <= failed_at < 2.0  # queued at 0.3 s, 1 s allowed, answered before the busy request ended
    busy_end, patient_end = done[1][2], done[2][2]
    assert patient_end - busy_end < 2.0  # the model went on with the patient one right away


def test_timeout_while_running_stops_generation_and_frees_the_model(smollm2: LlamaCppBackend) -> None:
    endless = SamplingParams(
        do_sample=True, temperature=5.0, top_k=49152, seed=4, max_new_tokens=400, timeout=1
    )

    async def scenario() -> list[tuple[str, Any, float]]:
        done: list[tuple[str, Any, float]] = []
        t0 = time.monotonic()
        await asyncio.gather(
            _timed(smollm2, "endless", endless, done, t0), _timed(smollm2, "next", QUICK, done, t0)
        )
        return done

    done = asyncio.run(scenario())

    assert [label for label, _, _ in done] == ["endless", "next"]
    _, error, stopped_at = done[0]
    assert isinstance(error, BackendError)
    assert error.message == (
        "parameters.timeout: the request did not finish within 1 s (it was still running); "
        "it was stopped and the model moved on. Allowed timeout: (0, 3600] s."
    )
    assert 1.0 <= stopped_at < 3.0  # stopped at its next token; 400 tokens would take 20 s or more
    _, result, next_at = done[1]
    assert result.ids and next_at - stopped_at < 2.0  # the model went on right away
