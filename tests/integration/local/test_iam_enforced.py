"""IAM enforced in the local stack: every function's calls are judged by its own role, as on AWS.

Each call is made with the credentials the function's environments get (`stack.function_client`)
against the running stack's moto, so what is checked is moto's enforcement with `moto_auth`'s fixes:
DynamoDB per table and index (transactions item by item), SQS batch actions, HeadBucket as
s3:ListBucket, Secrets Manager ARNs with IAM's `?`, presigned S3 URLs, and AWS's error shapes.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from batchinfer_local import LocalStack

pytestmark = pytest.mark.timeout(300)

USER_BUCKET, OTHER_BUCKET, OTHER_TABLE = "batchinfer-user-alpha", "someone-elses-bucket", "OtherTable"
KEY = {"PK": {"S": "probe#1"}, "SK": {"S": "probe"}}
# A message every consumer takes and skips: its batch does not exist.
NO_BATCH = json.dumps({"batch_id": "batch_none", "shard": 0})


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(port=0) as running:
        running.s3.create_bucket(Bucket=USER_BUCKET)
        running.s3.create_bucket(Bucket=OTHER_BUCKET)
        running.s3.put_object(Bucket=USER_BUCKET, Key="in.jsonl", Body=b"{}\n")
        running.s3.put_object(Bucket=running.buckets["DataBucket"], Key="files/probe", Body=b"probe")
        running.dynamodb.create_table(
            TableName=OTHER_TABLE,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
        )
        secrets = running.client("secretsmanager")
        secrets.create_secret(Name="batchinfer/cos", SecretString=json.dumps({"access_key_id": "a"}))
        secrets.create_secret(Name="other/secret", SecretString="x")
        yield running


def outcome(call: Callable[[], Any]) -> str:
    """`allowed`, `denied` (AccessDenied / AccessDeniedException), `notfound`, or
    `error:<code>/<HTTP status>`."""
    try:
        call()
    except ClientError as error:
        code = str(error.response["Error"].get("Code"))
        status = error.response["ResponseMetadata"]["HTTPStatusCode"]
        if code in ("AccessDenied", "AccessDeniedException"):
            return "denied"
        if code in ("404", "NoSuchKey"):
            return "notfound"
        return f"error:{code}/{status}"
    return "allowed"


def http_outcome(method: str, url: str, body: bytes | None = None) -> str:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method), timeout=30):
            return "allowed"
    except urllib.error.HTTPError as error:
        return {403: "denied", 404: "notfound"}.get(error.code, f"error:{error.code}")


def test_each_function_calls_as_its_own_assumed_role(stack: LocalStack) -> None:
    for logical_id, spec in stack.functions.items():
        identity = stack.function_client(logical_id, "sts").get_caller_identity()["Arn"]
        assert (
            identity == "arn:aws:sts::123456789012:assumed-role/"
            f"batchinfer-local-{logical_id}Role/{spec.function_name}"
        )
        environ = stack.function_environment_of(logical_id)
        assert environ["AWS_ACCESS_KEY_ID"].startswith("ASIA") and environ["AWS_SESSION_TOKEN"]


def test_dynamodb_is_judged_per_table_index_and_transaction_item(stack: LocalStack) -> None:
    api, table = stack.function_client("ApiFunction", "dynamodb"), stack.tables["BatchTable"]
    other = {"PK": {"S": "probe#2"}, "SK": {"S": "probe"}}
    assert outcome(lambda: api.put_item(TableName=table, Item={**KEY, "v": {"N": "1"}})) == "allowed"
    assert outcome(lambda: api.get_item(TableName=table, Key=KEY)) == "allowed"
    assert (
        outcome(
            lambda: api.query(
                TableName=table,
                IndexName="GSI1",
                KeyConditionExpression="GSI1PK = :p",
                ExpressionAttributeValues={":p": {"S": "x"}},
            )
        )
        == "allowed"
    )
    assert (
        outcome(
            lambda: api.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": table, "Item": other}},
                    {
                        "Update": {
                            "TableName": table,
                            "Key": KEY,
                            "UpdateExpression": "SET v = :v",
                            "ExpressionAttributeValues": {":v": {"N": "2"}},
                        }
                    },
                    {
                        "ConditionCheck": {
                            "TableName": table,
                            "Key": {"PK": {"S": "probe#3"}, "SK": {"S": "probe"}},
                            "ConditionExpression": "attribute_not_exists(PK)",
                        }
                    },
                ]
            )
        )
        == "allowed"
    )
    assert (
        outcome(lambda: api.transact_get_items(TransactItems=[{"Get": {"TableName": table, "Key": KEY}}]))
        == "allowed"
    )
    assert (
        outcome(lambda: api.batch_write_item(RequestItems={table: [{"DeleteRequest": {"Key": other}}]}))
        == "allowed"
    )
    # One item on a table outside the policy denies the whole transaction.
    assert (
        outcome(
            lambda: api.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": table, "Item": other}},
                    {"Put": {"TableName": OTHER_TABLE, "Item": {"PK": {"S": "x"}}}},
                ]
            )
        )
        == "denied"
    )
    assert outcome(lambda: api.put_item(TableName=OTHER_TABLE, Item={"PK": {"S": "x"}})) == "denied"
    # /v2 reads keys and holds slots, but may not update or scan; the denial has DynamoDB's own shape.
    infer = stack.function_client("TokenInferFunction", "dynamodb")
    assert outcome(lambda: infer.get_item(TableName=table, Key=KEY)) == "allowed"
    with pytest.raises(ClientError) as denied:
        infer.scan(TableName=table)
    assert (
        denied.value.response["Error"]["Code"],
        denied.value.response["ResponseMetadata"]["HTTPStatusCode"],
    ) == ("AccessDeniedException", 400)
    assert "assumed-role/batchinfer-local-TokenInferFunctionRole" in denied.value.response["Error"]["Message"]


def test_queues_are_judged_per_queue_and_the_event_source_polls_with_the_role(stack: LocalStack) -> None:
    queues = stack.queue_urls
    api, worker = (
        stack.function_client("ApiFunction", "sqs"),
        stack.function_client("ShardWorkerFunction", "sqs"),
    )
    assert (
        outcome(lambda: api.send_message(QueueUrl=queues["PrepareQueue"], MessageBody=NO_BATCH)) == "allowed"
    )
    assert (
        outcome(lambda: api.send_message(QueueUrl=queues["FinalizeQueue"], MessageBody=NO_BATCH)) == "allowed"
    )
    assert (
        outcome(
            lambda: api.send_message_batch(
                QueueUrl=queues["ShardsQueue"], Entries=[{"Id": "1", "MessageBody": NO_BATCH}]
            )
        )
        == "denied"
    )
    assert (
        outcome(lambda: worker.send_message(QueueUrl=queues["PrepareQueue"], MessageBody=NO_BATCH))
        == "denied"
    )
    assert (
        outcome(lambda: worker.get_queue_attributes(QueueUrl=queues["ShardsQueue"], AttributeNames=["All"]))
        == "allowed"
    )
    assert (
        outcome(
            lambda: worker.delete_message_batch(
                QueueUrl=queues["ShardsQueue"], Entries=[{"Id": "1", "ReceiptHandle": "no-such-handle"}]
            )
        )
        == "allowed"
    )  # authorized as sqs:DeleteMessage
    assert (
        outcome(
            lambda: worker.change_message_visibility_batch(
                QueueUrl=queues["ShardsQueue"],
                Entries=[{"Id": "1", "ReceiptHandle": "x", "VisibilityTimeout": 1}],
            )
        )
        == "denied"
    )  # not in the role
    assert (
        outcome(
            lambda: stack.function_client("TokenInferFunction", "sqs").receive_message(
                QueueUrl=queues["ShardsQueue"], WaitTimeSeconds=0
            )
        )
        == "denied"
    )  # no SQS event: no execution role policy
    stack.wait_idle(60)


def test_buckets_are_judged_per_key_prefix(stack: LocalStack) -> None:
    data = stack.buckets["DataBucket"]
    api, prepare = stack.function_client("ApiFunction", "s3"), stack.function_client("PrepareFunction", "s3")
    trigger, aggregator = (
        stack.function_client("UploadTriggerFunction", "s3"),
        stack.function_client("AggregatorFunction", "s3"),
    )
    assert outcome(lambda: api.put_object(Bucket=data, Key="files/new", Body=b"x")) == "allowed"
    assert outcome(lambda: api.delete_object(Bucket=data, Key="files/new")) == "allowed"
    assert (
        outcome(lambda: api.put_object(Bucket=data, Key="batches/b/shards/00000.jsonl", Body=b"x"))
        == "denied"
    )
    assert outcome(lambda: api.head_object(Bucket=data, Key="files/missing")) == "notfound"
    assert outcome(lambda: api.head_bucket(Bucket=USER_BUCKET)) == "allowed"  # HeadBucket is s3:ListBucket
    assert outcome(lambda: api.get_object(Bucket=USER_BUCKET, Key="in.jsonl")) == "allowed"
    assert outcome(lambda: api.put_object(Bucket=USER_BUCKET, Key="k", Body=b"x")) == "denied"
    assert outcome(lambda: api.put_object(Bucket=OTHER_BUCKET, Key="k", Body=b"x")) == "denied"
    assert outcome(lambda: prepare.get_object(Bucket=data, Key="files/probe")) == "allowed"
    assert outcome(lambda: prepare.delete_object(Bucket=data, Key="files/probe")) == "denied"
    assert outcome(lambda: trigger.get_object(Bucket=data, Key="files/probe")) == "denied"
    assert (
        outcome(lambda: aggregator.put_object(Bucket=USER_BUCKET, Key="out/b/output.jsonl", Body=b"x"))
        == "allowed"
    )
    assert outcome(lambda: aggregator.delete_object(Bucket=USER_BUCKET, Key="out/b/output.jsonl")) == "denied"
    assert outcome(lambda: aggregator.get_object(Bucket=USER_BUCKET, Key="in.jsonl")) == "denied"


def test_secrets_are_judged_by_their_arn_with_iams_wildcards(stack: LocalStack) -> None:
    api, worker = (
        stack.function_client("ApiFunction", "secretsmanager"),
        stack.function_client("ShardWorkerFunction", "secretsmanager"),
    )
    assert (
        outcome(lambda: api.get_secret_value(SecretId="batchinfer/cos")) == "allowed"
    )  # secret:batchinfer/cos-??????
    assert outcome(lambda: api.get_secret_value(SecretId="other/secret")) == "denied"
    assert (
        outcome(lambda: api.get_secret_value(SecretId="batchinfer/none")) == "denied"
    )  # AWS: no existence leak
    assert outcome(lambda: worker.get_secret_value(SecretId="batchinfer/cos")) == "denied"


@pytest.mark.parametrize("signature", ["s3", "s3v4"])
def test_presigned_urls_carry_the_signers_permissions(stack: LocalStack, signature: str) -> None:
    data = stack.buckets["DataBucket"]
    environ = stack.function_environment_of("ApiFunction")
    s3 = boto3.session.Session(
        aws_access_key_id=environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=environ["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=environ["AWS_SESSION_TOKEN"],
        region_name="us-east-1",
    ).client("s3", endpoint_url=stack.moto_endpoint, config=Config(signature_version=signature))

    def url(method: str, bucket: str, key: str, expires: int = 300) -> str:
        return s3.generate_presigned_url(method, Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires)

    get = url("get_object", data, "files/probe")
    assert http_outcome("GET", get) == "allowed"
    assert http_outcome("PUT", url("put_object", data, "files/uploaded"), b"hello") == "allowed"
    assert http_outcome("GET", url("get_object", USER_BUCKET, "in.jsonl")) == "allowed"
    assert http_outcome("PUT", url("put_object", OTHER_BUCKET, "k"), b"x") == "denied"
    assert http_outcome("GET", url("get_object", data, "batches/b/shards/00000.jsonl")) == "denied"
    assert (
        http_outcome(
            "GET", get.replace("files%2Fprobe", "files%2Fother").replace("files/probe", "files/other")
        )
        == "denied"
    )
    expired = url("get_object", data, "files/probe", expires=1)
    time.sleep(1.5)
    assert http_outcome("GET", expired) == "denied"
    assert http_outcome("GET", f"{stack.moto_endpoint}/{data}/files/probe") == "denied"  # unsigned


def test_unknown_keys_are_refused_as_aws_refuses_them(stack: LocalStack) -> None:
    session = boto3.session.Session(
        aws_access_key_id="AKIAIOSFODNN7EXAMPLE", aws_secret_access_key="wrong", region_name="us-east-1"
    )
    sqs, dynamodb = (session.client(name, endpoint_url=stack.moto_endpoint) for name in ("sqs", "dynamodb"))
    assert outcome(lambda: sqs.get_queue_url(QueueName="x")) == "error:InvalidClientTokenId/403"
    assert outcome(dynamodb.list_tables) == "error:UnrecognizedClientException/400"


def test_concurrent_calls_are_each_judged_by_their_own_credentials(stack: LocalStack) -> None:
    plan = [
        ("ApiFunction", "PrepareQueue", "ShardsQueue"),
        ("ShardWorkerFunction", "ShardsQueue", "PrepareQueue"),
        ("SweeperFunction", "FinalizeQueue", "UploadsQueue"),
        ("UploadTriggerFunction", "PrepareQueue", "FinalizeQueue"),
    ] * 2
    wrong: list[str] = []
    # Clients first (sessions are not thread-safe), then the calls from 8 threads at once.
    clients = [
        (stack.function_client(function, "sqs"), allowed, denied) for function, allowed, denied in plan
    ]

    def calls(sqs: Any, allowed: str, denied: str) -> None:
        for _ in range(10):
            for queue, expected in ((allowed, "allowed"), (denied, "denied")):
                got = outcome(
                    lambda queue=queue: sqs.send_message(
                        QueueUrl=stack.queue_urls[queue], MessageBody=NO_BATCH
                    )
                )
                if got != expected:
                    wrong.append(f"{queue}: {got}")

    threads = [threading.Thread(target=calls, args=client) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    stack.wait_idle(60)
