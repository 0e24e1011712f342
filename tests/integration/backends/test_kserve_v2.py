"""The KServe v2 client against a scripted HTTP server on loopback, for what a healthy token server will
not do on demand: 429/503 (sent once; the shard worker retries), errors, malformed answers, slowness. The
client against a real server (this project's /v2 on the local stack) is in tests/e2e/test_token_infer.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from batchinfer.backends import BackendError, ModelRegistry
from batchinfer.backends.kserve_v2 import KServeV2Backend
from batchinfer.pipeline.shard.retry import call_backend
from batchinfer.pipeline.shard.worker import for_endpoint
from batchinfer.wire.kserve import SamplingParams, TokenResult

pytestmark = pytest.mark.timeout(60)

OK = {"id": "x", "outputs": [{"name": "output0", "shape": [1, 3], "datatype": "UINT32", "data": [9, 8, 7]}]}


@dataclass
class Scripted:
    """`port` of the server; `received[scenario]` the bodies each scenario got, in order."""

    port: int = 0
    received: dict[str, list[Any]] = field(default_factory=dict)


def _answer(scenario: str, attempt: int) -> tuple[int, dict[str, str], bytes]:
    json_type = {"Content-Type": "application/json"}
    if scenario == "flaky":  # busy, then overloaded, then fine
        return [
            (429, {**json_type, "Retry-After": "0"}, b'{"error": "too many requests"}'),
            (503, {**json_type, "Retry-After": "0"}, b'{"error": "overloaded"}'),
            (200, json_type, json.dumps(OK).encode()),
        ][min(attempt, 2)]
    return {
        "ok": (200, json_type, json.dumps(OK).encode()),
        "busy": (429, {**json_type, "Retry-After": "3"}, b'{"error": "too many requests"}'),
        "overloaded": (503, {"Retry-After": "0", "Content-Type": "text/plain"}, b"overloaded\n"),
        "rejects": (
            400,
            json_type,
            b'{"error": "parameters.top_k must be an integer in (0, 2147483647], got 0"}',
        ),
        "crashed": (500, json_type, b'{"error": "device error"}'),
        "malformed": (200, json_type, b'{"outputs": [{"name": "output0", "data": [1, true]}]}'),
        "empty": (200, json_type, b'{"outputs": []}'),
    }[scenario]


@pytest.fixture(scope="module")
def scripted() -> Iterator[Scripted]:
    state = Scripted()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            scenario = self.path.split("/")[3]  # /v2/models/<scenario>/infer
            with lock:
                attempt = len(state.received.setdefault(scenario, []))
                state.received[scenario].append(body)
            if scenario == "slow":
                time.sleep(2)
                status, headers, payload = _answer("ok", 0)
            else:
                status, headers, payload = _answer(scenario, attempt)
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def client(scripted: Scripted, scenario: str, **options: Any) -> KServeV2Backend:
    config = {
        "backend": "kserve_v2",
        "base_url": f"http://127.0.0.1:{scripted.port}",
        "model": scenario,
        **options,
    }
    backend = ModelRegistry.from_dict({"models": {"remote": config}}).backend("remote")
    assert isinstance(backend, KServeV2Backend)
    return backend


def generate(backend: KServeV2Backend, **params: Any) -> TokenResult:
    return asyncio.run(backend.generate_tokens([1, 2, 3], SamplingParams(**params)))


def failure(backend: KServeV2Backend) -> BackendError:
    with pytest.raises(BackendError) as caught:
        generate(backend)
    return caught.value


def test_sends_every_parameter_and_reads_the_generated_ids(scripted: Scripted) -> None:
    result = generate(
        client(scripted, "ok"),
        do_sample=True,
        temperature=0.7,
        top_k=40,
        seed=11,
        max_new_tokens=3,
        priority=2,
        timeout=30,
    )

    assert result == TokenResult([9, 8, 7], "length")  # as many ids as max_new_tokens
    [sent] = scripted.received["ok"]
    assert len(sent.pop("id")) == 32
    assert sent == {
        "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "UINT32", "data": [1, 2, 3]}],
        "outputs": [{"name": "output0"}],
        "parameters": {
            "do_sample": True,
            "temperature": 0.7,
            "top_k": 40,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "max_new_tokens": 3,
            "priority": 2,
            "timeout": 30,
            "seed": 11,
        },
    }


def test_fewer_ids_than_max_new_tokens_means_stop(scripted: Scripted) -> None:
    assert generate(client(scripted, "ok"), max_new_tokens=20) == TokenResult([9, 8, 7], "stop")


def test_a_429_is_sent_once_and_is_a_retryable_error_with_its_retry_after(scripted: Scripted) -> None:
    error = failure(client(scripted, "busy"))

    assert (error.status_code, error.message, error.type, error.code, error.retryable, error.retry_after) == (
        429,
        "too many requests",
        "requests",
        "rate_limit_exceeded",
        True,
        3.0,
    )
    assert len(scripted.received["busy"]) == 1


def test_a_503_is_sent_once_and_is_a_retryable_error(scripted: Scripted) -> None:
    error = failure(client(scripted, "overloaded"))

    assert (error.status_code, error.message, error.retryable, error.retry_after) == (
        503,
        "overloaded",
        True,
        0.0,
    )
    assert len(scripted.received["overloaded"]) == 1


def test_the_shard_worker_retries_429_and_503_until_the_answer(scripted: Scripted) -> None:
    # The one place a request is retried: the worker's call_backend, around each POST of the backend.
    backend = for_endpoint(client(scripted, "flaky"), "/v2/models/{model}/infer")
    body = {
        "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "UINT32", "data": [1, 2, 3]}],
        "outputs": [{"name": "output0"}],
        "parameters": {"max_new_tokens": 3},
    }

    answer = asyncio.run(call_backend(backend, body))

    assert answer["outputs"][0]["data"] == [9, 8, 7]
    assert len(scripted.received["flaky"]) == 3


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (
            "rejects",
            (400, "invalid_value", False, "parameters.top_k must be an integer in (0, 2147483647], got 0"),
        ),
        ("crashed", (500, None, True, "device error")),
    ],
)
def test_other_errors_are_not_retried_here(
    scripted: Scripted, scenario: str, expected: tuple[Any, ...]
) -> None:
    error = failure(client(scripted, scenario))

    assert (error.status_code, error.code, error.retryable, error.message) == expected
    assert len(scripted.received[scenario]) == 1


@pytest.mark.parametrize("scenario", ["malformed", "empty"])
def test_a_malformed_answer_is_a_502(scripted: Scripted, scenario: str) -> None:
    error = failure(client(scripted, scenario))

    assert (error.status_code, error.code, error.retryable) == (502, "bad_response", True)
    assert error.message.startswith("The model server's answer is not a KServe v2 token response")


def test_no_answer_in_time_is_a_504(scripted: Scripted) -> None:
    started = time.monotonic()
    error = failure(client(scripted, "slow", timeout=0.5))

    assert (error.status_code, error.code, error.retryable) == (504, "timeout", True)
    assert error.message == "The model server did not answer within 0.5 s."
    assert time.monotonic() - started < 1.5


def test_an_unreachable_server_is_a_502() -> None:
    backend = ModelRegistry.from_dict(
        {"models": {"remote": {"backend": "kserve_v2", "base_url": "http://127.0.0.1:9", "model": "m"}}}
    ).backend("remote")

    with pytest.raises(BackendError) as caught:
        asyncio.run(backend.generate_tokens([1], SamplingParams()))

    assert (caught.value.status_code, caught.value.code, caught.value.retryable) == (
        502,
        "upstream_unavailable",
        True,
    )


def test_chat_needs_the_tokenizer_files(scripted: Scripted) -> None:
    with pytest.raises(BackendError) as caught:
        asyncio.run(client(scripted, "ok").chat_completion({"messages": [{"role": "user", "content": "Hi"}]}))

    assert (caught.value.status_code, caught.value.message) == (
        500,
        (
            "model 'remote' takes token ids only: set tokenizer and tokenizer_config in the registry to "
            "serve "
            "chat requests"
        ),
    )


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The registry options naming a tiny word-level tokenizer's files (ids 0 to 9, `<eos>` 1)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<eos>", "one", "two", "three", "four", "hello", "seven", "eight", "nine"]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    out = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"chat_template": "{{ messages }}", "bos_token": "", "eos_token": "<eos>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return {"tokenizer": str(out / "tokenizer.json"), "tokenizer_config": str(out / "tokenizer_config.json")}


def test_a_completions_body_sends_each_raw_prompt_as_token_ids(
    scripted: Scripted, word_tokenizer: dict[str, str]
) -> None:
    # Given the token server answers ids [9, 8, 7] to any request
    backend = client(scripted, "ok", **word_tokenizer)
    before = len(scripted.received.get("ok", []))

    # When a completions body with two prompts is answered
    out = asyncio.run(
        backend.text_completion(
            {"model": "remote", "prompt": ["one two three", "hello"], "max_tokens": 3, "temperature": 0}
        )
    )

    # Then each prompt went as its own token ids, greedy, and came back as one choice each
    sent = scripted.received["ok"][before:]
    assert sorted(s["inputs"][0]["data"] for s in sent) == [[2, 3, 4], [6]]
    assert {(s["parameters"]["do_sample"], s["parameters"]["max_new_tokens"]) for s in sent} == {(False, 3)}
    assert [(c["index"], c["text"], c["finish_reason"]) for c in out["choices"]] == [
        (0, "nine eight seven", "length"),
        (1, "nine eight seven", "length"),
    ]
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    assert (out["object"], out["model"]) == ("text_completion", "remote")


def test_completions_need_the_tokenizer_files(scripted: Scripted) -> None:
    with pytest.raises(BackendError) as caught:
        asyncio.run(client(scripted, "ok").text_completion({"prompt": "Hi"}))

    assert (caught.value.status_code, caught.value.message) == (
        500,
        "model 'remote' takes token ids only: set tokenizer and tokenizer_config in the registry to serve "
        "completions requests",
    )


@pytest.mark.parametrize(
    ("top_k", "options", "sent_top_k"),
    [
        (5, {}, 5),
        (None, {}, 2**31 - 1),  # the whole vocabulary, its size unknown
        (0, {}, 2**31 - 1),
        (-1, {"vocab_size": 10}, 10),
        (50, {"vocab_size": 10}, 10),
    ],
)
def test_a_request_s_top_k_is_sent_as_the_token_server_s_top_k(
    scripted: Scripted,
    word_tokenizer: dict[str, str],
    top_k: int | None,
    options: dict[str, Any],
    sent_top_k: int,
) -> None:
    # Given a chat body with vLLM's top_k extension (or none)
    backend = client(scripted, "ok", **word_tokenizer, **options)
    before = len(scripted.received.get("ok", []))
    extra = {} if top_k is None else {"top_k": top_k}

    # When it is answered
    asyncio.run(
        backend.chat_completion(
            {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, **extra}
        )
    )

    # Then the token request sampled from that many tokens (all of the vocabulary for none, -1 or 0)
    [sent] = scripted.received["ok"][before:]
    assert (sent["parameters"]["do_sample"], sent["parameters"]["top_k"]) == (True, sent_top_k)
