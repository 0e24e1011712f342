"""The SQS event source mapping's rules that need no running stack: partial batch responses and the
SQS event record."""

from __future__ import annotations

from typing import Any

import pytest

from batchinfer_local.pollers.sqs import failed_message_ids, sqs_event

IDS = ["m1", "m2"]


@pytest.mark.parametrize(
    ("result", "failed"),
    [
        (None, set()),
        ({}, set()),
        ({"batchItemFailures": []}, set()),
        ({"batchItemFailures": None}, set()),
        ({"batchItemFailures": [{"itemIdentifier": "m2"}]}, {"m2"}),
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, {"m1", "m2"}),
        ({"batchItemFailures": [{"itemIdentifier": None}]}, {"m1", "m2"}),
        ({"batchItemFailures": [{"wrongKey": "m2"}]}, {"m1", "m2"}),
        ({"batchItemFailures": [{"itemIdentifier": "not-in-batch"}]}, {"m1", "m2"}),
        ({"batchItemFailures": "m2"}, {"m1", "m2"}),
        ("ok", {"m1", "m2"}),
    ],
)
def test_partial_batch_response_rules(result: Any, failed: set[str]) -> None:
    assert failed_message_ids(result, IDS) == failed


def test_sqs_record_shape() -> None:
    message = {
        "MessageId": "id-1",
        "ReceiptHandle": "rh",
        "Body": "hi",
        "MD5OfBody": "49f68a5c8493ec2c0bf489821c21fc3b",
        "Attributes": {"ApproximateReceiveCount": "3"},
        "MessageAttributes": {
            "list": {"DataType": "String", "StringListValues": ["a"], "BinaryListValues": [b"\x00"]}
        },
    }
    assert sqs_event([message], "arn:q", "eu-west-1") == {
        "Records": [
            {
                "messageId": "id-1",
                "receiptHandle": "rh",
                "body": "hi",
                "attributes": {"ApproximateReceiveCount": "3"},
                "messageAttributes": {
                    "list": {"stringListValues": ["a"], "binaryListValues": ["AA=="], "dataType": "String"}
                },
                "md5OfBody": "49f68a5c8493ec2c0bf489821c21fc3b",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:q",
                "awsRegion": "eu-west-1",
            }
        ]
    }
