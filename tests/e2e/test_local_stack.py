"""The local stack's runtime, end to end: moto + pollers + schedules + the HTTP API bridge.

Runs tests/fixtures/local_stack/template.yaml, whose tiny handlers record every invocation in
the stack's DynamoDB table (see tests/fixtures/local_stack/handlers/recorder/app.py).
Events are checked field by field and also parsed with Powertools' own event models.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from aws_lambda_powertools.utilities.parser.models import (
    APIGatewayProxyEventV2Model,
    EventBridgeModel,
    S3Model,
    SqsModel,
)

from batchinfer_local import LocalStack

pytestmark = pytest.mark.timeout(120)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "local_stack"
REDELIVERY_DELAY = 1.0


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(
        FIXTURE / "template.yaml", port=0, redelivery_delay=REDELIVERY_DELAY, schedule_interval=0.5
    ) as running:
        yield running


@pytest.fixture
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        yield client


def invocations(stack: LocalStack, logical_id: str) -> list[dict[str, Any]]:
    """What the recorder handler stored for a function, oldest first."""
    name = stack.functions[logical_id].function_name
    response = stack.dynamodb.query(
        TableName=stack.tables["RecordTable"],
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": name}},
    )
    return [
        {
            "event": json.loads(item["event"]["S"]),
            "context": json.loads(item["context"]["S"]),
            "greeting": item["greeting"]["S"],
            "recorded_at": float(item["recorded_at"]["S"]),
        }
        for item in response["Items"]
    ]


def deliveries(
    stack: LocalStack, logical_id: str, marker: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(invocation, record) for every delivered SQS record whose body contains `marker`."""
    return [
        (invocation, record)
        for invocation in invocations(stack, logical_id)
        for record in invocation["event"].get("Records", [])
        if marker in record["body"]
    ]


def test_sqs_message_reaches_handler_in_lambda_event_format(stack: LocalStack) -> None:
    marker = uuid.uuid4().hex
    body = json.dumps({"marker": marker})
    stack.sqs.send_message(
        QueueUrl=stack.queue_urls["WorkQueue"],
        MessageBody=body,
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "demo"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x01\x02"},
        },
    )
    stack.wait_idle(30)

    [(invocation, record)] = deliveries(stack, "WorkerFunction", marker)
    assert invocation["event"] == {"Records": [record]}
    SqsModel.model_validate(invocation["event"])
    assert sorted(record) == sorted(
        [
            "messageId",
            "receiptHandle",
            "body",
            "attributes",
            "messageAttributes",
            "md5OfMessageAttributes",
            "md5OfBody",
            "eventSource",
            "eventSourceARN",
            "awsRegion",
        ]
    )
    assert record["body"] == body
    assert record["md5OfBody"] == hashlib.md5(body.encode()).hexdigest()
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-WorkQueue"
    assert record["awsRegion"] == "us-east-1"
    assert record["messageAttributes"] == {
        "kind": {"stringValue": "demo", "stringListValues": [], "binaryListValues": [], "dataType": "String"},
        "blob": {"binaryValue": "AQI=", "stringListValues": [], "binaryListValues": [], "dataType": "Binary"},
    }
    assert sorted(record["attributes"]) == [
        "ApproximateFirstReceiveTimestamp",
        "ApproximateReceiveCount",
        "SenderId",
        "SentTimestamp",
    ]
    assert record["attributes"]["ApproximateReceiveCount"] == "1"

    context = invocation["context"]
    assert context["function_name"] == "batchinfer-local-WorkerFunction"
    assert context["function_version"] == "$LATEST"
    assert (
        context["invoked_function_arn"]
        == "arn:aws:lambda:us-east-1:123456789012:function:batchinfer-local-WorkerFunction"
    )
    assert context["memory_limit_in_mb"] == 256  # Globals
    assert 0 < context["remaining_ms"] <= 7000  # the function's own Timeout: 7 s
    assert re.fullmatch(r"[0-9a-f-]{36}", context["aws_request_id"])
    assert invocation["greeting"] == "hello"  # a Ref to a parameter default, via Globals


def test_partial_failure_redelivers_only_the_failed_record(stack: LocalStack) -> None:
    marker = uuid.uuid4().hex
    # DelaySeconds: both become visible together, so one receive takes them as one batch.
    stack.sqs.send_message_batch(
        QueueUrl=stack.queue_urls["WorkQueue"],
        Entries=[
            {"Id": "ok", "MessageBody": json.dumps({"marker": marker, "name": "ok"}), "DelaySeconds": 1},
            {
                "Id": "flaky",
                "MessageBody": json.dumps({"marker": marker, "name": "flaky", "fail_times": 1}),
                "DelaySeconds": 1,
            },
        ],
    )
    stack.wait_idle(30)

    seen = deliveries(stack, "WorkerFunction", marker)
    names = [
        (json.loads(record["body"])["name"], record["attributes"]["ApproximateReceiveCount"])
        for _, record in seen
    ]
    assert names == [("ok", "1"), ("flaky", "1"), ("flaky", "2")] or names == [
        ("flaky", "1"),
        ("ok", "1"),
        ("flaky", "2"),
    ]
    first, retry = seen[0][0], seen[-1][0]
    assert len(first["event"]["Records"]) == 2  # one batch of two
    assert [json.loads(r["body"])["name"] for r in retry["event"]["Records"]] == ["flaky"]
    assert retry["recorded_at"] - first["recorded_at"] >= REDELIVERY_DELAY


def test_poison_message_ends_in_the_dead_letter_queue(stack: LocalStack) -> None:
    marker = uuid.uuid4().hex
    body = json.dumps({"marker": marker, "fail_times": 99})
    stack.sqs.send_message(QueueUrl=stack.queue_urls["WorkQueue"], MessageBody=body)
    stack.wait_idle(30)

    counts = [
        record["attributes"]["ApproximateReceiveCount"]
        for _, record in deliveries(stack, "WorkerFunction", marker)
    ]
    assert counts == ["1", "2"]  # maxReceiveCount 2, then SQS moves it on the next receive
    dead = stack.sqs.receive_message(
        QueueUrl=stack.queue_urls["WorkDeadLetterQueue"], MaxNumberOfMessages=10
    )["Messages"]
    assert [message["Body"] for message in dead] == [body]
    stack.sqs.delete_message(
        QueueUrl=stack.queue_urls["WorkDeadLetterQueue"], ReceiptHandle=dead[0]["ReceiptHandle"]
    )


def test_handler_exception_redelivers_the_whole_batch(stack: LocalStack) -> None:
    marker = uuid.uuid4().hex
    stack.sqs.send_message_batch(
        QueueUrl=stack.queue_urls["WorkQueue"],
        Entries=[
            {"Id": "ok", "MessageBody": json.dumps({"marker": marker, "name": "ok"}), "DelaySeconds": 1},
            {
                "Id": "bad",
                "MessageBody": json.dumps({"marker": marker, "name": "bad", "raise": True}),
                "DelaySeconds": 1,
            },
        ],
    )
    stack.wait_idle(30)

    seen = deliveries(stack, "WorkerFunction", marker)
    assert sorted(
        (json.loads(r["body"])["name"], r["attributes"]["ApproximateReceiveCount"]) for _, r in seen
    ) == [
        ("bad", "1"),
        ("bad", "2"),
        ("ok", "1"),
        ("ok", "2"),
    ]
    dead = stack.sqs.receive_message(
        QueueUrl=stack.queue_urls["WorkDeadLetterQueue"], MaxNumberOfMessages=10
    )["Messages"]
    assert sorted(json.loads(message["Body"])["name"] for message in dead) == ["bad", "ok"]
    for message in dead:
        stack.sqs.delete_message(
            QueueUrl=stack.queue_urls["WorkDeadLetterQueue"], ReceiptHandle=message["ReceiptHandle"]
        )


def test_batch_item_failures_are_ignored_without_report_batch_item_failures(stack: LocalStack) -> None:
    marker = uuid.uuid4().hex
    stack.sqs.send_message(
        QueueUrl=stack.queue_urls["ImageQueue"], MessageBody=json.dumps({"marker": marker, "fail_times": 1})
    )
    stack.wait_idle(30)

    seen = deliveries(stack, "ImageFunction", marker)
    assert [record["attributes"]["ApproximateReceiveCount"] for _, record in seen] == ["1"]
    # The image function's code is found next to Metadata.Dockerfile, named by ImageConfig.Command.
    assert stack.functions["ImageFunction"].handler_file == FIXTURE / "handlers" / "image" / "app.py"
    assert seen[0][0]["context"]["memory_limit_in_mb"] == 256


def test_s3_upload_under_inbox_reaches_the_declared_queue(stack: LocalStack) -> None:
    marker = uuid.uuid4().hex
    bucket = stack.buckets["DataBucket"]
    assert bucket == "fixture-123456789012-us-east-1-data"
    for key in (f"inbox/{marker}.jsonl", f"inbox/{marker}.txt", f"other/{marker}.jsonl"):
        stack.s3.put_object(Bucket=bucket, Key=key, Body=b"{}\n")
    stack.wait_idle(30)

    notifications = [
        json.loads(record["body"])
        for invocation in invocations(stack, "UploadsFunction")
        for record in invocation["event"]["Records"]
    ]
    # S3 validates a new notification configuration with a test event, moto too.
    assert {"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": bucket}.items() <= notifications[
        0
    ].items()
    created = [
        n for n in notifications if "Records" in n and marker in n["Records"][0]["s3"]["object"]["key"]
    ]
    assert len(created) == 1
    S3Model.model_validate(created[0])
    [s3_record] = created[0]["Records"]
    assert s3_record["eventName"] == "ObjectCreated:Put"
    assert s3_record["s3"]["bucket"]["name"] == bucket
    assert s3_record["s3"]["object"]["key"] == f"inbox/{marker}.jsonl"
    assert s3_record["s3"]["object"]["size"] == 3


def test_the_batching_window_gathers_messages_into_one_invocation(stack: LocalStack) -> None:
    marker = uuid.uuid4().hex
    for n in range(3):  # 0.3 s apart: all within the 2-second window
        stack.sqs.send_message(
            QueueUrl=stack.queue_urls["WindowQueue"], MessageBody=json.dumps({"marker": marker, "n": n})
        )
        time.sleep(0.3)
    stack.wait_idle(30)

    [(first, _), *rest] = deliveries(stack, "WindowFunction", marker)
    assert [json.loads(record["body"])["n"] for record in first["event"]["Records"]] == [0, 1, 2]
    assert [invocation for invocation, _ in rest] == [first, first]  # the same invocation: one batch of 3


def test_http_requests_run_at_once_in_environments_of_their_own(stack: LocalStack) -> None:
    before = stack.pool_stats("HttpFunction")
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.get(f"{stack.base_url}/v1/sleep", params={"seconds": "1"}, timeout=30),
                range(4),
            )
        )
    after = stack.pool_stats("HttpFunction")
    assert [answer.status_code for answer in answers] == [200] * 4
    assert len({answer.json()["pid"] for answer in answers}) == 4
    assert after.peak == 4 and after.invocations == before.invocations + 4
    assert after.limit == 10  # no ReservedConcurrentExecutions: the local default


def test_schedule_invokes_with_a_scheduled_event(stack: LocalStack) -> None:
    deadline = time.monotonic() + 10
    while not invocations(stack, "SweepFunction"):
        assert time.monotonic() < deadline, "the schedule never fired"
        time.sleep(0.1)
    event = invocations(stack, "SweepFunction")[0]["event"]
    EventBridgeModel.model_validate(event)
    assert sorted(event) == [
        "account",
        "detail",
        "detail-type",
        "id",
        "region",
        "resources",
        "source",
        "time",
        "version",
    ]
    assert event["detail-type"] == "Scheduled Event"
    assert event["source"] == "aws.events"
    assert event["account"] == "123456789012"
    assert event["region"] == "us-east-1"
    assert event["resources"] == [
        "arn:aws:events:us-east-1:123456789012:rule/batchinfer-local-SweepFunctionSweep"
    ]
    assert event["detail"] == {}
    assert event["version"] == "0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", event["time"])


def test_http_request_reaches_handler_as_v2_event(stack: LocalStack, http: httpx.Client) -> None:
    response = http.post(
        "/v1/things/a%20b?x=1&x=2&empty=",
        headers=[
            ("X-Multi", "a"),
            ("X-Multi", "b"),
            ("Cookie", "c1=v1; c2=v2"),
            ("Content-Type", "application/json"),
        ],
        content=b'{"hello": "world"}',
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert answer["function_name"] == "batchinfer-local-HttpFunction"
    event = answer["event"]
    APIGatewayProxyEventV2Model.model_validate(event)
    port = stack.base_url.rsplit(":", 1)[1]
    context = event.pop("requestContext")
    assert event == {
        "version": "2.0",
        "routeKey": "ANY /v1/{proxy+}",
        "rawPath": "/v1/things/a%20b",
        "rawQueryString": "x=1&x=2&empty=",
        "cookies": ["c1=v1", "c2=v2"],
        "headers": {
            "host": f"127.0.0.1:{port}",
            "accept": "*/*",
            "accept-encoding": "gzip, deflate",
            "user-agent": f"python-httpx/{httpx.__version__}",
            "x-multi": "a,b",
            "content-type": "application/json",
            "content-length": "18",
            "x-forwarded-for": "127.0.0.1",
            "x-forwarded-proto": "http",
            "x-forwarded-port": port,
        },
        "queryStringParameters": {"x": "1,2", "empty": ""},
        "pathParameters": {"proxy": "things/a b"},
        "body": '{"hello": "world"}',
        "isBase64Encoded": False,
    }
    request_id, when, epoch = context.pop("requestId"), context.pop("time"), context.pop("timeEpoch")
    assert context == {
        "accountId": "123456789012",
        "apiId": "HttpApi",
        "domainName": f"127.0.0.1:{port}",
        "domainPrefix": "127",
        "http": {
            "method": "POST",
            "path": "/v1/things/a%20b",
            "protocol": "HTTP/1.1",
            "sourceIp": "127.0.0.1",
            "userAgent": f"python-httpx/{httpx.__version__}",
        },
        "routeKey": "ANY /v1/{proxy+}",
        "stage": "$default",
    }
    assert re.fullmatch(r"[0-9a-f-]{36}", request_id)
    assert re.fullmatch(r"\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000", when)
    assert abs(epoch / 1000 - time.time()) < 60


def test_multipart_body_is_base64_encoded(http: httpx.Client) -> None:
    request = http.build_request(
        "POST", "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", b"{}\n")}
    )
    sent = request.read()
    event = http.send(request).json()["event"]
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == sent
    assert event["headers"]["content-type"].startswith("multipart/form-data; boundary=")


def test_most_specific_route_wins(http: httpx.Client) -> None:
    specific = http.get("/v1/items/42").json()["event"]
    assert (specific["routeKey"], specific["pathParameters"]) == (
        "GET /v1/items/{item_id}",
        {"item_id": "42"},
    )
    # The GET-only route does not take POST: the greedy ANY route does.
    greedy = http.post("/v1/items/42").json()["event"]
    assert (greedy["routeKey"], greedy["pathParameters"]) == ("ANY /v1/{proxy+}", {"proxy": "items/42"})


def test_binary_response_with_cookies(http: httpx.Client) -> None:
    response = http.get("/v1/binary")
    assert response.status_code == 201
    assert response.content == b"\x00\x01\xfe\xff"
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["x-test"] == "yes"
    assert response.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2"]


def test_result_without_status_code_is_a_200_json_response(http: httpx.Client) -> None:
    response = http.get("/v1/plain")
    assert (response.status_code, response.headers["content-type"], response.json()) == (
        200,
        "application/json",
        {"hello": "world"},
    )


@pytest.mark.parametrize("path", ["/v2/things", "/v1", "/"])
def test_unknown_route_is_404_like_api_gateway(http: httpx.Client, path: str) -> None:
    response = http.get(path)
    assert (response.status_code, response.json()) == (404, {"message": "Not Found"})


def test_handler_exception_is_500_like_api_gateway(http: httpx.Client) -> None:
    response = http.get("/v1/boom")
    assert (response.status_code, response.json()) == (500, {"message": "Internal Server Error"})


def test_environment_and_resource_names(stack: LocalStack) -> None:
    assert stack.environment == {
        "TABLE_NAME": "batchinfer-local-RecordTable",
        "BUCKET_NAME": "fixture-123456789012-us-east-1-data",
        "WORK_QUEUE_URL": f"{stack.moto_endpoint}/123456789012/batchinfer-local-WorkQueue",
        "GREETING": "hello",
    }
    assert stack.tables == {"RecordTable": "batchinfer-local-RecordTable"}
    assert sorted(stack.queue_urls) == [
        "ImageQueue",
        "UploadsQueue",
        "WindowQueue",
        "WorkDeadLetterQueue",
        "WorkQueue",
    ]
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.queue_urls["WorkQueue"], AttributeNames=["All"]
    )["Attributes"]
    assert attributes["VisibilityTimeout"] == "60"
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": "arn:aws:sqs:us-east-1:123456789012:batchinfer-local-WorkDeadLetterQueue",
        "maxReceiveCount": 2,
    }
    ttl = stack.dynamodb.describe_time_to_live(TableName=stack.tables["RecordTable"])["TimeToLiveDescription"]
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "ttl"}
