"""The real-world cases (`tests/fixtures/cases/README.md`) through the splitter and the validator.

Each input file is streamed in small chunks (so lines and multi-byte characters cross chunk
boundaries) into a `FileValidator` for `/v1/chat/completions` that knows one model.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from batchinfer.validation.file import FileValidator, RequestLine
from batchinfer.validation.jsonl import iter_physical_lines
from support.cases import CASES

MODEL = "smollm2-135m-instruct"
# The folders whose files are validation inputs; 16-17-token-infer holds bodies of another endpoint.
FOLDERS = (
    "01-duplicate-custom-id",
    "03-line-splitting",
    "04-byte-order-mark",
    "05-encoding",
    "06-line-envelope",
    "07-url-and-stream",
    "08-models",
    "12-max-tokens",
)


class Ok(NamedTuple):
    """The file is valid: its requests are on these lines."""

    lines: tuple[int, ...]


class Fails(NamedTuple):
    """The file fails validation with exactly these `(code, line, param)` errors."""

    errors: tuple[tuple[str, int | None, str | None], ...]


EXPECTED: dict[str, Ok | Fails] = {
    "01-duplicate-custom-id/input.jsonl": Fails((("duplicate_custom_id", 2, "custom_id"),)),
    "01-duplicate-custom-id/distinct-lookalikes.jsonl": Ok((1, 2, 3)),
    "03-line-splitting/blank-middle.jsonl": Ok((1, 3)),
    "03-line-splitting/crlf.jsonl": Ok((1, 2)),
    "03-line-splitting/only-blank-lines.jsonl": Fails((("empty_file", None, None),)),
    "03-line-splitting/trailing-blanks.jsonl": Ok((1, 2)),
    "03-line-splitting/u2028-inside-content.jsonl": Ok((1,)),
    "03-line-splitting/whitespace-line-no-final-newline.jsonl": Ok((1, 3)),
    "03-line-splitting/zero-bytes.jsonl": Fails((("empty_file", None, None),)),
    "04-byte-order-mark/bom-on-line-2.jsonl": Fails((("invalid_json_line", 2, None),)),
    "04-byte-order-mark/utf16le.jsonl": Fails((("invalid_encoding", 1, None),)),
    "04-byte-order-mark/utf8-bom.jsonl": Ok((1, 2)),
    "05-encoding/invalid-utf8-line-2.jsonl": Fails((("invalid_encoding", 2, None),)),
    # Valid JSON: the worker answers the lone surrogate per line at run time.
    "05-encoding/lone-surrogate.jsonl": Ok((1, 2, 3)),
    "05-encoding/multilingual-escaped.jsonl": Ok((1,)),
    "05-encoding/multilingual-raw.jsonl": Ok((1,)),
    "05-encoding/nul-char.jsonl": Ok((1,)),
    "06-line-envelope/array-line.jsonl": Fails((("invalid_json_line", 1, None),)),
    "06-line-envelope/body-is-string.jsonl": Fails((("invalid_parameter", 1, "body"),)),
    "06-line-envelope/csv-file.jsonl": Fails(
        (("invalid_json_line", 1, None), ("invalid_json_line", 2, None))
    ),
    "06-line-envelope/custom-id-empty.jsonl": Fails((("invalid_parameter", 1, "custom_id"),)),
    "06-line-envelope/custom-id-number.jsonl": Fails((("invalid_parameter", 1, "custom_id"),)),
    "06-line-envelope/empty-messages.jsonl": Fails((("invalid_parameter", 1, "body.messages"),)),
    "06-line-envelope/get-method.jsonl": Fails((("invalid_parameter", 1, "method"),)),
    "06-line-envelope/no-method.jsonl": Fails((("missing_required_parameter", 1, "method"),)),
    "06-line-envelope/params-instead-of-body.jsonl": Fails(
        (
            ("missing_required_parameter", 1, "method"),
            ("missing_required_parameter", 1, "url"),
            ("missing_required_parameter", 1, "body"),
        )
    ),
    "06-line-envelope/truncated-json.jsonl": Fails((("invalid_json_line", 2, None),)),
    "07-url-and-stream/stream-true.jsonl": Fails((("streaming_unsupported", 1, "body.stream"),)),
    "07-url-and-stream/url-mismatch-line-2.jsonl": Fails((("url_mismatch", 2, "url"),)),
    "07-url-and-stream/url-no-leading-slash.jsonl": Fails((("invalid_url", 1, "url"),)),
    "07-url-and-stream/url-typo.jsonl": Fails((("invalid_url", 1, "url"),)),
    "08-models/mixed-models.jsonl": Fails((("model_mismatch", 2, "body.model"),)),
    "08-models/no-model.jsonl": Fails((("missing_required_parameter", 1, "body.model"),)),
    "08-models/unknown-model.jsonl": Fails((("model_not_found", 1, "body.model"),)),
    "12-max-tokens/max-tokens-bool.jsonl": Fails((("invalid_parameter", 1, "body.max_tokens"),)),
    "12-max-tokens/max-tokens-float.jsonl": Fails((("invalid_parameter", 1, "body.max_tokens"),)),
    "12-max-tokens/max-tokens-negative.jsonl": Fails((("invalid_parameter", 1, "body.max_tokens"),)),
    "12-max-tokens/max-tokens-null.jsonl": Ok((1,)),
    "12-max-tokens/max-tokens-string.jsonl": Fails((("invalid_parameter", 1, "body.max_tokens"),)),
    "12-max-tokens/max-tokens-zero.jsonl": Fails((("invalid_parameter", 1, "body.max_tokens"),)),
    # Too long for the model's context: a per-line run-time error, not a validation one.
    "12-max-tokens/prompt-longer-than-context.jsonl": Ok((1,)),
}


def _validate(name: str, chunk_size: int = 7) -> tuple[FileValidator, list[RequestLine]]:
    data = (CASES / name).read_bytes()
    chunks = (data[i : i + chunk_size] for i in range(0, len(data), chunk_size))
    validator = FileValidator("/v1/chat/completions", {MODEL}.__contains__)
    reader = iter_physical_lines(chunks, validator.max_line_bytes)
    requests = [request for line in reader if (request := validator.feed(line)) is not None]
    validator.finish(reader.bytes_read)
    assert reader.bytes_read == len(data)
    return validator, requests


def _content(request: RequestLine) -> str:
    return request.body["messages"][0]["content"]


def test_every_case_file_has_an_expectation() -> None:
    present = {
        str(p.relative_to(CASES)) for folder in FOLDERS for p in (CASES / folder).glob("*") if p.is_file()
    }
    assert present == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_case(name: str) -> None:
    validator, requests = _validate(name)
    expected = EXPECTED[name]
    if isinstance(expected, Ok):
        assert validator.errors == []
        assert validator.ok
        assert tuple(r.line for r in requests) == expected.lines
        assert validator.request_count == len(expected.lines)
        assert validator.model == MODEL
    else:
        assert tuple((e.code, e.line, e.param) for e in validator.errors) == expected.errors
        assert validator.error_count == len(expected.errors)
        assert not validator.ok


def test_duplicate_message_names_the_first_line() -> None:
    validator, _ = _validate("01-duplicate-custom-id/input.jsonl")
    assert validator.errors[0].message == (
        "custom_id 'req-1' on line 2 duplicates line 1; each request needs its own custom_id."
    )


def test_lookalike_ids_stay_distinct() -> None:
    _, requests = _validate("01-duplicate-custom-id/distinct-lookalikes.jsonl")
    assert [r.custom_id for r in requests] == ["req-1", "req-1 ", "REQ-1"]


def test_u2028_stays_inside_the_content() -> None:
    _, requests = _validate("03-line-splitting/u2028-inside-content.jsonl")
    assert _content(requests[0]) == "first part\u2028second part"


def test_utf8_bom_file_keeps_both_records() -> None:
    _, requests = _validate("04-byte-order-mark/utf8-bom.jsonl")
    assert [(r.custom_id, _content(r)) for r in requests] == [("a-1", "Say hi."), ("a-2", "Say bye.")]


@pytest.mark.parametrize(
    "name", ["05-encoding/multilingual-escaped.jsonl", "05-encoding/multilingual-raw.jsonl"]
)
def test_multilingual_text_keeps_its_exact_code_points(name: str) -> None:
    _, requests = _validate(name)
    assert (
        _content(requests[0])
        == "Translate: h\u00e9llo \U0001f600 \u4f60\u597d \u0645\u0631\u062d\u0628\u0627"
    )


def test_lone_surrogate_and_nul_reach_the_request_unchanged() -> None:
    _, requests = _validate("05-encoding/lone-surrogate.jsonl")
    assert _content(requests[1]) == "broken \ud800 here"
    assert json.dumps(requests[1].body).encode("utf-8")  # writable to a shard with the default ensure_ascii
    _, requests = _validate("05-encoding/nul-char.jsonl")
    assert _content(requests[0]) == "a\x00b"


def test_url_messages_give_the_fix() -> None:
    validator, _ = _validate("07-url-and-stream/url-no-leading-slash.jsonl")
    assert validator.errors[0].message == (
        "Line 1: url 'v1/chat/completions' is not a known endpoint; "
        'urls start with "/": use "/v1/chat/completions".'
    )
    validator, _ = _validate("07-url-and-stream/url-typo.jsonl")
    assert validator.errors[0].message == (
        "Line 1: url '/v1/chat/completion' is not a known endpoint; did you mean \"/v1/chat/completions\"?"
    )


def test_model_messages_name_the_models() -> None:
    validator, _ = _validate("08-models/mixed-models.jsonl")
    assert validator.errors[0].message == (
        "Line 2: model 'some-other-model' differs from model 'smollm2-135m-instruct' of line 1; "
        "a batch file must use one model."
    )
    validator, _ = _validate("08-models/unknown-model.jsonl")
    assert validator.errors[0].message == (
        "Line 1: model 'does-not-exist' is not served by this deployment; GET /v1/models lists the models."
    )


def test_encoding_messages() -> None:
    validator, _ = _validate("04-byte-order-mark/utf16le.jsonl")
    assert validator.errors[0].message == (
        "Line 1: the file is not UTF-8, it starts with a UTF-16 little-endian byte order mark (FF FE). "
        "Save it as UTF-8 JSON Lines."
    )
    validator, _ = _validate("05-encoding/invalid-utf8-line-2.jsonl")
    assert validator.errors[0].message == (
        "Line 2 is not valid UTF-8: byte 0xFF at byte 170 of the line (invalid start byte). "
        "Batch files must be UTF-8."
    )


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 1 << 20])
def test_outcome_does_not_depend_on_chunk_size(chunk_size: int) -> None:
    for name in EXPECTED:
        small, small_requests = _validate(name, 7)
        other, other_requests = _validate(name, chunk_size)
        assert other.errors == small.errors
        assert other_requests == small_requests
