"""`aws.on_call`: every call through batchinfer's clients is seen, from clients made before or after."""

from __future__ import annotations

import pytest
from moto import mock_aws

from batchinfer.core import aws
from batchinfer.core.settings import get_settings


@pytest.fixture
def fresh_clients(monkeypatch: pytest.MonkeyPatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "TABLE_NAME": "t",
        "BUCKET_NAME": "b",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        for cached in (aws._session, aws._client, aws._table, get_settings):
            cached.cache_clear()
        yield
    for cached in (aws._session, aws._client, aws._table, get_settings):
        cached.cache_clear()


def test_on_call_sees_each_call_by_service_and_operation_until_removed(fresh_clients: None) -> None:
    # Given a client made before the hook, and one made after
    s3 = aws.client("s3")
    seen: list[tuple[str, str]] = []
    remove = aws.on_call(lambda service, operation: seen.append((service, operation)))
    sqs = aws.client("sqs")

    # When both make calls, before and after the hook is removed
    s3.create_bucket(Bucket="bench-bucket")
    sqs.create_queue(QueueName="q")
    remove()
    s3.list_buckets()

    # Then the calls in between were seen, in order
    assert seen == [("s3", "CreateBucket"), ("sqs", "CreateQueue")]
