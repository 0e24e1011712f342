"""Prefix reuse in the embedded engine (`batchinfer.backends.llama_prefix`) against the real
SmolLM2-135M-Instruct GGUF: a prompt that takes its leading tokens from another sequence's KV stream
generates what it generates computed whole.

Each test builds its own small engine (4 or 2 sequences of 1024 cells: about 0.3 s, the GGUF's
weights mapped once) so what its free slots hold does not depend on the tests run before.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest

from batchinfer.backends import load_registry
from batchinfer.backends.llama_cpp import LlamaCppBackend
from batchinfer.backends.llama_engine import Generation, LlamaEngine

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

RULES = "You grade product reviews. Answer with one word: good or bad. " * 8
OTHER = "You translate English into French, word for word, and add nothing else. " * 6


@pytest.fixture
def engine() -> Iterator[LlamaEngine]:
    backend = load_registry().backend("smollm2-135m-instruct")
    assert isinstance(backend, LlamaCppBackend)
    yield LlamaEngine(backend._path, n_ctx=1024, n_seq_max=4, n_threads=2)


def tokens(engine: LlamaEngine, text: str, bos: bool = True) -> list[int]:
    return engine.model.tokenize(text.encode("utf-8"), add_bos=bos, special=True)


def greedy() -> Any:
    from llama_cpp._internals import LlamaSampler

    sampler = LlamaSampler()
    sampler.add_greedy()
    return sampler


def seeded(seed: int) -> Any:
    from llama_cpp._internals import LlamaSampler

    sampler = LlamaSampler()
    sampler.add_top_k(40)
    sampler.add_temp(0.9)
    sampler.add_dist(seed)
    return sampler


async def queued_together(calls: list[Awaitable[Generation]]) -> list[Generation]:
    """Run `calls` with all of them queued before the engine's thread admits any (it waits for the
    GIL meanwhile), so which ones it admits first does not depend on thread timing."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        tasks = [asyncio.ensure_future(call) for call in calls]
        await asyncio.sleep(0)  # each task runs up to its wait for the engine
    finally:
        sys.setswitchinterval(interval)
    return list(await asyncio.gather(*tasks))


def solo(engine: LlamaEngine, prompts: list[list[int]], max_new: int = 8) -> list[Generation]:
    """Each prompt alone, nothing reused (the baseline)."""

    async def run() -> list[Generation]:
        return [await engine.generate(p, greedy(), max_new_tokens=max_new) for p in prompts]

    engine.prefix_reuse = False
    try:
        return asyncio.run(run())
    finally:
        engine.prefix_reuse = True


def test_greedy_output_with_reuse_equals_without_for_8_prompts_sharing_prefixes(engine: LlamaEngine) -> None:
    rules, other = tokens(engine, RULES), tokens(engine, OTHER)
    prompts = [
        rules + tokens(engine, " Review: the battery died in a day. Grade:", bos=False),
        rules + tokens(engine, " Review: great sound, fair price. Grade:", bos=False),
        other + tokens(engine, " Text: the cat sleeps.", bos=False),
        rules[:60] + tokens(engine, " Ignore that. Say hello.", bos=False),  # shares part of the rules
        rules + tokens(engine, " Review: it broke. Grade:", bos=False),
        other + tokens(engine, " Text: good morning.", bos=False),
        tokens(engine, "Hello there, how are you?"),
        rules + tokens(engine, " Review: the battery died in a day. Grade:", bos=False),  # the 1st again
    ]
    expected = solo(engine, prompts)

    async def together() -> list[Generation]:
        return await queued_together([engine.generate(p, greedy(), max_new_tokens=8) for p in prompts])

    reused = asyncio.run(together())

    assert [g.tokens for g in reused] == [g.tokens for g in expected]
    assert [g.text for g in reused] == [g.text for g in expected]
    assert (len(rules), len(other)) == (113, 91)
    # 4 sequences: the shortest prompt first (the partial sharer, from scratch), then the rules and
    # " Review:" are computed once (115 tokens), the translation prompt and " Text:" once (93), the
    # greeting shares nothing.
    assert [g.cached_tokens for g in reused] == [115, 60, 0, 0, 115, 93, 0, 115]


def test_a_prefix_evicted_while_a_sharer_waits_is_recomputed(engine: LlamaEngine) -> None:
    backend = load_registry().backend("smollm2-135m-instruct")
    assert isinstance(backend, LlamaCppBackend)
    small = LlamaEngine(backend._path, n_ctx=1024, n_seq_max=2, n_threads=2)
    first = tokens(small, RULES + " Review: it works. Grade:")
    sharer = tokens(small, RULES + " Review: it is awful. Grade:")
    others = [tokens(small, "Count from one to twenty: one,"), tokens(small, "List the planets: Mercury,")]
    expected = solo(small, [sharer])[0]

    async def scenario() -> tuple[Generation, Generation]:
        kept = await small.generate(first, greedy(), max_new_tokens=4)  # its prompt stays in its slot
        busy = [asyncio.create_task(small.generate(p, greedy(), max_new_tokens=12)) for p in others]
        while small.state().free:  # both slots taken: the kept prompt is evicted
            await asyncio.sleep(0.005)
        waited = await small.generate(sharer, greedy(), max_new_tokens=8)
        await asyncio.gather(*busy)
        return kept, waited

    kept, waited = asyncio.run(scenario())

    assert kept.cached_tokens == 0
    assert waited.cached_tokens == 0  # computed again, not read from the evicted stream
    assert (waited.tokens, waited.text) == (expected.tokens, expected.text)


def test_seeded_sampling_is_reproducible_with_reuse(engine: LlamaEngine) -> None:
    prompt = tokens(engine, RULES + " Review: it came late but works. Grade:")
    sharers = [tokens(engine, RULES + f" Review: number {n}. Grade:") for n in range(3)]

    async def alone() -> Generation:
        return await engine.generate(prompt, seeded(1234), max_new_tokens=16)

    async def shared() -> Generation:
        out = await queued_together(
            [
                *(engine.generate(p, greedy(), max_new_tokens=6) for p in sharers),
                engine.generate(prompt, seeded(1234), max_new_tokens=16),
            ]
        )
        return out[-1]

    engine.prefix_reuse = False
    try:
        expected = asyncio.run(alone())
    finally:
        engine.prefix_reuse = True
    got = asyncio.run(shared())

    assert got.cached_tokens == 115  # the rules and " Review:", computed for a shorter sharer
    assert got.tokens == expected.tokens


def test_a_cancelled_sharer_frees_only_its_own_cells(engine: LlamaEngine) -> None:
    sharers = [tokens(engine, RULES + f" Review: {text}. Grade:") for text in ("fine", "poor", "okay")]
    expected = solo(engine, [sharers[0], sharers[2]], max_new=12)

    async def scenario() -> tuple[list[Generation], int]:
        tasks = [asyncio.create_task(engine.generate(p, greedy(), max_new_tokens=12)) for p in sharers]
        while engine.state().running < 3:
            await asyncio.sleep(0.005)
        tasks[1].cancel()  # a sharer of the others' prefix, maybe their source
        done = [await tasks[0], await tasks[2]]
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        return done, engine.state().free

    done, free = asyncio.run(scenario())

    assert [(g.tokens, g.text) for g in done] == [(g.tokens, g.text) for g in expected]
    assert free == engine.n_seq_max
