"""The input-token counters of a dry run (backends/token_count.py): the byte estimate, and which
counter a model gets."""

from __future__ import annotations

import pytest

from batchinfer.backends.config import BedrockConfig, OpenAICompatConfig
from batchinfer.backends.token_count import Estimate, counter_for


def test_the_estimate_is_a_token_per_four_bytes_of_the_input_fields() -> None:
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "héllo"}]}
    # {"messages":[{"role":"user","content":"héllo"}]} is 49 bytes (é is two)
    assert Estimate().count("/v1/chat/completions", body) == 13
    assert Estimate().count("/v1/completions", {"model": "m", "prompt": "abcd"}) == 5  # {"prompt":"abcd"}: 17


@pytest.mark.parametrize(
    "config",
    [
        OpenAICompatConfig(backend="openai", base_url="http://upstream:8000/v1", model="x"),
        BedrockConfig(backend="bedrock", model_id="amazon.nova-micro-v1:0"),
    ],
)
def test_remote_models_are_estimated(config: object) -> None:
    assert counter_for(config).method == "estimate"
