"""The embedded model on `/v1/completions` (the raw prompt, no chat template) and `/v1/responses`
(asked as chat), against the real SmolLM2-135M-Instruct GGUF; greedy outputs and token counts are
exact for that file."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchinfer.backends import BackendError, ChatBackend
from batchinfer.endpoints.registry import ENDPOINTS

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

SMOLLM2 = "smollm2-135m-instruct"


def complete(backend: Any, **body: Any) -> dict[str, Any]:
    return asyncio.run(backend.text_completion({"model": SMOLLM2, **body}))


def test_a_raw_prompt_continues_as_is_one_choice_per_prompt(smollm2: ChatBackend) -> None:
    solo = complete(smollm2, prompt="1, 2, 3,", max_tokens=6, temperature=0)
    both = complete(smollm2, prompt=["The capital of France is", "1, 2, 3,"], max_tokens=6, temperature=0)

    assert (solo["object"], solo["model"], solo["id"][:5]) == ("text_completion", SMOLLM2, "cmpl-")
    assert solo["choices"] == [{"text": " 4, 5,", "index": 0, "logprobs": None, "finish_reason": "length"}]
    # 8 tokens: too short to take any from the prefix cache
    assert solo["usage"] == {
        "prompt_tokens": 8,
        "completion_tokens": 6,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # each prompt generates as it would alone, beside the other on the engine
    assert [(c["index"], c["text"]) for c in both["choices"]] == [(0, " Paris.\n\nThe United"), (1, " 4, 5,")]
    assert both["usage"] == {
        "prompt_tokens": 13,
        "completion_tokens": 12,
        "total_tokens": 25,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_stop_and_the_default_of_16_tokens(smollm2: ChatBackend) -> None:
    stopped = complete(smollm2, prompt="1, 2, 3,", stop=" 5", temperature=0)
    default = complete(smollm2, prompt="1, 2, 3,", temperature=0)

    assert stopped["choices"][0]["text"] == " 4,"
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert (default["usage"]["completion_tokens"], default["choices"][0]["finish_reason"]) == (16, "length")


def test_a_prompt_longer_than_the_context_is_a_400(smollm2: ChatBackend) -> None:
    with pytest.raises(BackendError) as raised:
        complete(smollm2, prompt="lorem " * 3000)

    assert (raised.value.status_code, raised.value.code, raised.value.param) == (
        400,
        "context_length_exceeded",
        "prompt",
    )


def test_a_json_schema_response_uses_the_json_grammar(smollm2: ChatBackend) -> None:
    server = ENDPOINTS["/v1/responses"].server(smollm2)
    body = {
        "model": SMOLLM2,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Give a JSON object with key a"}]}
        ],
        "max_output_tokens": 16,
        "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    }

    out = asyncio.run(server.chat_completion(body))

    assert out["output"][0]["content"][0]["text"].startswith("{")
    assert (out["status"], out["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert out["usage"]["input_tokens"] == 37 and out["usage"]["output_tokens"] == 16
