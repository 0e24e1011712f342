"""The DynamoDB stream event source mapping's rules that need no running stack: partial batch
responses by sequence number and the Lambda DynamoDB event record."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from batchinfer_local.pollers.dynamodb import failed_sequence, stream_record

STREAM_RECORDS = [{"dynamodb": {"SequenceNumber": n}} for n in ("101", "102", "103")]


@pytest.mark.parametrize(
    ("result", "first"),
    [
        (None, None),
        ({}, None),
        ({"batchItemFailures": []}, None),
        ({"batchItemFailures": [{"itemIdentifier": "102"}]}, 1),
        ({"batchItemFailures": [{"itemIdentifier": "103"}, {"itemIdentifier": "102"}]}, 1),  # the lowest
        ({"batchItemFailures": [{"itemIdentifier": "999"}]}, 0),
        ({"batchItemFailures": [{"itemIdentifier": None}]}, 0),
        ({"batchItemFailures": "102"}, 0),
        ("ok", 0),
    ],
)
def test_stream_partial_batch_response_rules(result: Any, first: int | None) -> None:
    assert failed_sequence(result, STREAM_RECORDS) == first


def test_stream_record_is_the_lambda_dynamodb_event_record() -> None:
    record = {
        "eventID": "e1",
        "eventName": "MODIFY",
        "eventVersion": "1.0",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": datetime(2026, 12, 1, tzinfo=UTC),
            "Keys": {"PK": {"S": "BATCH#b"}, "SK": {"S": "META"}},
            "SequenceNumber": "101",
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
    }
    assert stream_record(record, "arn:stream", "eu-west-1") == {
        "eventID": "e1",
        "eventName": "MODIFY",
        "eventVersion": "1.0",
        "eventSource": "aws:dynamodb",
        "awsRegion": "eu-west-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1796083200,  # 2026-12-01T00:00:00Z
            "Keys": {"PK": {"S": "BATCH#b"}, "SK": {"S": "META"}},
            "SequenceNumber": "101",
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
        "eventSourceARN": "arn:stream",
    }
