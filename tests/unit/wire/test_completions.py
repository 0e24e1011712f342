"""The completions wire shapes: how a raw-prompt backend reads a body, and its errors."""

from __future__ import annotations

import pytest

from batchinfer.wire.chat import ChatRequestError
from batchinfer.wire.completions import read_completion_request


def test_a_body_reads_as_its_prompts_and_sampling_fields() -> None:
    request = read_completion_request(
        {
            "model": "m",
            "prompt": ["a", "b"],
            "max_tokens": 3,
            "stop": "\n",
            "presence_penalty": 0.5,
            "user": "u",
        }
    )

    assert (request.prompts(), request.max_tokens, request.stop, request.presence_penalty) == (
        ["a", "b"],
        3,
        "\n",
        0.5,
    )
    assert read_completion_request({"prompt": "x"}).prompts() == ["x"]


@pytest.mark.parametrize(
    ("body", "code", "param", "message"),
    [
        ({}, "missing_required_parameter", "prompt", "Missing required parameter: 'prompt'."),
        (
            {"prompt": "x", "n": 3},
            "unsupported_value",
            "n",
            "'n' must be 1 (one choice per prompt; n > 1 is not supported).",
        ),
        (
            {"prompt": "x", "echo": True},
            "unsupported_value",
            "echo",
            "'echo' must be false (echo is not supported).",
        ),
        (
            {"prompt": "x", "logprobs": 2},
            "unsupported_value",
            "logprobs",
            "'logprobs' must be null (logprobs are not supported).",
        ),
        (
            {"prompt": "x", "stop": ""},
            "invalid_value",
            "stop",
            "Invalid value for 'stop': stop sequences must not be empty.",
        ),
    ],
)
def test_what_a_model_cannot_do_is_a_400_naming_the_field(
    body: dict[str, object], code: str, param: str, message: str
) -> None:
    with pytest.raises(ChatRequestError) as raised:
        read_completion_request(body)

    assert (raised.value.code, raised.value.param, raised.value.message) == (code, param, message)


def test_vllm_s_top_k_extension_is_read_as_on_chat() -> None:
    assert read_completion_request({"prompt": "x", "top_k": 5}).top_k == 5
    assert read_completion_request({"prompt": "x"}).top_k is None
    with pytest.raises(ChatRequestError) as caught:
        read_completion_request({"prompt": "x", "top_k": -2})
    assert (caught.value.code, caught.value.param) == ("invalid_value", "top_k")
