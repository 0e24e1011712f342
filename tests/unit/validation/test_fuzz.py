"""Fuzzing the line validator (`FileValidator` over `iter_physical_lines`) with hostile files.

Whatever the bytes (random bytes; JSON lines that are valid, mutated, nested thousands deep, with huge
numbers, NaN, lone surrogates, control characters, byte order marks, UTF-16; any chunking and any line
limit), validating never raises, and the file is accounted for line by line: lines are numbered 1, 2,
... as an editor shows them, a blank line gives nothing, and every other line gives exactly one of a
request of that line or errors naming that line. The one exception is a file found to be UTF-16/32: its
first non-blank line carries the error and the lines after it are not examined.

Example counts are modest and the runs derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchinfer.validation.file import ErrorCode, FileValidator, LineError, RequestLine
from batchinfer.validation.jsonl import UTF8_BOM, iter_physical_lines

MODEL = "smollm2-135m-instruct"
CHAT = "/v1/chat/completions"
INFER = "/v2/models/{model}/infer"
INFER_URL = f"/v2/models/{MODEL}/infer"
FUZZ = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Text with every kind of code point: lone surrogates, controls, unassigned, private use.
TEXT = st.text(st.characters(exclude_categories=()), max_size=6)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)
CUSTOM_IDS = st.one_of(st.sampled_from(["a", "b", "A", "a ", ""]), TEXT)


def chat_request(custom_id: Any, content: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4},
    }


def infer_request(custom_id: Any, ids: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": INFER_URL,
        "body": {
            "inputs": [
                {
                    "name": "input0",
                    "shape": [1, len(ids)] if isinstance(ids, list) else [1],
                    "datatype": "UINT32",
                    "data": ids,
                }
            ],
            "outputs": [{"name": "output0"}],
            "parameters": {"max_new_tokens": 2},
        },
    }


REQUESTS = st.one_of(
    st.builds(chat_request, CUSTOM_IDS, st.one_of(TEXT, VALUES)),
    st.builds(
        infer_request, CUSTOM_IDS, st.one_of(st.lists(st.integers(-1, 2**32), min_size=1, max_size=3), VALUES)
    ),
)
DELETE = object()


def mutated(request: dict[str, Any], where: str, key: str, value: Any) -> dict[str, Any]:
    """`request` with `key` of the envelope or of the body set to `value` (`DELETE`: removed)."""
    target = request if where == "envelope" or not isinstance(request.get("body"), dict) else request["body"]
    if value is DELETE:
        target.pop(key, None)
    else:
        target[key] = value
    return request


MUTATED = st.builds(
    mutated,
    REQUESTS,
    st.sampled_from(["envelope", "body"]),
    st.sampled_from(
        [
            "custom_id",
            "method",
            "url",
            "body",
            "model",
            "messages",
            "max_tokens",
            "stream",
            "inputs",
            "outputs",
            "parameters",
            "extra",
        ]
    ),
    st.one_of(st.just(DELETE), VALUES, st.sampled_from([CHAT, INFER_URL, "POST", MODEL])),
)


def render(obj: Any, ascii_only: bool) -> bytes:
    # ensure_ascii=False writes lone surrogates raw: "surrogatepass" makes them the invalid UTF-8 a
    # careless encoder produces (ED A0 80).
    return json.dumps(obj, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")


def deep(depth: int) -> bytes:
    return (
        json.dumps(chat_request("deep", "hi"))
        .encode()
        .replace(b'"max_tokens": 4', b'"max_tokens": 4, "x": ' + b"[" * depth + b"]" * depth)
    )


HOSTILE = st.sampled_from(
    [
        b"",
        b"   ",
        b"\t \r",
        b"\r",  # blank
        b"{",
        b"}",
        b"[]",
        b"null",
        b"0",
        b'"text"',
        b"\x00",
        b"\x0b",
        b"\xc0\xaf",
        b"NaN",
        b"[Infinity]",
        b'{"custom_id": -Infinity}',
        b"[" * 100_000,
        b"[" * 1_100 + b"]" * 1_100,
        deep(120),
        deep(126),
        deep(127),
        deep(1_000),
        deep(1_030),
        json.dumps(chat_request("big", "x"))
        .encode()
        .replace(b'"max_tokens": 4', b'"max_tokens": ' + b"9" * 4400),
        json.dumps(chat_request("big", "x")).encode().replace(b'"max_tokens": 4', b'"max_tokens": 1e400'),
        json.dumps(infer_request("big", [1]))
        .encode()
        .replace(b'"data": [1]', b'"data": [' + b"7" * 30 + b"]"),
        b'{"custom_id": "ctl\x01", "method": "POST"}',  # a raw control character inside a string
        UTF8_BOM + json.dumps(chat_request("bom", "x")).encode(),  # a BOM that does not start the file
        b'\xff\xfe{\x00"\x00',  # UTF-16
        "{\u2028}".encode(),  # U+2028 does not split lines
    ]
)
# Lines a validator of each endpoint accepts, so that files mix requests with the hostile lines.
VALID = {
    CHAT: st.builds(chat_request, TEXT.filter(bool), TEXT).map(lambda r: render(r, True)),
    INFER: st.builds(
        infer_request, TEXT.filter(bool), st.lists(st.integers(0, 49151), min_size=1, max_size=4)
    ).map(lambda r: render(r, True)),
}
OTHER = st.one_of(
    st.builds(render, st.one_of(REQUESTS, MUTATED, VALUES), st.booleans()), HOSTILE, st.binary(max_size=40)
)


@st.composite
def files(draw: st.DrawFn, endpoint: str) -> tuple[bytes, list[int], int]:
    """A file of valid and hostile lines, where to cut it into chunks, and the line limit."""
    separator = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = separator.join(draw(st.lists(st.one_of(VALID[endpoint], OTHER), max_size=10)))
    data = (UTF8_BOM if draw(st.booleans()) else b"") + data + (separator if draw(st.booleans()) else b"")
    cuts = sorted(set(draw(st.lists(st.integers(0, max(0, len(data) - 1)), max_size=4))))
    return data, cuts, draw(st.sampled_from([64, 4096, 1024 * 1024, 1024 * 1024]))


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


def expected_line_count(data: bytes) -> int:
    if data in (b"", UTF8_BOM):
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def account_for_every_line(
    data: bytes,
    cuts: list[int],
    limit: int,
    endpoint: str,
) -> tuple[list[RequestLine], list[LineError]]:
    """Feed the file line by line, checking each line's outcome; the requests and the lines' errors."""
    validator = FileValidator(
        endpoint,
        lambda model: model == MODEL,
        max_requests=10**6,
        max_file_bytes=10**9,
        max_line_bytes=limit,
        max_errors=10**6,
    )
    lines = iter_physical_lines(chunks(data, cuts), limit)
    numbers: list[int] = []
    requests: list[RequestLine] = []
    not_utf8 = False
    for line in lines:
        numbers.append(line.number)
        seen = len(validator.errors)
        request = validator.feed(line)
        new = validator.errors[seen:]
        if not_utf8 or (not line.too_long and not line.data.strip(b" \t\r")):
            assert (request, new) == (None, []), (
                f"line {line.number} ({line.data[:40]!r}) is blank or skipped"
            )
        elif request is not None:
            assert (request.line, new) == (line.number, []), f"line {line.number}: a request and errors"
            assert (type(request.custom_id), request.method, type(request.body), request.model) == (
                str,
                "POST",
                dict,
                MODEL,
            )
            assert request.url == (CHAT if endpoint == CHAT else INFER_URL) and request.custom_id
            requests.append(request)
        else:
            assert new, f"line {line.number} ({line.data[:40]!r}) gave neither a request nor an error"
            assert {error.line for error in new} == {line.number}, new
            assert all(error.message for error in new)
            # A UTF-16/32 file or a JSON array file is one error; the lines after it are not examined.
            not_utf8 = (
                new[0].code == ErrorCode.INVALID_ENCODING and "the file is not UTF-8" in new[0].message
            ) or "starts a JSON array: this must be JSON Lines" in new[0].message
    found = list(validator.errors)
    validator.finish(lines.bytes_read)
    assert numbers == list(range(1, expected_line_count(data) + 1))
    assert lines.bytes_read == len(data)
    assert validator.error_count == len(validator.errors)
    assert validator.request_count == len(requests) + len({e.line for e in found})
    # `finish` adds `empty_file` to a file of blank lines only (no request, no line error), else nothing.
    file_errors = [] if requests or found else [ErrorCode.EMPTY_FILE]
    assert [e.code for e in validator.errors[len(found) :]] == file_errors
    return requests, found


def same_through_validate_stream(
    data: bytes,
    cuts: list[int],
    limit: int,
    endpoint: str,
    requests: list[RequestLine],
    errors: list[LineError],
) -> None:
    """`validate_stream` (what prepare runs) finds the same requests and errors, plus `finish`'s."""
    validator = FileValidator(
        endpoint,
        lambda model: model == MODEL,
        max_requests=10**6,
        max_file_bytes=10**9,
        max_line_bytes=limit,
        max_errors=10**6,
    )
    assert list(validator.validate_stream(chunks(data, cuts))) == requests
    file_errors = [] if requests or errors else [ErrorCode.EMPTY_FILE]
    assert validator.errors[: len(errors)] == errors
    assert [e.code for e in validator.errors[len(errors) :]] == file_errors


@FUZZ
@given(files(CHAT))
def test_chat_files_account_for_every_line(file: tuple[bytes, list[int], int]) -> None:
    data, cuts, limit = file
    requests, errors = account_for_every_line(data, cuts, limit, CHAT)
    same_through_validate_stream(data, cuts, limit, CHAT, requests, errors)


@FUZZ
@given(files(INFER))
def test_token_files_account_for_every_line(file: tuple[bytes, list[int], int]) -> None:
    data, cuts, limit = file
    requests, errors = account_for_every_line(data, cuts, limit, INFER)
    same_through_validate_stream(data, cuts, limit, INFER, requests, errors)


@settings(FUZZ, max_examples=300)
@given(st.binary(max_size=300), st.lists(st.integers(0, 299), max_size=4), st.sampled_from([8, 4096]))
def test_random_bytes_account_for_every_line(data: bytes, cuts: list[int], limit: int) -> None:
    cuts = sorted({cut for cut in cuts if cut < len(data)})
    for endpoint in (CHAT, INFER):
        requests, errors = account_for_every_line(data, cuts, limit, endpoint)
        assert requests == []
        same_through_validate_stream(data, cuts, limit, endpoint, requests, errors)


def test_the_deep_lines_are_refused_at_the_nesting_limit() -> None:
    # The hostile lines above straddle the limit (128 levels; the envelope and body are 2 of them).
    data = b"\n".join([deep(126), deep(127), deep(1_000), deep(1_030)])
    requests, errors = account_for_every_line(data, [], 1024 * 1024, CHAT)
    assert [r.line for r in requests] == [1]
    assert [(e.code, e.line, e.message) for e in errors] == [
        (
            ErrorCode.INVALID_JSON_LINE,
            n,
            f"Line {n} is not valid JSON: it is nested too deeply (more than 128 levels).",
        )
        for n in (2, 3, 4)
    ]
