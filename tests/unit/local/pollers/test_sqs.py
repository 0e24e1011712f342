"""The SQS event source mapping's rules that need no running stack: partial batch responses, the
SQS event record, and what a batch whose settling failed becomes."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from batchinfer_local.functions import SqsEventSpec
from batchinfer_local.pollers.sqs import SqsPoller, failed_message_ids, sqs_event
from batchinfer_local.runtime import Activity

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


class _Sqs:
    """An SQS client whose DeleteMessageBatch fails (as moto under load may) and that records
    ChangeMessageVisibilityBatch."""

    def __init__(self) -> None:
        self.visibility: list[dict[str, Any]] = []

    def delete_message_batch(self, **_: Any) -> dict[str, Any]:
        raise ConnectionError("moto did not answer")

    def change_message_visibility_batch(self, **kwargs: Any) -> dict[str, Any]:
        self.visibility.append(kwargs)
        return {"Successful": [], "Failed": []}


def test_a_batch_whose_delete_failed_is_made_visible_again_after_the_redelivery_delay() -> None:
    # Given a poller whose function succeeds but whose delete of the messages fails
    spec = SimpleNamespace(logical_id="WorkerFunction")
    function = SimpleNamespace(spec=spec, activity=Activity(), limit=2, environ={}, invoke=lambda event: None)
    source = SqsEventSpec.model_validate({"name": "Queue", "Queue": "arn:aws:sqs:eu-west-1:1:q"})
    sqs = _Sqs()
    poller = SqsPoller(function, source, "http://moto/1/q", sqs, sqs, "eu-west-1", 3, threading.Event())
    messages = [{"MessageId": f"m{i}", "ReceiptHandle": f"rh{i}", "Body": "{}"} for i in (1, 2)]
    poller._slots.acquire()

    # When the batch runs
    poller._run_batch(messages)

    # Then both messages are visible again after 3 s (not after the queue's visibility timeout), and the
    # slot and the activity count are given back
    assert sqs.visibility == [
        {
            "QueueUrl": "http://moto/1/q",
            "Entries": [
                {"Id": "0", "ReceiptHandle": "rh1", "VisibilityTimeout": 3},
                {"Id": "1", "ReceiptHandle": "rh2", "VisibilityTimeout": 3},
            ],
        }
    ]
    assert function.activity.busy == 0
    assert poller._slots.acquire(blocking=False) and poller._slots.acquire(blocking=False)
