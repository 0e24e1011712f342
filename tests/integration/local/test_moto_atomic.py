"""moto's DynamoDB under concurrent requests in one threaded server, as the local stack runs it
(`batchinfer_local.moto_atomic`): no update lost, no HTTP 500, a cancelled transaction undoes only its
own items and its stream records."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from batchinfer_local.moto_atomic import serialize_item_operations

THREADS, UPDATES = 8, 25


@pytest.fixture
def endpoint() -> Iterator[dict[str, Any]]:
    """boto3 client arguments for a fresh threaded moto server with the local stack's patches."""
    serialize_item_operations()
    # Threads switch every 10 µs instead of 5 ms: the server's threads interleave inside every request.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {
            "endpoint_url": f"http://{host}:{port}",
            "region_name": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            # One try: a 500 must show, not be retried away.
            "config": boto3.session.Config(retries={"total_max_attempts": 1}),
        }
    finally:
        server.stop()
        sys.setswitchinterval(interval)


@pytest.fixture
def table(endpoint: dict[str, Any]) -> object:
    return boto3.resource("dynamodb", **endpoint).create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def test_concurrent_updates_of_one_item_lose_nothing_and_never_fail(table: object) -> None:
    # Given one item with a map every thread adds its own keys to (as shard workers publish progress)
    table.put_item(Item={"pk": "batch", "progress": {f"seed{i}": i for i in range(200)}})

    # When 8 threads update it at once, each asking for the whole new item back
    def add(thread: int) -> int:
        for n in range(UPDATES):
            table.update_item(
                Key={"pk": "batch"},
                UpdateExpression="SET progress.#k = :v",
                ExpressionAttributeNames={"#k": f"t{thread}-{n}"},
                ExpressionAttributeValues={":v": n},
                ReturnValues="ALL_NEW",
            )
        return thread

    with ThreadPoolExecutor(THREADS) as pool:
        done = sorted(pool.map(add, range(THREADS)))

    # Then every call succeeded and every key is there
    assert done == list(range(THREADS))
    progress = table.get_item(Key={"pk": "batch"})["Item"]["progress"]
    assert len(progress) == 200 + THREADS * UPDATES


def test_a_cancelled_transaction_undoes_its_own_items_and_stream_records_only(
    endpoint: dict[str, Any],
) -> None:
    # Given a table with a stream (keys pk + sk), an item the transaction updates, one it leaves alone,
    # and a stream reader waiting at the stream's end
    client = boto3.client("dynamodb", **endpoint)
    arn = client.create_table(
        TableName="s",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )["TableDescription"]["LatestStreamArn"]
    client.put_item(TableName="s", Item={"pk": {"S": "b"}, "sk": {"S": "1"}, "n": {"N": "1"}})
    client.put_item(TableName="s", Item={"pk": {"S": "b"}, "sk": {"S": "2"}, "n": {"N": "2"}})
    streams = boto3.client("dynamodbstreams", **endpoint)
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="LATEST")[
        "ShardIterator"
    ]

    # When a transaction updates b/1 and puts b/3, then fails its condition on b/2
    with pytest.raises(client.exceptions.TransactionCanceledException):
        client.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": "s",
                        "Key": {"pk": {"S": "b"}, "sk": {"S": "1"}},
                        "UpdateExpression": "SET n = :n",
                        "ExpressionAttributeValues": {":n": {"N": "10"}},
                    }
                },
                {"Put": {"TableName": "s", "Item": {"pk": {"S": "b"}, "sk": {"S": "3"}}}},
                {
                    "ConditionCheck": {
                        "TableName": "s",
                        "Key": {"pk": {"S": "b"}, "sk": {"S": "2"}},
                        "ConditionExpression": "n = :zero",
                        "ExpressionAttributeValues": {":zero": {"N": "0"}},
                    }
                },
            ]
        )
    # and then one item is written as usual
    client.put_item(TableName="s", Item={"pk": {"S": "b"}, "sk": {"S": "4"}})

    # Then the items are as before the transaction, plus the later one
    items = client.query(
        TableName="s", KeyConditionExpression="pk = :b", ExpressionAttributeValues={":b": {"S": "b"}}
    )
    assert [(item["sk"]["S"], item.get("n", {}).get("N")) for item in items["Items"]] == [
        ("1", "1"),
        ("2", "2"),
        ("4", None),
    ]
    # and the reader sees the later write and nothing of the transaction (moto put a copy of the table
    # in place of the table, whose stream the reader no longer saw)
    records = streams.get_records(ShardIterator=iterator)["Records"]
    assert [(r["eventName"], r["dynamodb"]["Keys"]["sk"]["S"]) for r in records] == [("INSERT", "4")]
