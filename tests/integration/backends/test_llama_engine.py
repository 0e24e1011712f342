"""Continuous batching of the embedded model (`batchinfer.backends.llama_engine`) against the real
SmolLM2-135M-Instruct GGUF: what a request generates does not depend on what else is generating.

The default registry's model: 16 sequences in one llama.cpp context, 512 tokens a decode call.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from batchinfer.backends import load_registry
from batchinfer.backends.llama_cpp import LlamaCppBackend
from batchinfer.wire.kserve import SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

SMOLLM2 = "smollm2-135m-instruct"
FABLE = (
    "The fox and the crow: a crow sat in a tree with a piece of cheese, and a fox below praised her "
    "voice until she sang and dropped it. "
)


@pytest.fixture(scope="module")
def smollm2() -> LlamaCppBackend:
    backend = load_registry().backend(SMOLLM2)
    assert isinstance(backend, LlamaCppBackend)
    asyncio.run(backend.engine())  # loaded once, outside the tests' own timing
    return backend


def chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": SMOLLM2, "messages": [{"role": "user", "content": text}], "temperature": 0, **fields}


def answer(out: dict[str, Any]) -> tuple[str, str, dict[str, int]]:
    choice = out["choices"][0]
    # What the prefix cache saved depends on what ran before (tests/integration/backends/test_llama_prefix.py)
    usage = {k: v for k, v in out["usage"].items() if k != "prompt_tokens_details"}
    return choice["message"]["content"], choice["finish_reason"], usage


# Mixed greedy requests: prompt lengths from 20 to 836 tokens (the longest is prefilled in two calls
# of at most 512 tokens), a stop string, JSON mode, penalties, a system message, different caps.
MIXED = [
    chat("What is 2+2?", max_tokens=24),
    chat("Name three colors.", max_tokens=40, stop=["3."]),
    chat(
        "Give me a JSON object with a name and an age.",
        max_tokens=60,
        response_format={"type": "json_object"},
    ),
    chat("Write a long story about a brave knight and a dragon.", max_tokens=64, presence_penalty=1.5),
    chat("List ten animals.", max_tokens=48, frequency_penalty=1.0),
    chat(f"{FABLE * 25}What did the fox want?", max_tokens=32),
    {
        "model": SMOLLM2,
        "messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi!"}],
        "temperature": 0,
        "max_tokens": 16,
    },
    chat("hi", max_tokens=3),
]


def test_batched_greedy_output_equals_solo_output_for_8_mixed_prompts(smollm2: LlamaCppBackend) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
        engine = await smollm2.engine()
        before = engine.state().steps
        solo = [await smollm2.chat_completion(body) for body in MIXED]
        middle = engine.state().steps
        together = await asyncio.gather(*(smollm2.chat_completion(body) for body in MIXED))
        return solo, list(together), middle - before, engine.state().steps - middle

    solo, together, solo_steps, together_steps = asyncio.run(scenario())

    assert [answer(out) for out in together] == [answer(out) for out in solo]
    assert [out["usage"]["prompt_tokens"] for out in solo] == [37, 34, 42, 42, 34, 836, 20, 31]
    assert together_steps < solo_steps  # they did share decode calls
    assert [answer(out)[1] for out in solo] == [
        "stop",
        "stop",
        "stop",
        "length",
        "stop",
        "stop",
        "length",
        "length",
    ]


def test_a_seeded_request_gives_the_same_output_in_any_batch_mix(smollm2: LlamaCppBackend) -> None:
    seeded = chat("Tell me about the sea.", temperature=0.8, top_p=0.9, seed=4242, max_tokens=40)
    tokens = SamplingParams(
        do_sample=True, temperature=0.9, top_k=50, seed=99, repetition_penalty=1.1, max_new_tokens=30
    )
    ids = [1, 9690, 198, 2683, 314]
    others_a = [chat(f"Count to {n}.", max_tokens=20 + n) for n in range(5)]
    others_b = [chat("Name a fruit.", temperature=1.0, seed=s, max_tokens=30) for s in range(3)] + [
        chat(f"{FABLE * 12}Who sang?", max_tokens=10)
    ]

    async def scenario() -> list[tuple[str, list[int]]]:
        runs = []
        alone = await smollm2.chat_completion(seeded), await smollm2.generate_tokens(ids, tokens)
        runs.append(alone)
        for others in (others_a, others_b):
            results = await asyncio.gather(
                *(smollm2.chat_completion(body) for body in others[:2]),
                smollm2.chat_completion(seeded),
                smollm2.generate_tokens(ids, tokens),
                *(smollm2.chat_completion(body) for body in others[2:]),
            )
            runs.append((results[2], results[3]))
        return [(answer(chat_out)[0], token_out.ids) for chat_out, token_out in runs]

    runs = asyncio.run(scenario())

    assert runs[1] == runs[0]
    assert runs[2] == runs[0]
    assert len(runs[0][1]) == 30


def test_a_long_prompt_does_not_stall_short_ones(smollm2: LlamaCppBackend) -> None:
    long = chat(f"{FABLE * 50}What did the crow drop?", max_tokens=8)  # 1636 tokens: 4 calls of <= 512
    shorts = [chat(f"Say the word {word}.", max_tokens=4) for word in ("red", "blue", "green")]

    async def scenario() -> tuple[list[str], dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        engine = await smollm2.engine()
        engine.prefix_reuse = False  # else the long prompt stays cached and is not prefilled again
        try:
            solo_long = await smollm2.chat_completion(long)
            solo_shorts = [await smollm2.chat_completion(body) for body in shorts]
        finally:
            engine.prefix_reuse = True
        order: list[str] = []

        async def run(label: str, body: dict[str, Any]) -> dict[str, Any]:
            out = await smollm2.chat_completion(body)
            order.append(label)
            return out

        steps = engine.state().steps
        long_task = asyncio.create_task(run("long", long))
        while engine.state().steps < steps + 1:  # its first chunk is in the KV cache
            await asyncio.sleep(0.005)
        short_outs = await asyncio.gather(*(run(f"short{i}", body) for i, body in enumerate(shorts)))
        long_out = await long_task
        return order, solo_long, solo_shorts, {"long": long_out, "shorts": list(short_outs)}

    order, solo_long, solo_shorts, mixed = asyncio.run(scenario())

    # The short prompts were prefilled between the long one's chunks and generated beside them.
    assert order == ["short0", "short1", "short2", "long"]
    assert solo_long["usage"]["prompt_tokens"] == 1636
    assert answer(mixed["long"]) == answer(solo_long)
    assert [answer(out) for out in mixed["shorts"]] == [answer(out) for out in solo_shorts]


def test_cancelling_a_request_frees_its_sequence(smollm2: LlamaCppBackend) -> None:
    endless = SamplingParams(do_sample=True, temperature=5.0, top_k=49152, seed=4, max_new_tokens=400)

    async def scenario() -> tuple[int, int, int]:
        engine = await smollm2.engine()
        task = asyncio.create_task(smollm2.generate_tokens([5, 6, 7], endless))
        while engine.state().running == 0:
            await asyncio.sleep(0.005)
        running = engine.state().running
        task.cancel()
        deadline = time.monotonic() + 10
        while engine.state().running and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        state = engine.state()
        return running, state.running, state.free

    running, after, free = asyncio.run(scenario())

    assert (running, after, free) == (1, 0, smollm2.config.n_seq_max)  # every sequence free again
