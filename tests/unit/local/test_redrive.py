"""`redrive.redrive` against in-process moto: messages move back with what they were sent with."""

from __future__ import annotations

import boto3
from moto import mock_aws

from batchinfer_local.redrive import redrive


def test_a_redriven_message_keeps_its_body_attributes_and_message_group() -> None:
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        dlq, target = (sqs.create_queue(QueueName=name)["QueueUrl"] for name in ("dlq", "target"))
        attributes = {"kind": {"DataType": "String", "StringValue": "shard"}}
        sqs.send_message(QueueUrl=dlq, MessageBody="a", MessageGroupId="acct-a", MessageAttributes=attributes)
        sqs.send_message(QueueUrl=dlq, MessageBody="b")
        assert redrive(sqs, dlq, target) == 2
        moved = sqs.receive_message(
            QueueUrl=target,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["MessageGroupId"],
        )["Messages"]
        assert sorted(
            (m["Body"], m.get("Attributes", {}).get("MessageGroupId"), m.get("MessageAttributes"))
            for m in moved
        ) == [("a", "acct-a", attributes), ("b", None, None)]
        assert sqs.receive_message(QueueUrl=dlq).get("Messages", []) == []
