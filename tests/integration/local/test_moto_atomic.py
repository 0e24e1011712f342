"""moto's DynamoDB under concurrent requests in one threaded server, as the local stack runs it
(`batchinfer_local.moto_atomic`): no update lost, no HTTP 500."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from moto.server import ThreadedMotoServer

from batchinfer_local.moto_atomic import serialize_item_operations

THREADS, UPDATES = 8, 25


@pytest.fixture
def table() -> Iterator[object]:
    serialize_item_operations()
    # Threads switch every 10 µs instead of 5 ms: the server's threads interleave inside every request.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    dynamodb = boto3.resource(
        "dynamodb",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        # One try: a 500 must show, not be retried away.
        config=boto3.session.Config(retries={"total_max_attempts": 1}),
    )
    try:
        yield dynamodb.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    finally:
        server.stop()
        sys.setswitchinterval(interval)


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
