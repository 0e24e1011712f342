"""Validation of an embeddings batch file: its line rules reported with their line, its 50,000-input
batch limit as a batch-level error, and a chat line in it as in any other batch (`url_mismatch`)."""

from __future__ import annotations

import json
from typing import Any

from batchinfer.validation.file import FileValidator, LineError

EMBEDDINGS = "/v1/embeddings"
MODEL = "all-minilm-l6-v2"


def line(custom_id: str, url: str = EMBEDDINGS, **body: Any) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode() + b"\n"


def validate(*lines: bytes) -> FileValidator:
    validator = FileValidator(EMBEDDINGS, {MODEL}.__contains__)
    list(validator.validate_stream([b"".join(lines)]))
    return validator


def test_exactly_50000_inputs_pass_and_one_more_fails_the_batch() -> None:
    # Given 25 lines of 2,000 inputs, then the same with one more line of one input
    full = [line(f"r{i}", model=MODEL, input=["x"] * 2000) for i in range(25)]

    # When / Then
    passing = validate(*full)
    assert (passing.ok, passing.input_count) == (True, 50_000)
    failing = validate(*full, line("last", model=MODEL, input=[7, 8]))
    assert failing.errors == [
        LineError(
            code="too_many_tasks",
            message="The batch has 50001 inputs; the limit is 50000 inputs per batch.",
        )
    ]


def test_line_rules_and_a_chat_line_name_their_lines() -> None:
    # Given a valid line, one of 2,049 inputs, one without input, and a chat line
    validator = validate(
        line("ok", model=MODEL, input="a"),
        line("big", model=MODEL, input=["x"] * 2049),
        line("none", model=MODEL),
        line("chat", url="/v1/chat/completions", model=MODEL, messages=[{"role": "user", "content": "hi"}]),
    )

    # When / Then
    assert [(e.code, e.line, e.param) for e in validator.errors] == [
        ("invalid_parameter", 2, "body.input"),
        ("missing_required_parameter", 3, "body.input"),
        ("url_mismatch", 4, "url"),
    ]
    assert validator.errors[2].message == (
        "Line 4: url '/v1/chat/completions' does not match the batch endpoint '/v1/embeddings'; "
        "all requests of a batch go to its endpoint."
    )
