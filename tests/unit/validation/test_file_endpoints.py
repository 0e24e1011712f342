"""`FileValidator` with the new endpoints: a model must serve the batch's endpoint
(`endpoint_not_supported`), and a file mixing endpoints fails as OpenAI's does (`url_mismatch`)."""

from __future__ import annotations

import json
from typing import Any

from batchinfer.backends.registry import ModelRegistry
from batchinfer.validation.file import FileValidator, LineError

COMPLETIONS, RESPONSES, CHAT = "/v1/completions", "/v1/responses", "/v1/chat/completions"
REGISTRY = ModelRegistry.from_dict(
    {
        "models": {
            "nova": {"backend": "bedrock", "model_id": "amazon.nova-micro-v1:0"},
            "vllm": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
            "mindie": {"backend": "kserve_v2", "base_url": "http://127.0.0.1:9", "model": "m"},
        }
    }
)


def _line(custom_id: str, url: str, **body: Any) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode() + b"\n"


def _validate(endpoint: str, *lines: bytes) -> tuple[FileValidator, list[int]]:
    validator = FileValidator(
        endpoint, REGISTRY.__contains__, model_names=REGISTRY.names(), serves=REGISTRY.serves
    )
    requests = list(validator.validate_stream([b"".join(lines)]))
    return validator, [request.line for request in requests]


def test_a_model_whose_backend_does_not_serve_the_endpoint_fails_each_line_naming_those_that_do() -> None:
    validator, valid = _validate(
        COMPLETIONS,
        _line("a", COMPLETIONS, model="nova", prompt="x"),
        _line("b", COMPLETIONS, model="nova", prompt="y"),
    )

    assert valid == []
    assert validator.errors == [
        LineError(
            code="endpoint_not_supported",
            message=f"Line {n}: model 'nova' does not serve /v1/completions; "
            "models that do: 'vllm', 'mindie'.",
            param="body.model",
            line=n,
        )
        for n in (1, 2)
    ]


def test_a_model_that_serves_the_endpoint_passes() -> None:
    validator, valid = _validate(RESPONSES, _line("a", RESPONSES, model="nova", input="x"))

    assert (validator.errors, valid) == ([], [1])


def test_the_token_endpoint_names_its_token_models() -> None:
    validator, valid = _validate(
        "/v2/models/{model}/infer",
        _line(
            "a",
            "/v2/models/vllm/infer",
            inputs=[{"name": "input0", "shape": [1, 1], "datatype": "UINT32", "data": [1]}],
            outputs=[{"name": "output0"}],
        ),
    )

    assert valid == []
    assert validator.errors == [
        LineError(
            code="endpoint_not_supported",
            message="Line 1: model 'vllm' does not serve /v2/models/{model}/infer; models that do: 'mindie'.",
            param="url",
            line=1,
        )
    ]


def test_no_serving_model_is_said_so() -> None:
    registry = ModelRegistry.from_dict({"models": {"nova": {"backend": "bedrock", "model_id": "x"}}})
    validator = FileValidator(
        COMPLETIONS, registry.__contains__, model_names=registry.names(), serves=registry.serves
    )

    assert list(validator.validate_stream([_line("a", COMPLETIONS, model="nova", prompt="x")])) == []
    assert [e.message for e in validator.errors] == [
        "Line 1: model 'nova' does not serve /v1/completions; no model of this deployment does."
    ]


def test_an_unknown_model_is_still_model_not_found() -> None:
    validator, _ = _validate(COMPLETIONS, _line("a", COMPLETIONS, model="gpt-4o", prompt="x"))

    assert [(e.code, e.line) for e in validator.errors] == [("model_not_found", 1)]


def test_mixed_endpoints_in_one_file_are_url_mismatch_on_each_other_line() -> None:
    validator, valid = _validate(
        COMPLETIONS,
        _line("a", COMPLETIONS, model="vllm", prompt="x"),
        _line("b", RESPONSES, model="vllm", input="x"),
        _line("c", CHAT, model="vllm", messages=[{"role": "user", "content": "x"}]),
    )

    assert valid == [1]
    assert validator.errors == [
        LineError(
            code="url_mismatch",
            message=f"Line {n}: url '{url}' does not match the batch endpoint '/v1/completions'; "
            "all requests of a batch go to its endpoint.",
            param="url",
            line=n,
        )
        for n, url in ((2, RESPONSES), (3, CHAT))
    ]


def test_body_rules_of_the_batch_endpoint_apply() -> None:
    validator, _ = _validate(RESPONSES, _line("a", RESPONSES, model="vllm", input="x", store=True))

    assert [(e.code, e.line, e.param) for e in validator.errors] == [("invalid_parameter", 1, "body.store")]
