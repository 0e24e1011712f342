"""Hostile input through the local stack: each request gets a clear 4xx and nothing else changes.

"Nothing changes" is checked on the whole state after each request: every item of the batch table,
every object (and ETag) of the data bucket, and the dead-letter queues, read once the pipeline is
idle. /v1 answers in the OpenAI error envelope, /v2 with `{"error": "..."}`; what the gateway itself
refuses (a body over its quota, a Content-Length that is not a number) is API Gateway's
`{"message": ...}`, before any function runs. Path tricks in file names are labels, never keys: they
are kept verbatim and stored under `files/<id>`; path tricks in inbox keys run as batches whose
results land under the exact `outbox/` path.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

from batchinfer_local import LocalStack
from support.api_stack import (
    MODEL,
    SCRIPTED,
    HoldableUpstream,
    api_client,
    chat_line,
    create,
    jsonl,
    new_account,
    result_lines,
    stack_with_upstream,
    upload,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)

JSON = {"Content-Type": "application/json"}
LINE = jsonl(chat_line("a", "hello", model=SCRIPTED))
INFER = f"/v2/models/{MODEL}/infer"


@dataclass
class Env:
    stack: LocalStack
    upstream: HoldableUpstream
    http: httpx.Client  # <base>/v1 with the key of account "hostile"
    key: str
    file_id: str  # a valid input file of that account


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with stack_with_upstream(tmp_path_factory.mktemp("hostile")) as (stack, upstream):
        key = new_account("hostile", max_active_batches=100, max_creates_per_minute=100)
        with api_client(stack, key) as client:
            yield Env(stack, upstream, client, key, upload(client, LINE))


def state(stack: LocalStack) -> dict[str, Any]:
    """Everything a request could have changed, once the pipeline is idle."""
    stack.wait_idle()
    dynamodb, s3, sqs = stack.client("dynamodb"), stack.client("s3"), stack.client("sqs")
    items = [
        json.dumps(item, sort_keys=True)
        for page in dynamodb.get_paginator("scan").paginate(
            TableName=stack.tables["BatchTable"], ConsistentRead=True
        )
        for item in page["Items"]
    ]
    objects = [
        (obj["Key"], obj["ETag"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=stack.buckets["DataBucket"])
        for obj in page.get("Contents", [])
    ]
    dead = {
        name: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
            "Attributes"
        ]["ApproximateNumberOfMessages"]
        for name, url in stack.queue_urls.items()
        if name.endswith("DeadLetterQueue")
    }
    assert sorted(dead) == [
        "FinalizeDeadLetterQueue",
        "PrepareDeadLetterQueue",
        "ShardsDeadLetterQueue",
        "StatusEventsDeadLetterQueue",
        "UploadsDeadLetterQueue",
        "WebhookDeadLetterQueue",
    ]
    return {"items": sorted(items), "objects": sorted(objects), "dead letters": dead}


def envelope(message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def multipart(filename: bytes, content: bytes = LINE) -> dict[str, Any]:
    """A POST /v1/files body whose file part has exactly `filename` (raw bytes, as a client sends them)."""
    body = (
        b'--BOUNDARY\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--BOUNDARY\r\nContent-Disposition: form-data; name="file"; filename="' + filename + b'"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + content + b"\r\n--BOUNDARY--\r\n"
    )
    return {"content": body, "headers": {"Content-Type": "multipart/form-data; boundary=BOUNDARY"}}


def batch_body(file_id: str, extra: str = "") -> str:
    return f'{{"input_file_id": "{file_id}", "endpoint": "/v1/chat/completions"{extra}}}'


# (name, method, path under /v1, request arguments given (file id, key), status, answer given the key)
Case = tuple[str, str, str, Callable[[str, str], dict[str, Any]], int, Callable[[str], dict[str, Any]]]


def same(answer: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
    return lambda key: answer


TOO_DEEP = "request body is not valid JSON: the body is nested too deeply (more than 128 levels)"
SURROGATE = "Input should be a valid string, unable to parse raw data as a unicode string"
NO_KEY = "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
NO_BEARER = (
    "The Authorization header has no 'Bearer' scheme: send the key as 'Authorization: Bearer YOUR_KEY'."
)
IDEMPOTENCY = envelope(
    "Idempotency-Key must be 1 to 255 printable characters", "invalid_idempotency_key", "Idempotency-Key"
)
CONTROL_IN_NAME = "the file name must not contain control characters (U+0000 to U+001F, U+007F)"
V1_CASES: list[Case] = [
    # Deeply nested JSON: refused before it is walked (it used to exhaust the recursion limit: a 500).
    (
        "nested 100,000 deep",
        "POST",
        "/batches",
        lambda f, k: {"content": "[" * 100_000 + "]" * 100_000, "headers": JSON},
        400,
        same(envelope(TOO_DEEP, "invalid_json")),
    ),
    (
        "metadata nested 129 deep",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f, ', "metadata": ' + "[" * 128 + "]" * 128), "headers": JSON},
        400,
        same(envelope(TOO_DEEP, "invalid_json")),
    ),
    # Huge numbers, NaN, Infinity
    (
        "integer of 5,000 digits",
        "POST",
        "/uploads",
        lambda f, k: {
            "content": '{"filename": "a.jsonl", "purpose": "batch", "bytes": ' + "9" * 5000 + "}",
            "headers": JSON,
        },
        400,
        same(envelope("request body is not valid JSON: a number has more than 4300 digits", "invalid_json")),
    ),
    (
        "integer of 31 digits",
        "POST",
        "/uploads",
        lambda f, k: {"json": {"filename": "a.jsonl", "purpose": "batch", "bytes": 10**30}},
        400,
        same(
            envelope(
                f"bytes: {10**30} is over the 209715200-byte limit of a batch file", "file_too_large", "bytes"
            )
        ),
    ),
    (
        "1e400",
        "POST",
        "/uploads",
        lambda f, k: {
            "content": '{"filename": "a.jsonl", "purpose": "batch", "bytes": 1e400}',
            "headers": JSON,
        },
        400,
        same(
            envelope(
                "request body is not valid JSON: the number 1e400 is beyond the range of a double (it would "
                "be infinity)",
                "invalid_json",
            )
        ),
    ),
    (
        "NaN",
        "POST",
        "/uploads",
        lambda f, k: {
            "content": '{"filename": "a.jsonl", "purpose": "batch", "bytes": NaN}',
            "headers": JSON,
        },
        400,
        same(envelope("request body is not valid JSON: NaN is not a JSON number", "invalid_json")),
    ),
    (
        "-Infinity",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f, ', "metadata": {"k": -Infinity}'), "headers": JSON},
        400,
        same(envelope("request body is not valid JSON: -Infinity is not a JSON number", "invalid_json")),
    ),
    # Lone surrogates: no storage takes them (in metadata they used to reach DynamoDB: a 500)
    (
        "lone surrogate in input_file_id",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body("file-\\ud800"), "headers": JSON},
        400,
        same(envelope(f"input_file_id: {SURROGATE}", "invalid_request", "input_file_id")),
    ),
    (
        "lone surrogate in name",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f, ', "name": "\\udc00"'), "headers": JSON},
        400,
        same(envelope(f"name: {SURROGATE}", "invalid_request", "name")),
    ),
    (
        "lone surrogate in a metadata key",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f, ', "metadata": {"\\ud800": "v"}'), "headers": JSON},
        400,
        same(
            envelope(
                "metadata: Value error, metadata keys and values must be Unicode text (no lone surrogates, "
                "such as \\ud800)",
                "invalid_request",
                "metadata",
            )
        ),
    ),
    (
        "lone surrogate in a metadata value",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f, ', "metadata": {"k": "\\udfff"}'), "headers": JSON},
        400,
        same(
            envelope(
                "metadata: Value error, metadata keys and values must be Unicode text (no lone surrogates, "
                "such as \\ud800)",
                "invalid_request",
                "metadata",
            )
        ),
    ),
    # An empty metadata key was stored, and every later read of the batch failed (a 500, a stuck batch)
    (
        "empty metadata key",
        "POST",
        "/batches",
        lambda f, k: {
            "json": {"input_file_id": f, "endpoint": "/v1/chat/completions", "metadata": {"": "v"}}
        },
        400,
        same(
            envelope("metadata: Value error, metadata keys must not be empty", "invalid_request", "metadata")
        ),
    ),
    (
        "lone surrogate in an upload's filename",
        "POST",
        "/uploads",
        lambda f, k: {
            "content": '{"filename": "\\ud800.jsonl", "purpose": "batch", "bytes": 3}',
            "headers": JSON,
        },
        400,
        same(envelope(f"filename: {SURROGATE}", "invalid_request", "filename")),
    ),
    # Control characters
    (
        "raw control character in JSON",
        "POST",
        "/batches",
        lambda f, k: {"content": b'{"input_file_id": "file-\x01"}', "headers": JSON},
        400,
        same(
            envelope(
                "request body is not valid JSON: Invalid control character at: line 1 column 25 (char 24)",
                "invalid_json",
            )
        ),
    ),
    (
        "CR LF and NUL in an upload's filename",
        "POST",
        "/uploads",
        lambda f, k: {"json": {"filename": "a\r\nX-Evil: 1\u0000.jsonl", "purpose": "batch", "bytes": 3}},
        400,
        same(envelope(f"filename: Value error, {CONTROL_IN_NAME}", "invalid_request", "filename")),
    ),
    (
        "NUL in a file's name",
        "POST",
        "/files",
        lambda f, k: multipart(b"a\x00b.jsonl"),
        400,
        same(envelope(f"file: {CONTROL_IN_NAME}", "invalid_filename", "file")),
    ),
    (
        "ANSI escape in a file's name",
        "POST",
        "/files",
        lambda f, k: multipart(b"\x1b[31mred.jsonl"),
        400,
        same(envelope(f"file: {CONTROL_IN_NAME}", "invalid_filename", "file")),
    ),
    (
        "file name that is not UTF-8",
        "POST",
        "/files",
        lambda f, k: multipart(b"\xff.jsonl"),
        400,
        same(envelope("the request could not be read: it is not valid UTF-8", "invalid_request")),
    ),
    (
        "body that is not UTF-8",
        "POST",
        "/batches",
        lambda f, k: {"content": b'{"input_file_id": "\xff"}', "headers": JSON},
        400,
        same(envelope("the request could not be read: it is not valid UTF-8", "invalid_request")),
    ),
    # Oversized bodies and fields
    (
        "input_file_id of 3 MB",
        "POST",
        "/batches",
        lambda f, k: {"json": {"input_file_id": "x" * 3_000_000, "endpoint": "/v1/chat/completions"}},
        400,
        same(
            envelope(
                "input_file_id: String should have at most 2048 characters",
                "invalid_request",
                "input_file_id",
            )
        ),
    ),
    (
        "metadata of 17 pairs",
        "POST",
        "/batches",
        lambda f, k: {
            "json": {
                "input_file_id": f,
                "endpoint": "/v1/chat/completions",
                "metadata": {f"k{n}": "v" for n in range(17)},
            }
        },
        400,
        same(
            envelope(
                "metadata: Value error, metadata may have at most 16 key-value pairs",
                "invalid_request",
                "metadata",
            )
        ),
    ),
    (
        "file id of 129 characters",
        "GET",
        "/files/" + "f" * 129,
        lambda f, k: {},
        400,
        same(envelope("file_id: String should have at most 128 characters", "invalid_request", "file_id")),
    ),
    (
        "after of 129 characters",
        "GET",
        "/batches?after=" + "b" * 129,
        lambda f, k: {},
        400,
        same(envelope("after: String should have at most 128 characters", "invalid_request", "after")),
    ),
    # Query values of the wrong type
    (
        "limit=abc",
        "GET",
        "/batches?limit=abc",
        lambda f, k: {},
        400,
        same(
            envelope(
                "limit: Input should be a valid integer, unable to parse string as an integer",
                "invalid_request",
                "limit",
            )
        ),
    ),
    (
        "limit=NaN",
        "GET",
        "/batches?limit=NaN",
        lambda f, k: {},
        400,
        same(
            envelope(
                "limit: Input should be a valid integer, unable to parse string as an integer",
                "invalid_request",
                "limit",
            )
        ),
    ),
    (
        "limit of 400 digits",
        "GET",
        "/batches?limit=" + "9" * 400,
        lambda f, k: {},
        400,
        same(envelope("limit: Input should be less than or equal to 100", "invalid_request", "limit")),
    ),
    # Authorization of the wrong type
    (
        "Authorization without Bearer",
        "GET",
        "/batches",
        lambda f, k: {"headers": {"Authorization": k}},
        401,
        same(envelope(NO_BEARER, "missing_api_key")),
    ),
    (
        "Authorization: Basic",
        "GET",
        "/batches",
        lambda f, k: {"headers": {"Authorization": "Basic dXNlcjpwYXNz"}},
        401,
        same(envelope(NO_BEARER, "missing_api_key")),
    ),
    (
        "Authorization: Bearer and no key",
        "GET",
        "/batches",
        lambda f, k: {"headers": {"Authorization": "Bearer"}},
        401,
        same(envelope(NO_KEY, "missing_api_key")),
    ),
    (
        "unknown key",
        "GET",
        "/batches",
        lambda f, k: {"headers": {"Authorization": "Bearer sk-bi-unknownunknownunknown0123"}},
        401,
        same(envelope("Incorrect API key provided: sk-bi-...0123.", "invalid_api_key")),
    ),
    (
        "two Authorization headers",
        "GET",
        "/batches",
        lambda f, k: {"headers": [("Authorization", f"Bearer {k}"), ("Authorization", f"Bearer {k}")]},
        401,
        lambda k: envelope(f"Incorrect API key provided: {k[:6]}...{k[-4:]}.", "invalid_api_key"),
    ),
    (
        "a bad key before a bad body",
        "POST",
        "/batches",
        lambda f, k: {"content": "[" * 1000, "headers": {**JSON, "Authorization": "Bearer x"}},
        401,
        same(envelope("Incorrect API key provided: ***.", "invalid_api_key")),
    ),
    # Content-Type of the wrong kind
    (
        "text/plain body",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f), "headers": {"Content-Type": "text/plain"}},
        400,
        same(
            envelope(
                "Unsupported Content-Type 'text/plain': send application/json (or multipart/form-data to "
                "/v1/files).",
                "unsupported_content_type",
            )
        ),
    ),
    (
        "JSON to /files",
        "POST",
        "/files",
        lambda f, k: {"json": {"purpose": "batch"}},
        400,
        same(envelope("file: Field required", "invalid_request", "file")),
    ),
    (
        "multipart without a boundary",
        "POST",
        "/files",
        lambda f, k: {"content": b"--x\r\n", "headers": {"Content-Type": "multipart/form-data"}},
        400,
        same(
            envelope(
                "the request could not be read: Missing boundary in multipart/form-data content-type header",
                "invalid_request",
            )
        ),
    ),
    # Idempotency-Key of the wrong shape (with a valid body: only the header is wrong)
    (
        "Idempotency-Key of 256 characters",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f), "headers": {**JSON, "Idempotency-Key": "k" * 256}},
        400,
        same(IDEMPOTENCY),
    ),
    (
        "empty Idempotency-Key",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f), "headers": {**JSON, "Idempotency-Key": ""}},
        400,
        same(IDEMPOTENCY),
    ),
    (
        "Idempotency-Key with a tab",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f), "headers": {**JSON, "Idempotency-Key": "a\tb"}},
        400,
        same(IDEMPOTENCY),
    ),
    (
        "Idempotency-Key with DEL",
        "POST",
        "/batches",
        lambda f, k: {"content": batch_body(f), "headers": {**JSON, "Idempotency-Key": b"a\x7fb"}},
        400,
        same(IDEMPOTENCY),
    ),
    # Path tricks in ids: an id is matched whole, never resolved as a path
    (
        "../ encoded in a batch id",
        "GET",
        "/batches/..%2F..%2Fbatches",
        lambda f, k: {},
        404,
        same(envelope("No batch found with id '..%2F..%2Fbatches'.", "batch_not_found", "batch_id")),
    ),
    (
        "encoded dot segment as a file id",
        "GET",
        "/files/%2E%2E/content",
        lambda f, k: {},
        404,
        same(envelope("No such File object: %2E%2E", "file_not_found", "file_id")),
    ),
    (
        "unicode file id",
        "DELETE",
        "/files/f%C3%AFle-%E2%98%83",
        lambda f, k: {},
        404,
        same(envelope("No such File object: f%C3%AFle-%E2%98%83", "file_not_found", "file_id")),
    ),
    (
        "TokenHub path with ../",
        "POST",
        "/batches",
        lambda f, k: {"json": {"input_source": "user_s3", "input_file_id": "s3://../etc/passwd.jsonl"}},
        400,
        same(envelope("input_file_id: '..' is not a valid bucket name", "invalid_path", "input_file_id")),
    ),
]


@pytest.mark.parametrize("case", V1_CASES, ids=[case[0] for case in V1_CASES])
def test_hostile_v1_request_is_a_clear_4xx_and_changes_nothing(env: Env, case: Case) -> None:
    _, method, path, arguments, status, answer = case
    before = state(env.stack)

    response = env.http.request(method, path, **arguments(env.file_id, env.key))

    assert (response.status_code, response.headers["content-type"], response.json()) == (
        status,
        "application/json",
        answer(env.key),
    )
    assert state(env.stack) == before


# The local gateway's 413 is in the OpenAI envelope, pointing to /v1/uploads (API Gateway itself
# answers {"message": "Request Entity Too Large"}).
TOO_LARGE = {
    "error": {
        "message": "Request Entity Too Large: a request carries at most 10 MB (6 MB once in the function's "
        "event); send large files through /v1/uploads (create an Upload, PUT the bytes to its upload_url, "
        "then complete it).",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }
}
GATEWAY_CASES = [
    # What API Gateway refuses before any function runs (the local stack's gateway does the same).
    ("body over the 10 MB quota", b"x" * (10 * 1024 * 1024 + 1), 413, TOO_LARGE),
    ("event over Lambda's 6 MB", b"x" * (7 * 1024 * 1024), 413, TOO_LARGE),
]


@pytest.mark.parametrize("name, body, status, answer", GATEWAY_CASES, ids=[c[0] for c in GATEWAY_CASES])
def test_oversized_bodies_are_refused_by_the_gateway(
    env: Env, name: str, body: bytes, status: int, answer: dict[str, Any]
) -> None:
    before = state(env.stack)

    response = env.http.post("/batches", content=body, headers=JSON)

    assert (response.status_code, response.json()) == (status, answer)
    assert state(env.stack) == before


def raw_request(base_url: str, data: bytes) -> tuple[int, str | None, bytes]:
    """Send `data` as is (a client library would refuse to) and read one response."""
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.getheader("Connection"), response.read()


@pytest.mark.parametrize(
    "header",
    [
        b"Content-Length: abc",
        b"Content-Length: -5",
        b"Content-Length: 0x10",
        b"Content-Length: 2\r\nContent-Length: 40",
        b"Transfer-Encoding: chunked",
    ],
    ids=lambda h: h.decode(),
)
def test_framing_headers_that_are_not_numbers_are_a_400_and_close_the_connection(
    env: Env, header: bytes
) -> None:
    before = state(env.stack)
    body = batch_body(env.file_id).encode()
    # The bytes after the headers, which a lenient server would take as a request: a chunk size that is
    # not hexadecimal for the chunked case, else a whole second request.
    rest = (
        b"zz\r\n" + body + b"\r\n0\r\n\r\n"
        if b"chunked" in header
        else (
            b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
    )
    request = (
        b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + env.key.encode()
        + b"\r\nContent-Type: application/json\r\n"
        + header
        + b"\r\n\r\n"
        + rest
    )

    status, connection, answer = raw_request(env.stack.base_url, request)

    assert (status, connection, json.loads(answer)) == (400, "close", {"message": "Bad Request"})
    assert state(env.stack) == before


RAW_PATHS = [
    # Sent as is (clients would resolve the dot segments first): a path is matched, never resolved.
    ("/v1/files/../batches", envelope("no route for GET /v1/files/../batches", "not_found")),
    ("/v1/batches/../../v1/files", envelope("no route for GET /v1/batches/../../v1/files", "not_found")),
    ("/v1/files/..", envelope("No such File object: ..", "file_not_found", "file_id")),
    (
        "/v1/files/a%0d%0aX-Evil:%201",
        envelope("No such File object: a%0d%0aX-Evil:%201", "file_not_found", "file_id"),
    ),
    ("/v1/files/%00/content", envelope("No such File object: %00", "file_not_found", "file_id")),
]


@pytest.mark.parametrize("path, answer", RAW_PATHS, ids=[p for p, _ in RAW_PATHS])
def test_dot_segments_and_encoded_controls_in_paths_are_a_404(
    env: Env, path: str, answer: dict[str, Any]
) -> None:
    before = state(env.stack)

    status, _, body = raw_request(
        env.stack.base_url,
        f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        f"{env.key}\r\nConnection: close\r\n\r\n".encode(),
    )

    assert (status, json.loads(body)) == (404, answer)
    assert state(env.stack) == before


def v2_body(**parameters: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "input0", "shape": [1, 3], "datatype": "UINT32", "data": [5, 6, 7]}],
        "outputs": [{"name": "output0"}],
        "parameters": parameters,
    }


V2_TOO_DEEP = {"error": "the request body is nested too deeply (more than 128 levels)"}
V2_CASES = [
    ("nested 100,000 deep", {"content": "[" * 100_000 + "]" * 100_000, "headers": JSON}, V2_TOO_DEEP),
    (
        "parameters nested 129 deep",
        {
            "content": json.dumps(v2_body(details=0)).replace("0}", "[" * 127 + "]" * 127 + "}"),
            "headers": JSON,
        },
        V2_TOO_DEEP,
    ),
    (
        "integer of 5,000 digits",
        {
            "content": json.dumps(v2_body(seed=0)).replace('"seed": 0', '"seed": ' + "7" * 5000),
            "headers": JSON,
        },
        {"error": "the request body is not valid JSON: a number has more than 4300 digits"},
    ),
    (
        "body that is not UTF-8",
        {"content": b'{"id": "\xff"}', "headers": JSON},
        {
            "error": "the request body is not valid JSON: 'utf-8' codec can't decode byte 0xff in position "
            "8: invalid start byte"
        },
    ),
    (
        "binary body",
        {"content": b"\x00\x01\x02", "headers": {"Content-Type": "application/octet-stream"}},
        {"error": "the request body is not valid JSON: Expecting value: line 1 column 1 (char 0)"},
    ),
    (
        "lone surrogate in the id",
        {"content": '{"id": "\\ud800", "inputs": [], "outputs": []}', "headers": JSON},
        {
            "error": "id must be a string of 1 to 256 characters, each one of A-Z, a-z, 0-9, '_' and '-', "
            'got string "\\ud800"'
        },
    ),
    (
        "raw control character",
        {"content": b'{"id": "a\x07"}', "headers": JSON},
        {
            "error": "the request body is not valid JSON: Invalid control character at: line 1 column 10 "
            "(char 9)"
        },
    ),
]


@pytest.mark.parametrize("name, arguments, answer", V2_CASES, ids=[c[0] for c in V2_CASES])
def test_hostile_v2_request_is_a_400_with_an_error_string(
    env: Env, name: str, arguments: dict[str, Any], answer: dict[str, str]
) -> None:
    before = state(env.stack)

    headers = {**arguments.get("headers", {}), "Authorization": f"Bearer {env.key}"}
    response = httpx.post(f"{env.stack.base_url}{INFER}", timeout=60, **{**arguments, "headers": headers})

    assert (response.status_code, response.headers["content-type"], response.json()) == (
        400,
        "application/json",
        answer,
    )
    assert state(env.stack) == before


def test_valid_requests_still_work_afterwards(env: Env) -> None:
    created = create(env.http, env.file_id, metadata={"k": "v"}, name="after the hostile ones")
    assert created.status_code == 200, created.text
    batch = wait_for(env.http, created.json()["id"], timeout=60)
    assert (batch["status"], batch["request_counts"]) == (
        "completed",
        {"total": 1, "completed": 1, "failed": 0},
    )
    assert [
        line["response"]["body"]["choices"][0]["message"]["content"]
        for line in result_lines(env.http, batch["output_file_id"])
    ] == ["echo: hello"]
    response = httpx.post(
        f"{env.stack.base_url}{INFER}",
        json=v2_body(max_new_tokens=1),
        headers={"Authorization": f"Bearer {env.key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [1, 1]


NAMES = [
    "../../etc/passwd",
    "..",
    "/abs/path.jsonl",
    "a%2Fb.jsonl",
    "a+b c.jsonl",
    "C:\\dir\\x.jsonl",
    "日本語 ☃ é.jsonl",
    "e\u0301.jsonl",
    "semi;colon=1.jsonl",
    "x" * 255,
]


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_path_tricks_in_file_names_are_kept_verbatim_and_never_become_keys(env: Env, name: str) -> None:
    before = state(env.stack)

    response = env.http.post("/files", **multipart(name.encode()))

    assert response.status_code == 200, response.text
    file = response.json()
    assert (file["filename"], file["bytes"]) == (name, len(LINE))
    after = state(env.stack)
    etag = env.stack.client("s3").head_object(
        Bucket=env.stack.buckets["DataBucket"], Key=f"files/{file['id']}"
    )["ETag"]
    assert sorted(set(after["objects"]) - set(before["objects"])) == [(f"files/{file['id']}", etag)]
    assert set(before["objects"]) <= set(after["objects"])
    assert env.http.get(f"/files/{file['id']}").json()["filename"] == name
    assert env.http.get(f"/files/{file['id']}/content").content == LINE


def test_a_large_file_downloads_under_its_exact_name_whatever_it_holds(env: Env) -> None:
    # Files over 4 MB are served by a presigned S3 URL whose Content-Disposition names the file: a
    # name with a quote used to rewrite it ('a"; filename="evil.exe' -> evil.exe) and a non-Latin-1
    # name made the download fail. RFC 6266: an ASCII fallback, and the exact name in filename*.
    name = 'résumé "☃" ../x; filename="evil.exe'
    size = 4 * 1024 * 1024 + 1
    created = env.http.post("/uploads", json={"filename": name, "purpose": "batch", "bytes": size})
    assert created.status_code == 200, created.text
    put = httpx.put(
        created.json()["upload_url"], content=b"x" * size, headers=created.json()["upload_headers"]
    )
    assert put.status_code == 200
    done = env.http.post(f"/uploads/{created.json()['id']}/complete", json={})
    assert done.status_code == 200, done.text
    file_id = done.json()["file"]["id"]

    redirect = env.http.get(f"/files/{file_id}/content")
    download = httpx.get(redirect.headers["location"], timeout=60)

    assert (redirect.status_code, download.status_code, len(download.content)) == (302, 200, size)
    assert download.headers["content-disposition"] == (
        'attachment; filename="r_sum_ ___ .._x; filename=_evil.exe"; '
        f"filename*=UTF-8''{quote(name, safe='')}"
    )


INBOX_KEYS = [
    "inbox/../escape.jsonl",
    "inbox/./dot.jsonl",
    "inbox//double-slash.jsonl",
    "inbox/a%2Fb.jsonl",
    "inbox/100%.jsonl",
    "inbox/a+b c.jsonl",
    "inbox/q?x=1&y#z.jsonl",
    "inbox/日本語/☃ ü.jsonl",
    "inbox/caf\u00e9.jsonl",
    "inbox/cafe\u0301.jsonl",  # the same name decomposed (NFD): another key, another batch
]


def test_inbox_keys_with_path_tricks_run_and_write_their_results_under_the_exact_outbox_path(
    env: Env,
) -> None:
    stack, bucket, s3 = env.stack, env.stack.buckets["DataBucket"], env.stack.client("s3")
    before = {key for key, _ in state(stack)["objects"]}
    for n, key in enumerate(INBOX_KEYS):
        s3.put_object(Bucket=bucket, Key=key, Body=jsonl(chat_line(f"line-{n}", f"key {n}", model=SCRIPTED)))
    stack.wait_idle()

    with api_client(stack, stack.api_key) as dev:  # inbox batches belong to the dev key's account
        batches = {b["input_file_id"]: b for b in dev.get("/batches", params={"limit": 100}).json()["data"]}
    for n, key in enumerate(INBOX_KEYS):
        batch = batches[f"s3://{bucket}/{key}"]
        assert (batch["status"], batch["request_counts"]) == (
            "completed",
            {"total": 1, "completed": 1, "failed": 0},
        )
        prefix = "outbox/" + key.removeprefix("inbox/").removesuffix(".jsonl") + "/"
        output = s3.get_object(Bucket=bucket, Key=f"{prefix}output.jsonl")["Body"].read()
        [line] = [json.loads(text) for text in output.splitlines()]
        assert (line["custom_id"], line["response"]["body"]["choices"][0]["message"]["content"]) == (
            f"line-{n}",
            f"echo: key {n}",
        )
    new = {key for key, _ in state(stack)["objects"]} - before
    outbox = {key for key in new if key.startswith("outbox/")}
    assert {key for key in new if key.startswith("inbox/")} == set(INBOX_KEYS)
    assert outbox == {
        "outbox/" + key.removeprefix("inbox/").removesuffix(".jsonl") + "/output.jsonl" for key in INBOX_KEYS
    }  # no error.jsonl: no line failed
