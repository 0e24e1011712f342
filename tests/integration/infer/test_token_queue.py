"""Priority and timeout of token requests queued for the embedded model (real SmolLM2 GGUF).

The engine decodes up to `n_seq_max` requests together; while all its sequences are busy, waiting
requests are admitted lowest `priority` first (FIFO within a priority), and a request past its
`timeout` ends with a 504 whether it was waiting (dropped) or running (its sequence freed before the
next step). An engine of 2 sequences here, so that 2 slow requests are "under load".
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from batchinfer.backends import BackendError, ModelRegistry
from batchinfer.backends.llama_cpp import LlamaCppBackend
from batchinfer.wire.kserve import SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

SMOLLM2 = "smollm2-135m-instruct"
PROMPT = [5, 6, 7]
QUICK = SamplingParams(max_new_tokens=1)  # greedy, one token: a few tens of ms
# Sampling over the whole vocabulary at a high temperature: an end-of-generation token is very
# unlikely, so 400 tokens would take far longer than its `timeout`: it holds a sequence for exactly
# that long, then ends with a 504.
SLOW = SamplingParams(do_sample=True, temperature=5.0, top_k=49152, seed=3, max_new_tokens=400, timeout=2)


@pytest.fixture(scope="module")
def smollm2() -> LlamaCppBackend:
    backend = ModelRegistry.from_dict(
        {"models": {SMOLLM2: {"backend": "llama_cpp", "n_seq_max": 2}}}
    ).backend(SMOLLM2)
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


async def _until_running(backend: LlamaCppBackend, running: int) -> None:
    engine = await backend.engine()
    while engine.state().running < running:
        await asyncio.sleep(0.005)


def test_waiting_requests_run_lowest_priority_first_fifo_within_a_priority(smollm2: LlamaCppBackend) -> None:
    async def scenario() -> list[tuple[str, Any, float]]:
        done: list[tuple[str, Any, float]] = []
        t0 = time.monotonic()
        # Given both sequences busy with slow requests
        tasks = [asyncio.create_task(_timed(smollm2, "busy", SLOW, done, t0)) for _ in range(2)]
        await _until_running(smollm2, 2)
        # When requests of priorities 5, 3, 1, 4, 2, 3 queue behind them
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

    # Then they ran 1 first, 5 last, the two 3s in their arrival order, all after the busy ones
    assert [label for label, _, _ in done] == [
        "busy",
        "busy",
        "p1",
        "p2",
        "p3-first",
        "p3-second",
        "p4",
        "p5",
    ]
    assert [type(result).__name__ for _, result, _ in done] == ["BackendError"] * 2 + ["TokenResult"] * 6


def test_timeout_while_waiting_drops_the_request(smollm2: LlamaCppBackend) -> None:
    async def scenario() -> list[tuple[str, Any, float]]:
        done: list[tuple[str, Any, float]] = []
        t0 = time.monotonic()
        busy = dataclasses.replace(SLOW, timeout=3)
        tasks = [asyncio.create_task(_timed(smollm2, "busy", busy, done, t0)) for _ in range(2)]
        await _until_running(smollm2, 2)
        queued_at = time.monotonic() - t0
        # A 1 s request queued behind the slow ones, and a patient one after it
        tasks.append(
            asyncio.create_task(
                _timed(smollm2, "impatient", SamplingParams(max_new_tokens=1, timeout=1), done, t0)
            )
        )
        tasks.append(asyncio.create_task(_timed(smollm2, "patient", QUICK, done, t0)))
        await asyncio.gather(*tasks)
        return [("queued", None, queued_at), *done]

    (_, _, queued_at), *done = asyncio.run(scenario())

    labels = [label for label, _, _ in done]
    assert labels == ["impatient", "busy", "busy", "patient"]
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
    assert 1.0 <= failed_at - queued_at < 2.0  # 1 s allowed, answered before the busy requests ended
    busy_end, patient_end = done[2][2], done[3][2]
    assert patient_end - busy_end < 2.0  # the model went on with the patient one right away


def test_timeout_while_running_stops_generation_and_frees_its_sequence(smollm2: LlamaCppBackend) -> None:
    endless = SamplingParams(
        do_sample=True, temperature=5.0, top_k=49152, seed=4, max_new_tokens=400, timeout=1
    )

    async def scenario() -> tuple[list[tuple[str, Any, float]], int]:
        done: list[tuple[str, Any, float]] = []
        t0 = time.monotonic()
        await asyncio.gather(
            _timed(smollm2, "endless", endless, done, t0),
            _timed(smollm2, "endless", endless, done, t0),
            _timed(smollm2, "next", QUICK, done, t0),
        )
        return done, (await smollm2.engine()).state().free

    done, free = asyncio.run(scenario())

    assert [label for label, _, _ in done] == ["endless", "endless", "next"]
    for _, error, stopped_at in done[:2]:
        assert isinstance(error, BackendError)
        assert error.message == (
            "parameters.timeout: the request did not finish within 1 s (it was still running); "
            "it was stopped and the model moved on. Allowed timeout: (0, 3600] s."
        )
        assert 1.0 <= stopped_at < 3.0  # stopped at its next token; 400 tokens would take 20 s or more
    _, result, next_at = done[2]
    assert result.ids and next_at - done[1][2] < 2.0  # the freed sequence took it right away
    assert free == 2  # both sequences free again
