"""The OpenAI-compatible HTTP backend against real servers on loopback: llama-cpp-python's own
OpenAI server running the same GGUF (marked `model`), and a scripted stdlib HTTP server for the
failures (429, 5xx, malformed bodies, slowness) a healthy server will not produce on demand."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from batchinfer.backends import BackendError, ChatBackend, ModelRegistry
from batchinfer.endpoints.messages import MessagesServer

pytestmark = pytest.mark.timeout(300)

NAME = "remote-smollm2"
UPSTREAM = (
    "smollm2-upstream"  # the upstream's model name; the llama_server fixture serves it under this alias
)


def backend(base_url: str, **options: Any) -> ChatBackend:
    config = {"backend": "openai", "base_url": base_url, "model": UPSTREAM, **options}
    return ModelRegistry.from_dict({"models": {NAME: config}}).backend(NAME)


def complete(chat: ChatBackend, **body: Any) -> dict[str, Any]:
    return asyncio.run(chat.chat_completion({"model": NAME, **body}))


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def failure(chat: ChatBackend, **body: Any) -> BackendError:
    with pytest.raises(BackendError) as caught:
        complete(chat, **body)
    return caught.value


# --- llama-cpp-python's OpenAI server -------------------------------------------------------------


@pytest.mark.model
def test_real_server_answers_with_our_model_name(llama_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert llama_server.alias == UPSTREAM
    monkeypatch.setenv("BATCHINFER_TEST_UPSTREAM_KEY", llama_server.api_key)
    chat = backend(llama_server.base_url, api_key_env="BATCHINFER_TEST_UPSTREAM_KEY", timeout=60)

    out = complete(chat, messages=user("What is 2+2?"), max_tokens=12, temperature=0, stream=True)

    assert out["object"] == "chat.completion"
    assert out["model"] == NAME
    assert out["id"].startswith("chatcmpl-")
    [choice] = out["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"]
    assert choice["finish_reason"] in {"stop", "length"}
    # Same GGUF and chat template as the embedded backend: the same 37 prompt tokens.
    assert out["usage"]["prompt_tokens"] == 37
    assert out["usage"]["total_tokens"] == 37 + out["usage"]["completion_tokens"]


@pytest.mark.model
def test_real_server_4xx_is_passed_through_and_not_retryable(llama_server: Any) -> None:
    chat = backend(llama_server.base_url, api_key=llama_server.api_key)

    error = failure(chat, messages=user("lorem " * 4000), max_tokens=16)

    assert (error.status_code, error.code, error.param, error.type, error.retryable) == (
        400,
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
        False,
    )
    assert error.message == (
        "This model's maximum context length is 2048 tokens. However, you requested 8048 tokens "
        "(8032 in the messages, 16 in the completion). "
        "Please reduce the length of the messages or completion."
    )


@pytest.mark.model
def test_real_server_rejects_a_wrong_key(llama_server: Any) -> None:
    error = failure(backend(llama_server.base_url, api_key="sk-wrong"), messages=user("hi"), max_tokens=4)

    assert (error.status_code, error.retryable, error.retry_after) == (401, False, None)
    assert error.message == "Invalid API key"


# --- the scripted server ----------------------------------------------------------------------------


def test_request_sent_upstream(scripted: Any) -> None:
    chat = backend(scripted.base_url("echo"), api_key="sk-abc")
    body = {
        "messages": user("hi"),
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    # Two event loops in a row, as a Lambda running asyncio.run per invocation would.
    first = complete(chat, **body)
    second = complete(chat, **body)

    path, headers, _ = scripted.received[-1]
    assert path == "/echo/v1/chat/completions"
    assert headers["Content-Type"] == "application/json"
    assert second == first
    assert first["model"] == NAME
    assert json.loads(first["choices"][0]["message"]["content"]) == {
        "auth": "Bearer sk-abc",
        "body": {"model": UPSTREAM, "messages": user("hi"), "max_tokens": 3},
    }


def test_no_key_sends_no_authorization(scripted: Any) -> None:
    out = complete(backend(scripted.base_url("echo")), messages=user("hi"))

    assert json.loads(out["choices"][0]["message"]["content"])["auth"] is None


def test_rate_limit_is_retryable_with_retry_after(scripted: Any) -> None:
    error = failure(backend(scripted.base_url("rate-limited")), messages=user("hi"))

    assert (error.status_code, error.retryable, error.retry_after) == (429, True, 7.0)
    assert error.body() == {
        "error": {
            "message": "Rate limit reached for requests",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


def test_503_text_body_is_retryable(scripted: Any) -> None:
    error = failure(backend(scripted.base_url("overloaded")), messages=user("hi"))

    assert (error.status_code, error.retryable, error.retry_after) == (503, True, 120.0)
    assert error.body() == {
        "error": {"message": "upstream overloaded", "type": "server_error", "param": None, "code": None}
    }


def test_500_tgi_style_body_is_retryable(scripted: Any) -> None:
    error = failure(backend(scripted.base_url("crashed")), messages=user("hi"))

    assert (error.status_code, error.retryable, error.retry_after) == (500, True, None)
    assert (error.message, error.code, error.type) == ("CUDA out of memory", "oom", "server_error")


def test_400_fastapi_style_body_is_final(scripted: Any) -> None:
    error = failure(backend(scripted.base_url("rejects")), messages=user("hi"))

    assert (error.status_code, error.retryable, error.message, error.type) == (
        400,
        False,
        "temperature must be positive",
        "invalid_request_error",
    )


@pytest.mark.parametrize(
    ("scenario", "message_start"),
    [
        ("malformed", "The model server sent malformed JSON: "),
        ("not-a-completion", "The model server's answer is not a chat completion (no 'choices' list)."),
    ],
)
def test_bad_2xx_body_is_a_retryable_502(scripted: Any, scenario: str, message_start: str) -> None:
    error = failure(backend(scripted.base_url(scenario)), messages=user("hi"))

    assert (error.status_code, error.code, error.type, error.retryable) == (
        502,
        "bad_response",
        "server_error",
        True,
    )
    assert error.message.startswith(message_start)


def test_slow_server_is_a_retryable_504(scripted: Any) -> None:
    error = failure(backend(scripted.base_url("slow"), timeout=0.5), messages=user("hi"))

    assert (error.status_code, error.code, error.retryable) == (504, "timeout", True)
    assert error.message == "The model server did not answer within 0.5 s."


def test_connection_refused_is_a_retryable_502(refused_url: str) -> None:
    error = failure(backend(refused_url), messages=user("hi"))

    assert (error.status_code, error.code, error.type, error.retryable) == (
        502,
        "upstream_unavailable",
        "server_error",
        True,
    )
    # What failed, not where: the server's host and port stay out of tenants' error lines
    assert error.message == "Cannot reach the model server (ClientConnectorError)."


def test_lone_surrogate_is_rejected_before_sending(scripted: Any) -> None:
    sent = len(scripted.received)

    error = failure(backend(scripted.base_url("echo")), messages=user("broken \ud800 here"))

    assert (error.status_code, error.code, error.param) == (400, "invalid_encoding", "messages[0].content")
    assert len(scripted.received) == sent


def test_embeddings_pass_through_to_the_servers_embeddings(scripted: Any) -> None:
    # Given a body with every embeddings field
    body = {"model": NAME, "input": ["a", "b"], "encoding_format": "base64", "dimensions": 64, "user": "u"}

    # When the server answers with something that is no embeddings list (the echo scenario's chat body)
    with pytest.raises(BackendError) as caught:
        asyncio.run(backend(scripted.base_url("echo"), api_key="sk-abc").embeddings(body))

    # Then the body went to {base_url}/embeddings as it was, with the upstream's model name
    path, _, sent = scripted.received[-1]
    assert path == "/echo/v1/embeddings"
    assert sent == {**body, "model": UPSTREAM}
    assert (caught.value.status_code, caught.value.code, caught.value.message) == (
        502,
        "bad_response",
        "The model server's answer is not an embeddings list (no 'data' list).",
    )


@pytest.mark.parametrize(("extra", "sent"), [({"top_k": 5}, {"top_k": 5}), ({}, {})])
def test_a_message_batch_request_s_top_k_is_sent_only_when_set(
    scripted: Any, extra: dict[str, Any], sent: dict[str, Any]
) -> None:
    # Given a Message Batch request to an OpenAI-compatible server (vLLM and SGLang read `top_k`)
    params = {"model": NAME, "max_tokens": 3, "messages": user("hi"), **extra}

    # When it is answered through the chat endpoint
    message = asyncio.run(
        MessagesServer(backend(scripted.base_url("echo"))).chat_completion({"model": NAME, "params": params})
    )

    # Then the chat body upstream carried top_k as an extra field only when the request set it
    assert json.loads(message["content"][0]["text"])["body"] == {
        "model": UPSTREAM,
        "messages": user("hi"),
        "max_tokens": 3,
        **sent,
    }
