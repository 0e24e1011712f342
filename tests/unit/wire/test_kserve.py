"""The token request contract without a model: parsing, messages, defaults and limits
(tests/fixtures/cases/16-17-token-infer; their batch-line check: tests/unit/validation/test_endpoints.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchinfer.wire.kserve import (
    InferError,
    ModelLimits,
    SamplingParams,
    TokenRequest,
    TokenResult,
    infer_response,
    load_json,
    parse_infer_request,
    token_request_body,
)
from support.token_cases import CASE_ERRORS, CASES

# SmolLM2-135M-Instruct as the default registry serves it (vocabulary and trained context from its GGUF).
SMOLLM2 = ModelLimits(
    vocab_size=49152,
    max_seq_len=2048,
    max_position_embeddings=8192,
    max_input_tokens=2048,
    max_iter_times=512,
)


def body(**parameters: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "UINT32", "data": [5, 6, 7]}],
        "outputs": [{"name": "output0"}],
        "parameters": parameters,
    }


def rejection(value: Any, limits: ModelLimits | None = SMOLLM2) -> InferError:
    with pytest.raises(InferError) as caught:
        parse_infer_request(value, limits)
    assert caught.value.status == 400
    return caught.value


def test_every_case_file_has_an_expectation() -> None:
    assert sorted(p.name for p in CASES.glob("*.json")) == sorted(CASE_ERRORS)


@pytest.mark.parametrize("name", sorted(CASE_ERRORS))
def test_case_file_against_the_model_limits(name: str) -> None:
    # Given a case body
    case = json.loads((CASES / name).read_text())
    expected = CASE_ERRORS[name]

    if expected is None:
        # When it is parsed, Then it is served with its ids and max_new_tokens 4
        request = parse_infer_request(case, SMOLLM2)
        assert (request.input_ids, request.params.max_new_tokens) == (case["inputs"][0]["data"], 4)
    else:
        # When it is parsed, Then it is a 400 naming the field and what it must be
        error = rejection(case)
        assert (error.param, error.message) == expected


def test_prompt_limit_is_the_least_of_the_known_bounds() -> None:
    assert SMOLLM2.max_prompt_tokens == 2047
    assert (
        ModelLimits(max_input_tokens=64, max_seq_len=2048, max_position_embeddings=8192).max_prompt_tokens
        == 64
    )
    assert ModelLimits(max_position_embeddings=100).max_prompt_tokens == 100
    assert ModelLimits().max_prompt_tokens == 1024 * 1024
    assert ModelLimits().describe_prompt_limit() == "the cap of 1048576 tokens"


def test_prompt_one_past_the_limit_is_rejected_and_the_limit_accepted() -> None:
    limits = ModelLimits(vocab_size=49152, max_input_tokens=5)
    five = {
        **body(),
        "inputs": [{"name": "input0", "shape": [5], "datatype": "UINT32", "data": [1, 2, 3, 4, 5]}],
    }
    six = {
        **body(),
        "inputs": [{"name": "input0", "shape": [6], "datatype": "UINT32", "data": [1, 2, 3, 4, 5, 6]}],
    }

    assert parse_infer_request(five, limits).input_ids == [1, 2, 3, 4, 5]
    assert rejection(six, limits).message == (
        "inputs[0].data must hold n token ids with n in (0, 5] (the least of 1048576, max_input_tokens 5), "
        "got 6"
    )


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, SamplingParams(do_sample=False, top_k=1000)),
        ({"temperature": 0.5}, SamplingParams(do_sample=True, temperature=0.5, top_k=1000)),
        ({"top_k": 7}, SamplingParams(do_sample=True, top_k=7)),
        ({"top_p": 0.9}, SamplingParams(do_sample=True, top_p=0.9, top_k=1000)),
        (
            {"do_sample": False, "temperature": 0.5},
            SamplingParams(do_sample=False, temperature=0.5, top_k=1000),
        ),
        ({"do_sample": True}, SamplingParams(do_sample=True, top_k=1000)),
        ({"top_k": 49152}, SamplingParams(do_sample=True, top_k=49152)),
        ({"top_k": 2147483647}, SamplingParams(do_sample=True, top_k=49152)),  # >= vocab means the vocab
        ({"max_new_tokens": 2147483647}, SamplingParams(max_new_tokens=512, top_k=1000)),  # max_iter_times
        (
            {
                "seed": 18446744073709551615,
                "priority": 1,
                "timeout": 3600,
                "repetition_penalty": 1.03,
                "watermark": True,
                "details": True,
                "batch_size": 8,
            },
            SamplingParams(
                seed=18446744073709551615, priority=1, timeout=3600.0, repetition_penalty=1.03, top_k=1000
            ),
        ),
        ({"seed": None, "temperature": None}, SamplingParams(top_k=1000)),  # null is "not given"
    ],
)
def test_defaults_follow_mindie(parameters: dict[str, Any], expected: SamplingParams) -> None:
    assert parse_infer_request(body(**parameters), SMOLLM2).params == expected


def test_generation_config_top_k_is_the_default() -> None:
    limits = ModelLimits(vocab_size=49152, default_top_k=50)
    assert parse_infer_request(body(do_sample=True), limits).params.top_k == 50


def test_id_is_echoed_or_generated() -> None:
    given = parse_infer_request({**body(), "id": "req_42-a"}, SMOLLM2)
    generated = parse_infer_request(body(), SMOLLM2)

    assert given.id == "req_42-a"
    assert len(generated.id) == 32 and generated.id.isalnum()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            '{"inputs": NaN}',
            (
                "inputs must be an array of exactly 1 input tensor, got NaN, which is not a JSON "
                "number (RFC 8259 has no NaN or Infinity)"
            ),
        ),
        (
            '{"parameters": {"temperature": Infinity}}',
            (
                "parameters.temperature must be a number greater than 1e-06, "
                "got Infinity, which is not a JSON number (RFC 8259 has no "
                "NaN or Infinity)"
            ),
        ),
        (
            '{"parameters": {"top_p": -Infinity}}',
            (
                "parameters.top_p must be a number in (1e-06, 1.0], got -Infinity, "
                "which is not a JSON number (RFC 8259 has no NaN or Infinity)"
            ),
        ),
        ("[1, 2]", "the request body must be a JSON object, got array [1, 2]"),
        ('"x"', 'the request body must be a JSON object, got string "x"'),
    ],
)
def test_not_json_numbers_and_non_objects(raw: str, message: str) -> None:
    assert rejection(load_json(raw)).message == message


def test_a_huge_number_is_out_of_range_not_infinite() -> None:
    error = rejection({**body(), "parameters": {"temperature": 1e400}})
    assert (
        error.message
        == "parameters.temperature must be a number greater than 1e-06, got number inf (out of range)"
    )


def test_invalid_json_is_a_400() -> None:
    with pytest.raises(InferError) as caught:
        load_json(b'{"inputs": [')
    assert (caught.value.status, caught.value.message) == (
        400,
        "the request body is not valid JSON: Expecting value: line 1 column 13 (char 12)",
    )


def test_unknown_fields_are_named_with_the_allowed_ones() -> None:
    top = rejection({**body(), "stream": True})
    nested = rejection({**body(), "parameters": {"max_tokens": 3}})

    assert top.message == "unknown field stream: the allowed fields are id, inputs, outputs, parameters"
    assert nested.message == (
        "unknown field parameters.max_tokens in parameters: the allowed fields are temperature, top_k, "
        "top_p, do_sample, seed, repetition_penalty, max_new_tokens, watermark, details, batch_size, "
        "priority, timeout"
    )


def test_response_echoes_id_and_output_name_with_the_generated_ids_only() -> None:
    request = TokenRequest(id="42", input_ids=[1, 2, 3], output_name="tokens", params=SamplingParams())

    assert infer_response(request, TokenResult([9, 8, 2], "stop")) == {
        "id": "42",
        "outputs": [{"name": "tokens", "shape": [1, 3], "datatype": "UINT32", "data": [9, 8, 2]}],
    }


def test_a_client_body_states_every_parameter_and_parses_back_to_the_same_values() -> None:
    params = SamplingParams(
        do_sample=True,
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        seed=5,
        repetition_penalty=1.1,
        max_new_tokens=9,
        priority=2,
        timeout=30.0,
    )

    sent = token_request_body("r1", [4, 5], params)

    assert sent == {
        "id": "r1",
        "inputs": [{"name": "input0", "shape": [1, 2], "datatype": "UINT32", "data": [4, 5]}],
        "outputs": [{"name": "output0"}],
        "parameters": {
            "do_sample": True,
            "temperature": 0.7,
            "top_k": 40,
            "top_p": 0.9,
            "repetition_penalty": 1.1,
            "max_new_tokens": 9,
            "priority": 2,
            "timeout": 30,
            "seed": 5,
        },
    }
    assert parse_infer_request(sent, SMOLLM2).params == params
