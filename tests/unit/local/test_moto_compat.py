"""moto's gaps closed by `moto_compat`: the S3 notification fields moto omits, stream records read
by every reader, fair delivery of a standard queue, delayed messages held, one-partition queries."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parser.models import S3Model

from batchinfer_local import moto_compat
from batchinfer_local.moto_compat import complete_s3_notification


def test_s3_notification_gets_the_fields_moto_omits() -> None:
    moto_body = {
        "Records": [
            {
                "eventVersion": "2.1",
                "eventSource": "aws:s3",
                "awsRegion": "us-east-1",
                "eventTime": "2026-01-01T00:00:00.000Z",
                "eventName": "ObjectCreated:Put",
                "s3": {
                    "s3SchemaVersion": "1.0",
                    "configurationId": "c",
                    "bucket": {"name": "b", "arn": "arn:aws:s3:::b"},
                    "object": {"key": "inbox%2Fmy+file%3A1.jsonl", "size": 3, "eTag": "e"},
                },
            }
        ]
    }
    completed = json.loads(complete_s3_notification(json.dumps(moto_body)))
    S3Model.model_validate(completed)
    [record] = completed["Records"]
    assert record["userIdentity"] == {"principalId": "AWS:AIDAIT2UOQQY3AUEKVGXU"}
    assert record["requestParameters"] == {"sourceIPAddress": "127.0.0.1"}
    assert sorted(record["responseElements"]) == ["x-amz-id-2", "x-amz-request-id"]
    assert record["s3"]["bucket"]["ownerIdentity"] == {"principalId": "A1LOCALSTACKOWNER"}
    assert record["s3"]["object"]["key"] == "inbox/my+file%3A1.jsonl"  # S3 keeps "/", form-encodes the rest
    assert len(record["s3"]["object"]["sequencer"]) == 18
    for other in (
        '{"Service": "Amazon S3", "Event": "s3:TestEvent"}',
        "not json",
        '{"Records": [{"eventSource": "aws:sqs"}]}',
    ):
        assert complete_s3_notification(other) == other


def test_moto_forgets_read_iterators_and_records_every_reader_has_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3
    from moto import mock_aws
    from moto.dynamodbstreams.models import dynamodbstreams_backends

    from batchinfer_local.moto_compat import trim_read_stream_records

    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        table = dynamodb.create_table(
            TableName="t",
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        )["TableDescription"]
        streams, arn = boto3.client("dynamodbstreams", region_name="us-east-1"), table["LatestStreamArn"]
        (shard,) = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]

        def iterator() -> str:
            return streams.get_shard_iterator(
                StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]

        trim_read_stream_records()
        try:
            for key in "ab":
                dynamodb.put_item(TableName="t", Item={"k": {"S": key}})
            fast, slow = iterator(), iterator()
            read = streams.get_records(ShardIterator=fast)
            assert [r["dynamodb"]["Keys"]["k"]["S"] for r in read["Records"]] == ["a", "b"]
            assert fast not in dynamodbstreams_backends["123456789012"]["us-east-1"].shard_iterators  # used
            # The slow reader has read nothing yet: it still gets both records
            late = streams.get_records(ShardIterator=slow)
            assert [r["dynamodb"]["Keys"]["k"]["S"] for r in late["Records"]] == ["a", "b"]
            dynamodb.put_item(TableName="t", Item={"k": {"S": "c"}})
            # Both passed a and b: they are gone; each reader goes on with c
            assert [
                r["dynamodb"]["Keys"]["k"]["S"]
                for r in streams.get_records(ShardIterator=iterator())["Records"]
            ] == ["c"]
            nxt = streams.get_records(ShardIterator=read["NextShardIterator"])
            assert [r["dynamodb"]["Keys"]["k"]["S"] for r in nxt["Records"]] == ["c"]
            # A reader that gave its iterator up (after a failed poll) stops keeping records once the
            # iterator expires unused
            abandoned = nxt["NextShardIterator"]
            dynamodb.put_item(TableName="t", Item={"k": {"S": "d"}})
            backend = dynamodbstreams_backends["123456789012"]["us-east-1"]
            shard_items = backend.shard_iterators[abandoned].stream_shard.items
            kept = len(shard_items)
            now = time.monotonic()
            later = now + moto_compat.ITERATOR_TTL_S + 1
            streams.get_records(ShardIterator=iterator())  # sees `abandoned` for the first time
            assert abandoned in backend.shard_iterators and len(shard_items) == kept
            monkeypatch.setattr(moto_compat.time, "monotonic", lambda: later)
            fresh = streams.get_records(ShardIterator=iterator())
            assert abandoned not in backend.shard_iterators
            assert len(shard_items) == 0 and fresh["Records"][-1]["dynamodb"]["Keys"]["k"]["S"] == "d"
        finally:
            trim_read_stream_records(False)


def test_moto_hands_out_a_standard_queues_messages_as_a_fair_queue_does() -> None:
    import boto3
    from moto import mock_aws

    from batchinfer_local.moto_compat import deliver_fairly

    def send(sqs: Any, url: str, group: str | None, body: str) -> None:
        sqs.send_message(QueueUrl=url, MessageBody=body, **({"MessageGroupId": group} if group else {}))

    def receive(sqs: Any, url: str, n: int) -> list[Any]:
        return sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=n, MessageSystemAttributeNames=["All"], VisibilityTimeout=60
        ).get("Messages", [])

    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        dlq = sqs.create_queue(QueueName="dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        url = sqs.create_queue(
            QueueName="q",
            Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})},
        )["QueueUrl"]
        deliver_fairly()
        try:
            # Given A's 5 messages sent first, then B's 2 and one without a group
            for n in range(5):
                send(sqs, url, "A", f"a{n}")
            send(sqs, url, "B", "b0")
            send(sqs, url, "B", "b1")
            send(sqs, url, None, "x")
            # One at a time, held in flight: the group with the fewest in flight first, then the oldest
            first = [receive(sqs, url, 1)[0] for _ in range(4)]
            assert [m["Body"] for m in first] == ["a0", "b0", "x", "a1"]
            assert [m["Attributes"].get("MessageGroupId") for m in first] == ["A", "B", None, "A"]
            # A has 2 in flight, B 1: a receive of several shares them out (b1, then A's older ones)
            rest = receive(sqs, url, 10)
            assert [m["Body"] for m in rest] == ["b1", "a2", "a3", "a4"]
            # Once A's messages in flight are deleted, A is the quiet group: its newer message goes first
            for message in [*first, *rest]:
                if message["Body"] != "b1":
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            send(sqs, url, "B", "b2")
            send(sqs, url, "A", "a5")
            assert [m["Body"] for m in receive(sqs, url, 10)] == ["a5", "b2"]
            # Visibility timeouts, receive counts and the redrive to the DLQ are moto's: a message
            # received twice (maxReceiveCount) goes to the DLQ on the next receive
            send(sqs, url, "C", "c0")
            for count in ("1", "2"):
                [message] = sqs.receive_message(
                    QueueUrl=url, MessageSystemAttributeNames=["All"], VisibilityTimeout=0
                )["Messages"]
                assert (message["Body"], message["Attributes"]["ApproximateReceiveCount"]) == ("c0", count)
            assert sqs.receive_message(QueueUrl=url, VisibilityTimeout=0).get("Messages", []) == []
            [dead] = sqs.receive_message(QueueUrl=dlq, MessageSystemAttributeNames=["MessageGroupId"])[
                "Messages"
            ]
            assert (dead["Body"], dead["Attributes"]["MessageGroupId"]) == ("c0", "C")
        finally:
            deliver_fairly(False)


def test_a_message_crossing_its_delay_is_held_though_get_queue_attributes_counts_it_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3
    from moto import mock_aws
    from moto.sqs import models

    from batchinfer_local.moto_compat import messages_held

    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateNumberOfMessagesNotVisible",
    ]
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="m", DelaySeconds=1)
        [message] = models.sqs_backends["123456789012"]["us-east-1"].get_queue("q")._messages
        counted = []
        for before in range(60):  # the delay ends after moto's `before`-th look at its clock
            ends = message.delayed_until
            clock = iter([ends - 1] * before + [ends] * 10_000)
            monkeypatch.setattr(models, "unix_time_millis", clock.__next__)
            counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
            counted.append(sum(int(counts[name]) for name in names))
            assert messages_held(url, "us-east-1") == 1
        # Some look across the delay's end counts the one message in none of the three
        assert 0 in counted and set(counted) <= {0, 1}


def test_a_query_of_one_partition_answers_as_moto_does_reading_only_that_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3
    from moto import mock_aws
    from moto.dynamodb.models.table import Table

    from batchinfer_local.moto_compat import query_one_partition

    def pages(dynamodb: Any, **query: Any) -> list[list[str]]:
        found, start = [], {}
        while True:
            page = dynamodb.query(TableName="t", **query, **start)
            found.append([item["SK"]["S"] for item in page["Items"]])
            if "LastEvaluatedKey" not in page:
                return found
            start = {"ExclusiveStartKey": page["LastEvaluatedKey"]}

    queries = [
        {"KeyConditionExpression": "PK = :p", "ExpressionAttributeValues": {":p": {"S": "b"}}},
        {
            "KeyConditionExpression": "PK = :p AND begins_with(SK, :s)",
            "ExpressionAttributeValues": {":p": {"S": "b"}, ":s": {"S": "SHARD#"}},
            "Limit": 2,
            "ScanIndexForward": False,
        },
        {"KeyConditionExpression": "PK = :p", "ExpressionAttributeValues": {":p": {"S": "none"}}},
        {
            "IndexName": "open",
            "KeyConditionExpression": "G = :g",
            "ExpressionAttributeValues": {":g": {"S": "open"}},
        },
    ]
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        dynamodb.create_table(
            TableName="t",
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("PK", "SK", "G")],
            KeySchema=[
                {"AttributeName": "PK", "KeyType": "HASH"},
                {"AttributeName": "SK", "KeyType": "RANGE"},
            ],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": "open",
                    "KeySchema": [{"AttributeName": "G", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            ],
        )
        for pk in ("a", "b", "c"):
            for sk in ("META", "SHARD#00002", "SHARD#00000", "SHARD#00001", "SHARD#00003"):
                item = {"PK": {"S": pk}, "SK": {"S": sk}, **({"G": {"S": "open"}} if sk == "META" else {})}
                dynamodb.put_item(TableName="t", Item=item)
        query_one_partition(False)
        moto_own = [pages(dynamodb, **query) for query in queries]
        read: list[str] = []
        every_item = Table.all_items

        def counting(self: Table) -> Any:
            read.append(self.name)
            return every_item(self)

        monkeypatch.setattr(Table, "all_items", counting)  # moto's read of every item, counted
        query_one_partition()
        try:
            answers = [pages(dynamodb, **query) for query in queries]
        finally:
            query_one_partition(False)
        assert (
            answers
            == moto_own
            == [
                [["META", "SHARD#00000", "SHARD#00001", "SHARD#00002", "SHARD#00003"]],
                [["SHARD#00003", "SHARD#00002"], ["SHARD#00001", "SHARD#00000"], []],
                [[]],
                [["META", "META", "META"]],
            ]
        )
        assert read == ["t"]  # the index query alone read every item
