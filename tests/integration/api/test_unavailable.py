"""The API function when AWS sheds load past botocore's retries (api/app.py, api/errors.py): a 503 in the
OpenAI envelope with `Retry-After`, never a 500; a plain bug stays a 500; a create whose failed call
took effect anyway answers the object it stored, so the caller's retry makes no second one.

Faults are answers injected at `before-send`, as `core.chaos` injects them, on the calls a test names
(nothing reaches moto); botocore's backoff is zeroed, its attempts are not.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import httpx2
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.retries.standard import ExponentialBackoff
from openai import OpenAI

from batchinfer.core import aws
from batchinfer.core.chaos import _Raw
from batchinfer.data import accounts, batches, files, keys
from batchinfer.data.table import handle
from batchinfer_local.functions import HttpApiEventSpec
from batchinfer_local.http import HttpApiServer, Route, Router
from support.moto_env import Aws, load_event

KEY = "sk-bi-sample-key-for-sam-local-invoke"  # the key of the sample API events
ATTEMPTS = 6  # botocore's standard mode as `core.aws` configures it: the call and its 5 retries
UNAVAILABLE = {
    "error": {
        "message": "The service is temporarily unavailable (its storage is shedding load); "
        "retry the request.",
        "type": "server_error",
        "param": None,
        "code": "service_unavailable",
    }
}
DYNAMODB_THROTTLE = (
    400,
    {"Content-Type": "application/x-amz-json-1.0"},
    b'{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",'
    b'"message":"Rate of requests exceeds the allowed throughput. arn:aws:dynamodb:us-east-1:1:table/T"}',
)
S3_SLOW_DOWN = (
    503,
    {"Content-Type": "application/xml"},
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
)
SQS_THROTTLE = (
    400,
    {"Content-Type": "application/x-amz-json-1.0"},
    b'{"__type":"com.amazonaws.sqs#RequestThrottled","message":"Request is throttled."}',
)


@pytest.fixture
def api(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> Aws:
    accounts.create_key("default", secret=KEY)
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0)
    return moto_aws


def event(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> dict[str, Any]:
    """An HTTP API event of the sample key's account (built on the sample retrieve event)."""
    sample = load_event("api-retrieve-batch.json")
    sample["rawPath"] = sample["requestContext"]["http"]["path"] = path
    sample["requestContext"]["http"]["method"] = method
    sample["pathParameters"] = {"proxy": path.removeprefix("/v1/")}
    sample["headers"] = {**sample["headers"], **(headers or {})}
    if body:
        sample["body"], sample["isBase64Encoded"] = base64.b64encode(body).decode(), True
    return sample


def upload_event(data: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """POST /v1/files of `data` (multipart, as the `openai` SDK sends it)."""
    request = httpx.Request(
        "POST",
        "http://api/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", data, "application/jsonl")},
    )
    return event(
        "POST",
        "/v1/files",
        request.read(),
        {"content-type": request.headers["content-type"], **(headers or {})},
    )


def create_event(file_id: str) -> dict[str, Any]:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    return event("POST", "/v1/batches", json.dumps(body).encode(), {"content-type": "application/json"})


LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'


@pytest.fixture
def uploaded(api: Aws) -> str:
    response = api.invoke("ApiFunction", upload_event(LINE))
    assert response["statusCode"] == 200, response["body"]
    return json.loads(response["body"])["id"]


@pytest.fixture
def fail_calls() -> Iterator[Callable[..., list[str]]]:
    """`fail_calls(client, operation, answer, when=..., times=...)`: every attempt of `operation` on
    `client` (whose request body passes `when`), or the first `times` of them, is answered `answer`
    (status, headers, body); returns the list the failed attempts are logged to."""
    removals: list[Callable[[], None]] = []

    def install(
        client: Any,
        operation: str,
        answer: tuple[int, dict[str, str], bytes],
        when: Callable[[bytes], bool] = lambda body: True,
        times: int | None = None,
    ) -> list[str]:
        attempts: list[str] = []
        name = f"before-send.{client.meta.service_model.endpoint_prefix}.{operation}"

        def answer_with_fault(request: Any, **_: Any) -> AWSResponse | None:
            if isinstance(request.body, bytes | bytearray) and not when(bytes(request.body)):
                return None
            if times is not None and len(attempts) >= times:
                return None
            attempts.append(operation)
            # botocore calls every `before-send` handler: point the request where in-process moto does
            # not answer, or moto would run it although this answer is the one botocore sees.
            request.url = "https://fault.invalid/"
            status, headers, raw = answer
            return AWSResponse(request.url, status, headers, _Raw(raw))

        client.meta.events.register_first(name, answer_with_fault)
        removals.append(lambda: client.meta.events.unregister(name, answer_with_fault))
        return attempts

    yield install
    for remove in removals:
        remove()


def assert_unavailable(response: dict[str, Any]) -> None:
    assert (response["statusCode"], json.loads(response["body"])) == (503, UNAVAILABLE)
    assert response["headers"]["Retry-After"] == "1"  # `errors.UNAVAILABLE_RETRY_AFTER_S`


def header_count() -> int:
    items = handle().scan()["Items"]
    return sum(1 for item in items if item["PK"].startswith(keys.BATCH_PREFIX) and item["SK"] == keys.META)


def test_a_batch_read_throttled_past_its_retries_is_a_503(
    api: Aws, uploaded: str, fail_calls: Callable[..., list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    created = json.loads(api.invoke("ApiFunction", create_event(uploaded))["body"])
    attempts = fail_calls(
        aws.table().meta.client,
        "GetItem",
        DYNAMODB_THROTTLE,
        when=lambda body: created["id"].encode() in body,
    )

    response = api.invoke("ApiFunction", event("GET", f"/v1/batches/{created['id']}"))

    assert_unavailable(response)
    assert attempts == ["GetItem"] * ATTEMPTS  # botocore retried all it would
    assert "arn:aws" not in response["body"] and "throughput" not in response["body"]


def test_a_batch_create_throttled_past_its_retries_is_a_503_and_stores_nothing(
    api: Aws, uploaded: str, fail_calls: Callable[..., list[str]]
) -> None:
    attempts = fail_calls(aws.table().meta.client, "TransactWriteItems", DYNAMODB_THROTTLE)

    response = api.invoke("ApiFunction", create_event(uploaded))

    assert_unavailable(response)
    assert attempts == ["TransactWriteItems"] * ATTEMPTS
    assert header_count() == 0


def test_a_create_whose_prepare_message_is_throttled_answers_the_stored_batch(
    api: Aws, uploaded: str, fail_calls: Callable[..., list[str]]
) -> None:
    # The header is stored; only the prepare message fails: the batch exists, the sweeper re-sends it
    attempts = fail_calls(aws.client("sqs"), "SendMessageBatch", SQS_THROTTLE)

    response = api.invoke("ApiFunction", create_event(uploaded))

    assert response["statusCode"] == 200, response["body"]
    batch = json.loads(response["body"])
    assert (batch["status"], batch["input_file_id"]) == ("validating", uploaded)
    assert len(attempts) == ATTEMPTS
    assert header_count() == 1
    assert batches.get(batch["id"]) is not None


def test_a_create_whose_commit_took_effect_but_failed_answers_the_stored_batch(
    api: Aws, uploaded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The transaction committed, then its answer was a timeout: a 503 would make the retry a second batch
    real = batches.create_limited

    def committed_then_timed_out(*args: Any, **kwargs: Any) -> bool:
        real(*args, **kwargs)
        raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com/")

    monkeypatch.setattr(batches, "create_limited", committed_then_timed_out)

    response = api.invoke("ApiFunction", create_event(uploaded))

    assert response["statusCode"] == 200, response["body"]
    assert json.loads(response["body"])["status"] == "validating"
    assert header_count() == 1


def test_a_file_upload_slowed_down_past_its_retries_is_a_503_and_stores_nothing(
    api: Aws, fail_calls: Callable[..., list[str]]
) -> None:
    attempts = fail_calls(aws.client("s3"), "PutObject", S3_SLOW_DOWN)

    response = api.invoke("ApiFunction", upload_event(LINE))

    assert_unavailable(response)
    assert attempts == ["PutObject"] * ATTEMPTS
    assert files.page("default", limit=10)[0] == []


def test_a_file_record_stored_despite_its_failed_put_is_the_answer(
    api: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = files.put

    def stored_then_500(record: Any) -> None:
        real(record)
        raise ClientError(
            {"Error": {"Code": "InternalServerError"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "PutItem"
        )

    monkeypatch.setattr(files, "put", stored_then_500)

    response = api.invoke("ApiFunction", upload_event(LINE))

    assert response["statusCode"] == 200, response["body"]
    listed, _ = files.page("default", limit=10)
    assert [f.id for f in listed] == [json.loads(response["body"])["id"]]


def test_an_upload_retried_with_its_idempotency_key_is_one_file(api: Aws) -> None:
    first = api.invoke("ApiFunction", upload_event(LINE, {"Idempotency-Key": "upload-1"}))
    again = api.invoke("ApiFunction", upload_event(LINE + LINE, {"idempotency-key": "upload-1"}))
    other = api.invoke("ApiFunction", upload_event(LINE, {"Idempotency-Key": "upload-2"}))

    assert (first["statusCode"], again["statusCode"], other["statusCode"]) == (200, 200, 200)
    assert json.loads(again["body"]) == json.loads(first["body"])  # the first attempt's file, its bytes
    assert json.loads(first["body"])["bytes"] == len(LINE)
    listed, _ = files.page("default", limit=10)
    assert sorted(f.id for f in listed) == sorted(
        {json.loads(first["body"])["id"], json.loads(other["body"])["id"]}
    )


def test_a_bad_request_whose_key_lookup_is_throttled_is_a_503(
    api: Aws, fail_calls: Callable[..., list[str]]
) -> None:
    # Request validation runs before the auth middleware; its 400 first looks the key up (a 401 first)
    attempts = fail_calls(
        aws.table().meta.client, "GetItem", DYNAMODB_THROTTLE, when=lambda body: b"KEY#" in body
    )

    response = api.invoke(
        "ApiFunction", event("POST", "/v1/batches", b"{", {"content-type": "application/json"})
    )

    assert_unavailable(response)
    assert attempts == ["GetItem"] * ATTEMPTS


def test_a_plain_bug_stays_a_500(api: Aws, uploaded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(batch_id: str, **_: Any) -> None:
        raise KeyError("status")

    monkeypatch.setattr(batches, "get", broken)

    response = api.invoke("ApiFunction", event("GET", "/v1/batches/batch_0123456789abcdef01234567"))

    assert (response["statusCode"], json.loads(response["body"])) == (
        500,
        {
            "error": {
                "message": "internal error",
                "type": "server_error",
                "param": None,
                "code": "internal_error",
            }
        },
    )
    assert "Retry-After" not in response["headers"]


def test_a_client_error_that_is_not_load_stays_a_500(api: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(batch_id: str, **_: Any) -> None:
        raise ClientError(
            {"Error": {"Code": "AccessDeniedException"}, "ResponseMetadata": {"HTTPStatusCode": 400}},
            "GetItem",
        )

    monkeypatch.setattr(batches, "get", denied)

    response = api.invoke("ApiFunction", event("GET", "/v1/batches/batch_0123456789abcdef01234567"))

    assert response["statusCode"] == 500


class InProcessApi:
    """The API function in-process (in the test's moto account) as the local HTTP API's `Invoker`."""

    def __init__(self, aws_account: Aws) -> None:
        self.aws, self.spec = aws_account, aws_account.specs["ApiFunction"]
        self.lock = threading.Lock()  # one invocation at a time, as one execution environment

    def invoke(self, event: Any, *, block: bool = True) -> Any:
        with self.lock:
            return self.aws.invoke("ApiFunction", event)


@pytest.fixture
def sdk(api: Aws) -> Iterator[tuple[OpenAI, list[int]]]:
    """The `openai` SDK (its default retries) on the local HTTP API stand-in serving the API function,
    and the HTTP statuses it received, in order."""
    route = Route.of(InProcessApi(api), HttpApiEventSpec(name="Api", Path="/v1/{proxy+}"))  # type: ignore[arg-type]
    server = HttpApiServer(Router([route]), "123456789012", port=0)
    server.start()
    statuses: list[int] = []
    http = httpx2.Client(event_hooks={"response": [lambda response: statuses.append(response.status_code)]})
    try:
        yield OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, http_client=http), statuses
    finally:
        http.close()
        server.stop()


def test_the_openai_sdk_retries_a_503_by_itself_and_gets_one_file_and_one_batch(
    api: Aws, sdk: tuple[OpenAI, list[int]], fail_calls: Callable[..., list[str]], tmp_path: Any
) -> None:
    client, statuses = sdk
    path = tmp_path / "in.jsonl"
    path.write_bytes(LINE)
    # Each create's first request fails past botocore's retries, the SDK's second one succeeds
    slowed = fail_calls(aws.client("s3"), "PutObject", S3_SLOW_DOWN, times=ATTEMPTS)
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    throttled = fail_calls(aws.table().meta.client, "TransactWriteItems", DYNAMODB_THROTTLE, times=ATTEMPTS)
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    read = fail_calls(
        aws.table().meta.client,
        "GetItem",
        DYNAMODB_THROTTLE,
        when=lambda body: batch.id.encode() in body,
        times=ATTEMPTS,
    )
    retrieved = client.batches.retrieve(batch.id)

    assert (len(slowed), len(throttled), len(read)) == (ATTEMPTS, ATTEMPTS, ATTEMPTS)
    assert statuses == [503, 200] * 3  # each call: one 503, then the SDK's own retry
    assert retrieved == batch
    assert (uploaded.bytes, uploaded.filename, uploaded.purpose) == (len(LINE), "in.jsonl", "batch")
    assert (batch.status, batch.input_file_id) == ("validating", uploaded.id)
    listed, _ = files.page("default", limit=10)
    assert [f.id for f in listed] == [uploaded.id]  # one file, one batch: the 503s stored nothing
    assert header_count() == 1
