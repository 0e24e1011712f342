"""Unit tests of `batchinfer.validation.file`: checking a batch input file line by line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from batchinfer.endpoints.base import Endpoint, Usage
from batchinfer.endpoints.registry import ENDPOINTS
from batchinfer.validation.file import FileValidator, LineError, RequestLine
from batchinfer.validation.jsonl import PhysicalLine

MODEL = "smollm2-135m-instruct"
CHAT = "/v1/chat/completions"
INFER = "/v2/models/{model}/infer"


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
    for key, value in changes.items():
        if value is ...:
            del body[key]
        else:
            body[key] = value
    return body


def _request(custom_id: Any = "r-1", **changes: Any) -> dict[str, Any]:
    """A request line; `changes` replace envelope keys (`body=...`) or, prefixed `b_`, body keys.

    The value `...` removes the key.
    """
    body_changes = {k[2:]: v for k, v in changes.items() if k.startswith("b_")}
    line: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": _body(**body_changes),
    }
    if custom_id is ...:
        del line["custom_id"]
    for key, value in changes.items():
        if key.startswith("b_"):
            continue
        if value is ...:
            del line[key]
        else:
            line[key] = value
    return line


def _encode(line: dict[str, Any] | str | bytes) -> bytes:
    if isinstance(line, bytes):
        return line
    if isinstance(line, str):
        return line.encode()
    return json.dumps(line).encode()


def _run(
    *lines: dict[str, Any] | str | bytes,
    endpoint: str = CHAT,
    known: tuple[str, ...] = (MODEL,),
    **limits: int,
) -> tuple[FileValidator, list[RequestLine]]:
    validator = FileValidator(endpoint, known.__contains__, **limits)
    data = b"".join(_encode(line) + b"\n" for line in lines)
    return validator, list(validator.validate_stream([data]))


def _errors(*lines: dict[str, Any] | str | bytes, **kwargs: Any) -> list[tuple[str, int | None, str | None]]:
    validator, _ = _run(*lines, **kwargs)
    return [(e.code, e.line, e.param) for e in validator.errors]


def _only_error(*lines: dict[str, Any] | str | bytes, **kwargs: Any) -> LineError:
    validator, _ = _run(*lines, **kwargs)
    assert len(validator.errors) == 1, validator.errors
    return validator.errors[0]


# --------------------------------------------------------------------------------------------------
# Valid files


def test_valid_file_gives_its_requests_with_the_body_untouched() -> None:
    extra = _request("a", b_max_tokens=None, b_response_format={"type": "json_object"}, b_logprobs=True)
    validator, requests = _run(extra, "", "  \t", _request("b"))
    assert validator.ok
    assert validator.errors == []
    assert validator.error_count == 0
    assert validator.request_count == 2
    assert validator.model == MODEL
    assert requests == [
        RequestLine(line=1, custom_id="a", method="POST", url=CHAT, body=extra["body"], model=MODEL),
        RequestLine(line=4, custom_id="b", method="POST", url=CHAT, body=_body(), model=MODEL),
    ]
    assert requests[0].body == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": None,
        "response_format": {"type": "json_object"},
        "logprobs": True,
    }


def test_feed_returns_none_for_blank_lines() -> None:
    validator = FileValidator(CHAT, {MODEL}.__contains__)
    assert validator.feed(PhysicalLine(1, b"", 0)) is None
    assert validator.feed(PhysicalLine(2, b" \t\r ", 4)) is None
    assert validator.request_count == 0
    assert validator.ok


def test_unknown_top_level_keys_are_ignored() -> None:
    validator, requests = _run(_request(extra="x"))
    assert validator.ok
    assert len(requests) == 1


def test_unsupported_batch_endpoint_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unsupported batch endpoint '/v1/moderations'"):
        FileValidator("/v1/moderations", lambda m: True)


# --------------------------------------------------------------------------------------------------
# Encoding and JSON


def test_invalid_utf8_is_reported_at_its_line_and_other_lines_still_run() -> None:
    bad = _encode(_request("e-2")).replace(b"Hi", b"H\xffi")
    validator, requests = _run(_request("e-1"), bad, _request("e-3"))
    assert [r.custom_id for r in requests] == ["e-1", "e-3"]
    offset = bad.index(b"\xff")
    assert validator.errors == [
        LineError(
            code="invalid_encoding",
            message=f"Line 2 is not valid UTF-8: byte 0xFF at byte {offset} of the line "
            "(invalid start byte). Batch files must be UTF-8.",
            line=2,
        )
    ]


def test_utf8_encoded_surrogate_is_invalid_encoding() -> None:
    bad = _encode(_request()).replace(b"Hi", b"H\xed\xa0\x80i")  # U+D800 encoded as UTF-8 bytes
    assert _errors(bad) == [("invalid_encoding", 1, None)]


@pytest.mark.parametrize(
    ("encoding", "reason"),
    [
        ("utf-16", "it starts with a UTF-16 little-endian byte order mark (FF FE)"),
        ("utf-16-be", "it has NUL bytes between characters, as UTF-16 or UTF-32 text does"),
        ("utf-16-le", "it has NUL bytes between characters, as UTF-16 or UTF-32 text does"),
        ("utf-32", "it starts with a UTF-32 little-endian byte order mark (FF FE 00 00)"),
    ],
)
def test_utf16_or_utf32_file_fails_once_at_line_1(encoding: str, reason: str) -> None:
    text = "".join(json.dumps(_request(f"r-{i}")) + "\n" for i in range(5))
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = "\ufeff".encode("utf-16-be") + data  # FE FF
        reason = "it starts with a UTF-16 big-endian byte order mark (FE FF)"
    validator = FileValidator(CHAT, {MODEL}.__contains__)
    assert list(validator.validate_stream([data])) == []
    assert validator.errors == [
        LineError(
            code="invalid_encoding",
            message=f"Line 1: the file is not UTF-8, {reason}. Save it as UTF-8 JSON Lines.",
            line=1,
        )
    ]
    assert validator.error_count == 1


def test_raw_nul_byte_on_a_later_line_is_invalid_json_not_a_file_encoding() -> None:
    bad = _encode(_request("r-2")).replace(b"Hi", b"H\x00i")
    assert _errors(_request("r-1"), bad) == [("invalid_json_line", 2, None)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"custom_id": "r2", ',
            "Line 1 is not valid JSON: Expecting property name enclosed in double quotes at column 21.",
        ),
        ("id,prompt", "Line 1 is not valid JSON: Expecting value at column 1."),
        ('{"a": 1} {"b": 2}', "Line 1 is not valid JSON: Extra data at column 10."),
        ('{"a": NaN}', "Line 1 is not valid JSON: NaN is not valid JSON (RFC 8259 has no NaN or Infinity)."),
        (
            '{"a": -Infinity}',
            "Line 1 is not valid JSON: -Infinity is not valid JSON (RFC 8259 has no NaN or Infinity).",
        ),
        (
            '{"custom_id": "r1", "body": {"temperature": 1e999}}',
            "Line 1 is not valid JSON: the number 1e999 is beyond the range of a double (it would be "
            "infinity).",
        ),
        (
            "[1]" * 1,
            (
                "Line 1 is a JSON array, not an object; each line must be one request object "
                '{"custom_id": ..., "method": "POST", "url": ..., "body": {...}}.'
            ),
        ),
        (
            '"text"',
            (
                "Line 1 is a JSON string, not an object; each line must be one request object "
                '{"custom_id": ..., "method": "POST", "url": ..., "body": {...}}.'
            ),
        ),
        (
            "null",
            (
                "Line 1 is a JSON null, not an object; each line must be one request object "
                '{"custom_id": ..., "method": "POST", "url": ..., "body": {...}}.'
            ),
        ),
        (
            "[" * 100_000 + "]" * 100_000,
            "Line 1 is not valid JSON: it is nested too deeply (more than 128 levels).",
        ),
    ],
)
def test_invalid_json_line(line: str, message: str) -> None:
    assert _only_error(line) == LineError(code="invalid_json_line", message=message, line=1)


@pytest.mark.parametrize(("prefix", "line"), [(b"\xef\xbb\xbf" * 2, 1), (b"", 2)])
def test_bom_after_the_first_is_invalid_json_line(prefix: bytes, line: int) -> None:
    lines = (
        [prefix + _encode(_request())]
        if line == 1
        else [_request("a"), b"\xef\xbb\xbf" + _encode(_request("b"))]
    )
    assert _only_error(*lines) == LineError(
        code="invalid_json_line",
        message=f"Line {line} starts with a byte order mark (U+FEFF); only the first line of a file "
        "may start with one. Remove it.",
        line=line,
    )


@pytest.mark.parametrize(
    "content", ["broken \ud800 here", "a\x00b", "h\u00e9llo \U0001f600 \u4f60\u597d \u2028"]
)
def test_lone_surrogates_nul_and_multilingual_text_pass_with_exact_code_points(content: str) -> None:
    validator, requests = _run(_request(b_messages=[{"role": "user", "content": content}]))
    assert validator.ok
    assert requests[0].body["messages"][0]["content"] == content


def test_lone_surrogates_in_custom_id_and_model_are_not_validation_errors() -> None:
    validator, requests = _run(_request("id-\ud800", b_model="m\udfff"), known=("m\udfff",))
    assert validator.ok
    assert (requests[0].custom_id, requests[0].model) == ("id-\ud800", "m\udfff")


# --------------------------------------------------------------------------------------------------
# Envelope


@pytest.mark.parametrize(
    ("custom_id", "shown"),
    [(17, "integer 17"), ("", 'string ""'), (None, "null"), (True, "boolean true"), (["a"], 'array ["a"]')],
)
def test_custom_id_must_be_a_non_empty_string(custom_id: Any, shown: str) -> None:
    assert _only_error(_request(custom_id)) == LineError(
        code="invalid_parameter",
        message=f"Line 1: custom_id must be a non-empty string, got {shown}.",
        param="custom_id",
        line=1,
    )


@pytest.mark.parametrize("key", ["custom_id", "method", "url", "body"])
def test_missing_envelope_field(key: str) -> None:
    assert _only_error(_request(**{key: ...})) == LineError(
        code="missing_required_parameter", message=f"Line 1: {key} is missing.", param=key, line=1
    )


def test_params_instead_of_body_reports_every_missing_field_and_names_the_stray_key() -> None:
    validator, _ = _run({"custom_id": "r1", "params": _body()})
    assert validator.errors == [
        LineError(
            code="missing_required_parameter", message="Line 1: method is missing.", param="method", line=1
        ),
        LineError(code="missing_required_parameter", message="Line 1: url is missing.", param="url", line=1),
        LineError(
            code="missing_required_parameter",
            message="Line 1: body is missing (the line has 'params').",
            param="body",
            line=1,
        ),
    ]


@pytest.mark.parametrize(
    ("method", "shown"), [("GET", 'string "GET"'), ("post", 'string "post"'), (1, "integer 1")]
)
def test_method_must_be_post(method: Any, shown: str) -> None:
    assert _only_error(_request(method=method)) == LineError(
        code="invalid_parameter",
        message=f'Line 1: method must be "POST", got {shown}.',
        param="method",
        line=1,
    )


@pytest.mark.parametrize(("body", "shown"), [("Hi", 'string "Hi"'), ([], "array []"), (None, "null")])
def test_body_must_be_an_object(body: Any, shown: str) -> None:
    assert _only_error(_request(body=body)) == LineError(
        code="invalid_parameter",
        message=f"Line 1: body must be a JSON object, got {shown}.",
        param="body",
        line=1,
    )


def test_url_must_be_a_string() -> None:
    assert _errors(_request(url=5)) == [("invalid_parameter", 1, "url")]


# --------------------------------------------------------------------------------------------------
# Duplicate custom_id


def test_duplicate_custom_id_names_the_earlier_line() -> None:
    validator, requests = _run(_request("req-1"), "", _request("req-1"), _request("req-1"))
    assert [r.line for r in requests] == [1]
    assert validator.errors == [
        LineError(
            code="duplicate_custom_id",
            message=f"custom_id 'req-1' on line {n} duplicates line 1; each request needs its own custom_id.",
            param="custom_id",
            line=n,
        )
        for n in (3, 4)
    ]


def test_custom_ids_are_compared_exactly() -> None:
    validator, requests = _run(_request("req-1"), _request("req-1 "), _request("REQ-1"), _request(" req-1"))
    assert validator.ok
    assert [r.custom_id for r in requests] == ["req-1", "req-1 ", "REQ-1", " req-1"]


def test_duplicate_is_found_even_when_a_line_has_other_errors() -> None:
    # The first use is remembered although line 1 fails, and line 2 reports both of its problems.
    assert _errors(_request("x", method="GET"), _request("x", method="GET")) == [
        ("invalid_parameter", 1, "method"),
        ("duplicate_custom_id", 2, "custom_id"),
        ("invalid_parameter", 2, "method"),
    ]


def test_duplicate_custom_id_with_a_lone_surrogate_gives_an_encodable_message() -> None:
    error = _errors(_request("a\ud800"), _request("a\ud800"))
    assert error == [("duplicate_custom_id", 2, "custom_id")]
    validator, _ = _run(_request("a\ud800"), _request("a\ud800"))
    assert validator.errors[0].message == (
        "custom_id 'a\\ud800' on line 2 duplicates line 1; each request needs its own custom_id."
    )
    validator.errors[0].model_dump_json().encode("utf-8")


# --------------------------------------------------------------------------------------------------
# Url and stream


def test_url_of_another_endpoint_is_url_mismatch() -> None:
    validator, requests = _run(_request("a"), _request("b", url="/v1/embeddings"))
    assert [r.line for r in requests] == [1]
    assert validator.errors == [
        LineError(
            code="url_mismatch",
            message="Line 2: url '/v1/embeddings' does not match the batch endpoint '/v1/chat/completions'; "
            "all requests of a batch go to its endpoint.",
            param="url",
            line=2,
        )
    ]


def test_token_endpoint_url_in_a_chat_batch_is_url_mismatch() -> None:
    assert _errors(_request(url=f"/v2/models/{MODEL}/infer")) == [("url_mismatch", 1, "url")]


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("v1/chat/completions", 'urls start with "/": use "/v1/chat/completions".'),
        ("/v1/chat/completion", 'did you mean "/v1/chat/completions"?'),
        ("/v1/chat/completions/", 'did you mean "/v1/chat/completions"?'),
        (
            "/foo",
            'known urls: "/v1/chat/completions", "/v2/models/{model}/infer", "/v1/completions", '
            '"/v1/responses", "/v1/embeddings"',
        ),
    ],
)
def test_unknown_url_is_invalid_url_with_a_hint(url: str, hint: str) -> None:
    assert _only_error(_request(url=url)) == LineError(
        code="invalid_url",
        message=f"Line 1: url {url!r} is not a known endpoint; {hint}",
        param="url",
        line=1,
    )


def test_stream_true_is_streaming_unsupported() -> None:
    assert _only_error(_request(b_stream=True)) == LineError(
        code="streaming_unsupported",
        message='Line 1: "stream": true is not supported in a batch; remove it or set it to false.',
        param="body.stream",
        line=1,
    )


@pytest.mark.parametrize("stream", [False, None])
def test_stream_false_or_null_is_fine(stream: bool | None) -> None:
    assert _errors(_request(b_stream=stream)) == []


def test_stream_of_another_type_is_invalid() -> None:
    assert _errors(_request(b_stream="yes")) == [("invalid_parameter", 1, "body.stream")]


# --------------------------------------------------------------------------------------------------
# Chat body


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0, "integer 0"),
        (-5, "integer -5"),
        (1.5, "number 1.5"),
        ("10", 'string "10"'),
        (True, "boolean true"),
        (1.0, "number 1.0"),
    ],
)
def test_max_tokens_must_be_a_positive_integer(field: str, value: Any, shown: str) -> None:
    assert _only_error(_request(**{f"b_{field}": value})) == LineError(
        code="invalid_parameter",
        message=f"Line 1: body.{field} must be a positive integer or null, got {shown}.",
        param=f"body.{field}",
        line=1,
    )


@pytest.mark.parametrize("value", [None, 1, 4096, ...])
def test_max_tokens_null_or_absent_or_positive_is_fine(value: Any) -> None:
    assert _errors(_request(b_max_tokens=value)) == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.1, "must be a number from 0 to 2, got number -0.1"),
        ("temperature", 2.5, "must be a number from 0 to 2, got number 2.5"),
        ("temperature", True, "must be a number from 0 to 2, got boolean true"),
        ("temperature", "1", 'must be a number from 0 to 2, got string "1"'),
        ("top_p", 1.01, "must be a number from 0 to 1, got number 1.01"),
        ("n", 2, "must be 1 (one choice per request in a batch), got integer 2"),
        ("n", True, "must be 1 (one choice per request in a batch), got boolean true"),
        (
            "stop",
            ["a", "b", "c", "d", "e"],
            'must be a string or an array of up to 4 strings, got array ["a", "b", "c", "d", "e"]',
        ),
        ("stop", [1], "must be a string or an array of up to 4 strings, got array [1]"),
        ("seed", 1.5, "must be an integer, got number 1.5"),
        ("seed", True, "must be an integer, got boolean true"),
    ],
)
def test_sampling_parameters_are_checked(field: str, value: Any, message: str) -> None:
    assert _only_error(_request(**{f"b_{field}": value})) == LineError(
        code="invalid_parameter", message=f"Line 1: body.{field} {message}.", param=f"body.{field}", line=1
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 0),
        ("temperature", 2),
        ("temperature", 0.7),
        ("top_p", 1),
        ("top_p", 0.0),
        ("n", 1),
        ("stop", "\n"),
        ("stop", ["a", "b", "c", "d"]),
        ("stop", None),
        ("seed", -3),
        ("seed", None),
    ],
)
def test_valid_sampling_parameters_pass(field: str, value: Any) -> None:
    assert _errors(_request(**{f"b_{field}": value})) == []


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            [],
            (
                "Line 1: body.messages must be a non-empty array of messages, each an object with a role "
                "and a "
                "content, got array []."
            ),
        ),
        (
            "Hi",
            (
                "Line 1: body.messages must be a non-empty array of messages, each an object with a role "
                "and a "
                'content, got string "Hi".'
            ),
        ),
        (["Hi"], 'Line 1: invalid body.messages[0]: must be an object; got string "Hi".'),
        ([{"content": "Hi"}], "Line 1: body.messages[0].role is missing."),
        ([{"role": "user"}], "Line 1: body.messages[0].content is missing."),
        (
            [{"role": "usr", "content": "Hi"}],
            (
                "Line 1: invalid body.messages[0].role: Input should be 'system', 'developer', 'user', "
                "'assistant', "
                "'tool' or 'function'; got string \"usr\"."
            ),
        ),
        (
            [{"role": "user", "content": 5}],
            (
                "Line 1: invalid body.messages[0].content: content must be a string or an array of "
                "content parts "
                '{"type": ...}; got integer 5.'
            ),
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "user", "content": None}],
            (
                "Line 1: invalid body.messages[1]: content may be null only in an assistant message, "
                'not in a user one; got object {"role": "user", "content": null}.'
            ),
        ),
    ],
)
def test_messages_must_be_a_non_empty_list_of_role_and_content(messages: Any, message: str) -> None:
    assert _only_error(_request(b_messages=messages)) == LineError(
        code="invalid_parameter", message=message, param="body.messages", line=1
    )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}],
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
    ],
)
def test_valid_messages_pass(messages: list[dict[str, Any]]) -> None:
    assert _errors(_request(b_messages=messages)) == []


def test_missing_model_and_messages_are_both_reported() -> None:
    assert _errors(_request(b_model=..., b_messages=...)) == [
        ("missing_required_parameter", 1, "body.model"),
        ("missing_required_parameter", 1, "body.messages"),
    ]


def test_every_body_problem_of_a_line_is_reported() -> None:
    assert _errors(_request(b_stream=True, b_max_tokens=0, b_temperature=5)) == [
        ("streaming_unsupported", 1, "body.stream"),
        ("invalid_parameter", 1, "body.max_tokens"),
        ("invalid_parameter", 1, "body.temperature"),
    ]


# --------------------------------------------------------------------------------------------------
# Models


def test_second_model_is_model_mismatch_naming_both() -> None:
    validator, requests = _run(
        _request("a"), _request("b", b_model="some-other-model"), known=(MODEL, "some-other-model")
    )
    assert [r.line for r in requests] == [1]
    assert validator.model == MODEL
    assert validator.errors == [
        LineError(
            code="model_mismatch",
            message="Line 2: model 'some-other-model' differs from model 'smollm2-135m-instruct' of line 1; "
            "a batch file must use one model.",
            param="body.model",
            line=2,
        )
    ]


def test_unknown_model_is_model_not_found_and_asked_once() -> None:
    asked = []

    def known(model: str) -> bool:
        asked.append(model)
        return False

    validator = FileValidator(CHAT, known)
    data = b"".join(_encode(_request(f"r-{i}", b_model="does-not-exist")) + b"\n" for i in range(3))
    assert list(validator.validate_stream([data])) == []
    assert asked == ["does-not-exist"]
    assert validator.errors[0] == LineError(
        code="model_not_found",
        message=(
            "Line 1: model 'does-not-exist' is not served by this deployment; "
            "GET /v1/models lists the models."
        ),
        param="body.model",
        line=1,
    )
    assert [(e.code, e.line) for e in validator.errors] == [("model_not_found", n) for n in (1, 2, 3)]


def test_model_of_a_line_with_body_errors_still_sets_the_file_model() -> None:
    assert _errors(_request("a", b_max_tokens=0), _request("b", b_model="other")) == [
        ("invalid_parameter", 1, "body.max_tokens"),
        ("model_mismatch", 2, "body.model"),
    ]


@pytest.mark.parametrize(("model", "shown"), [("", 'string ""'), (7, "integer 7")])
def test_model_must_be_a_non_empty_string(model: Any, shown: str) -> None:
    assert _only_error(_request(b_model=model)) == LineError(
        code="invalid_parameter",
        message=f"Line 1: body.model must be a non-empty string, got {shown}.",
        param="body.model",
        line=1,
    )


# --------------------------------------------------------------------------------------------------
# The token endpoint hook


def _infer_line(custom_id: str, model: str = MODEL) -> dict[str, Any]:
    body = {
        "inputs": [{"name": "input0", "shape": [1, 2], "datatype": "UINT32", "data": [1, 2]}],
        "outputs": [{"name": "output0"}],
    }
    return {"custom_id": custom_id, "method": "POST", "url": f"/v2/models/{model}/infer", "body": body}


@pytest.mark.parametrize("endpoint", [INFER, f"/v2/models/{MODEL}/infer"])
def test_token_endpoint_takes_the_model_from_the_url(endpoint: str) -> None:
    validator, requests = _run(_infer_line("t-1"), _infer_line("t-2"), endpoint=endpoint)
    assert validator.ok
    assert validator.model == MODEL
    url = f"/v2/models/{MODEL}/infer"
    assert [(r.line, r.model, r.url) for r in requests] == [(1, MODEL, url), (2, MODEL, url)]


def test_token_endpoint_checks_url_model_and_mismatch() -> None:
    assert _errors(_infer_line("t-1"), _infer_line("t-2", "other"), _request("c"), endpoint=INFER) == [
        ("model_mismatch", 2, "url"),
        ("url_mismatch", 3, "url"),
    ]
    assert _errors(_infer_line("t-1", "nope"), endpoint=INFER) == [("model_not_found", 1, "url")]


class _TestEndpoint(Endpoint):
    template, pattern, model_param = "/v1/test", re.compile("/v1/test"), "body.model"

    def check_body(self, body: dict[str, Any], line: int) -> list[LineError]:
        return (
            []
            if "x" in body
            else [LineError(code="invalid_parameter", message="no x", param="body.x", line=line)]
        )

    def model_of(self, match: re.Match[str], body: dict[str, Any]) -> str | None:
        return body.get("model")

    def usage(self, result: dict[str, Any]) -> Usage:
        return Usage()


def test_a_new_endpoint_plugs_into_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENDPOINTS, "/v1/test", _TestEndpoint())
    lines = [
        _request("a", url="/v1/test", body={"x": 1, "model": MODEL}),
        _request("b", url="/v1/test", body={}),
    ]
    validator, requests = _run(*lines, _request("c", url="/v1/test", body={"x": 1}), endpoint="/v1/test")
    assert [r.custom_id for r in requests] == ["a"]
    assert validator.errors == [
        LineError(code="invalid_parameter", message="no x", param="body.x", line=2),
        LineError(
            code="missing_required_parameter",
            message="Line 3: the model is missing (body.model).",
            param="body.model",
            line=3,
        ),
    ]


# --------------------------------------------------------------------------------------------------
# File limits


def test_empty_file_when_zero_bytes() -> None:
    validator, _ = _run()
    assert validator.errors == [
        LineError(code="empty_file", message="The file has no requests: it is empty (0 bytes).")
    ]
    assert validator.request_count == 0
    assert not validator.ok


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"\n \n\t\n", "its 3 lines are all blank"),
        (b"\r\n", "its only line is blank"),
        (b"\xef\xbb\xbf", "it is empty (3 bytes)"),
    ],
)
def test_empty_file_when_only_blank_lines(data: bytes, what: str) -> None:
    validator = FileValidator(CHAT, {MODEL}.__contains__)
    assert list(validator.validate_stream([data])) == []
    assert validator.errors == [LineError(code="empty_file", message=f"The file has no requests: {what}.")]


def test_too_many_tasks_is_reported_once() -> None:
    validator, requests = _run(*(_request(f"r-{i}") for i in range(5)), max_requests=3)
    assert len(requests) == 5
    assert validator.request_count == 5
    assert validator.errors == [
        LineError(
            code="too_many_tasks",
            message="The file has more than 3 requests, the limit per batch (line 4 is request 4).",
        )
    ]


def test_line_too_large_names_the_line_and_its_size() -> None:
    big = _request("big", b_messages=[{"role": "user", "content": "x" * 200}])
    size = len(_encode(big))
    validator, requests = _run(_request("a"), big, _request("b"), max_line_bytes=200)
    assert [r.line for r in requests] == [1, 3]
    assert validator.errors == [
        LineError(
            code="line_too_large",
            message=f"Line 2 is {size} bytes long; the limit is 200 bytes per line.",
            line=2,
        )
    ]
    assert validator.request_count == 3


def test_file_too_large_stops_reading_and_is_reported_once() -> None:
    pulled = []

    def chunks() -> Iterator[bytes]:
        for i in range(1000):
            pulled.append(i)
            yield _encode(_request(f"r-{i}")) + b"\n"

    line_bytes = len(_encode(_request("r-0")) + b"\n")
    validator = FileValidator(CHAT, {MODEL}.__contains__, max_file_bytes=3 * line_bytes)
    requests = list(validator.validate_stream(chunks()))
    assert [r.line for r in requests] == [1, 2, 3]
    assert pulled == [0, 1, 2, 3]
    assert validator.errors == [
        LineError(
            code="file_too_large",
            message=f"The file is larger than the limit of {3 * line_bytes} bytes "
            f"({4 * line_bytes} bytes read).",
        )
    ]
    validator.finish(10**9)  # a second call adds nothing
    assert validator.error_count == 1


def test_errors_are_capped_but_all_counted() -> None:
    validator, _ = _run(*(["{"] * 5), max_errors=2)
    assert [(e.code, e.line) for e in validator.errors] == [
        ("invalid_json_line", 1),
        ("invalid_json_line", 2),
    ]
    assert validator.error_count == 5
    assert not validator.ok


def test_feed_and_finish_by_hand() -> None:
    validator = FileValidator(CHAT, {MODEL}.__contains__)
    request = validator.feed(PhysicalLine(7, _encode(_request("x")), 0))
    validator.finish(100)
    assert request == RequestLine(line=7, custom_id="x", method="POST", url=CHAT, body=_body(), model=MODEL)
    assert validator.ok
    assert validator.request_count == 1


def test_a_pretty_printed_json_array_file_is_one_error_with_the_json_lines_hint() -> None:
    # Given 3 requests written as an indented JSON array (42 lines would each be "not valid JSON")
    array = json.dumps([_request(f"r-{i}") for i in range(3)], indent=2).encode()
    validator = FileValidator(CHAT, lambda model: True)

    # When it is validated
    assert list(validator.validate_stream([array])) == []
    validator.finish(len(array))

    # Then one error says what the file must be
    assert validator.errors == [
        LineError(
            code="invalid_json_line",
            message="Line 1 starts a JSON array: this must be JSON Lines (one request object per line), "
            "not a JSON array. Write each request object on a line of its own, without [ ] or commas.",
            line=1,
        )
    ]
    assert validator.error_count == 1


def test_a_one_line_json_array_of_objects_gets_the_hint_too() -> None:
    line = json.dumps([_request("r-1"), _request("r-2")])
    assert _only_error(line).message.startswith("Line 1 starts a JSON array: this must be JSON Lines")


def test_an_unknown_model_names_the_closest_served_model() -> None:
    validator = FileValidator(
        CHAT, lambda model: False, model_names=["smollm2-135m-instruct", "qwen2.5-7b-instruct"]
    )
    data = _encode(_request("r-1", b_model="smollm2-135m")) + b"\n"
    assert list(validator.validate_stream([data])) == []
    assert validator.errors[0].message == (
        "Line 1: model 'smollm2-135m' is not served by this deployment; did you mean "
        "'smollm2-135m-instruct'? GET /v1/models lists the models."
    )
