"""The OpenAI-compatible backend's `/completions` and `/responses` pass-through: the scripted server
(what is sent where), and llama-cpp-python's own OpenAI server (marked `model`), which serves
`/completions` and has no `/responses`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from batchinfer.backends import BackendError, ModelRegistry

pytestmark = pytest.mark.timeout(300)

NAME, UPSTREAM = "remote-smollm2", "smollm2-upstream"


def backend(base_url: str, **options: Any) -> Any:
    config = {"backend": "openai", "base_url": base_url, "model": UPSTREAM, **options}
    return ModelRegistry.from_dict({"models": {NAME: config}}).backend(NAME)


def test_a_completions_body_goes_to_the_servers_completions_url(scripted: Any) -> None:
    out = asyncio.run(
        backend(scripted.base_url("echo")).text_completion({"model": NAME, "prompt": "x", "stream": False})
    )

    path, _, body = scripted.received[-1]
    assert (path, body) == ("/echo/v1/completions", {"model": UPSTREAM, "prompt": "x"})
    assert out["model"] == NAME


def test_an_answer_without_output_is_not_a_response(scripted: Any) -> None:
    with pytest.raises(BackendError) as raised:
        asyncio.run(backend(scripted.base_url("echo")).create_response({"model": NAME, "input": "x"}))

    assert scripted.received[-1][0] == "/echo/v1/responses"
    assert (raised.value.status_code, raised.value.code, raised.value.retryable, raised.value.message) == (
        502,
        "bad_response",
        True,
        "The model server's answer is not a Response (no 'output' list).",
    )


@pytest.mark.model
def test_a_real_server_completes_a_raw_prompt_as_the_embedded_model_does(llama_server: Any) -> None:
    remote = backend(llama_server.base_url, api_key=llama_server.api_key, timeout=60)

    out = asyncio.run(
        remote.text_completion({"model": NAME, "prompt": "1, 2, 3,", "max_tokens": 6, "temperature": 0})
    )

    assert (out["object"], out["model"]) == ("text_completion", NAME)
    assert out["choices"][0]["text"] == " 4, 5,"
    assert out["usage"] == {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14}


@pytest.mark.model
def test_a_server_without_responses_answers_each_line_with_its_404(llama_server: Any) -> None:
    remote = backend(llama_server.base_url, api_key=llama_server.api_key, timeout=60)

    with pytest.raises(BackendError) as raised:
        asyncio.run(remote.create_response({"model": NAME, "input": "hi"}))

    assert (raised.value.status_code, raised.value.retryable) == (404, False)
    assert raised.value.body() == {
        "error": {"message": "Not Found", "type": "invalid_request_error", "param": None, "code": None}
    }
