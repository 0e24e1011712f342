"""moto-backed test support: the template's tables, buckets and queues in-process, handlers invoked directly.

The resources come from template.yaml (the local stack's own loader), so tests can't drift from it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.loaders
import botocore.session
import pytest
from moto import mock_aws

from batchinfer.core import aws
from batchinfer.core.settings import get_settings
from batchinfer_local.functions import FunctionSpec, function_specs, load_handler, merged_environment
from batchinfer_local.moto_atomic import serialize_item_operations
from batchinfer_local.moto_compat import query_one_partition
from batchinfer_local.resources import Resources, create_resources
from batchinfer_local.runtime import LocalLambdaContext
from batchinfer_local.stack import DEFAULT_TEMPLATE
from batchinfer_local.template import Resolver, load_template

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _shared_loader(data_path: str | None = None) -> botocore.loaders.Loader:
    return botocore.loaders.create_loader(data_path)


# moto starts every test with a new default boto3 session, and each new botocore session parses the
# service models' JSON again (about 0.3 CPU-s a test): one loader for the process, whose cache of
# parsed models is shared by its sessions as one session's clients share it.
botocore.session.create_loader = _shared_loader
EVENTS = REPO / "events"


@dataclass
class Aws:
    """The moto account of one test: resources by logical id and the template's functions."""

    resources: Resources
    specs: dict[str, FunctionSpec]
    handlers: dict[str, Any] = field(default_factory=dict)

    @property
    def bucket(self) -> str:
        return self.resources.buckets["DataBucket"]

    def invoke(self, function: str, event: dict[str, Any]) -> Any:
        """Call a function's handler in-process with a Lambda-like context."""
        if function not in self.handlers:
            self.handlers[function] = load_handler(self.specs[function])
        return self.handlers[function](event, LocalLambdaContext(self.specs[function]))

    def messages(self, queue: str) -> list[dict[str, Any]]:
        """Receive (and delete) every visible message of a queue; bodies parsed as JSON."""
        return [body for _, body in self.grouped(queue)]

    def grouped(self, queue: str) -> list[tuple[str | None, dict[str, Any]]]:
        """Like `messages`: (MessageGroupId or None, body) of each message."""
        sqs, url = boto3.client("sqs"), self.resources.queue_urls[queue]
        received = []
        while batch := sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId"]
        ).get("Messages", []):
            for message in batch:
                received.append(
                    (message.get("Attributes", {}).get("MessageGroupId"), json.loads(message["Body"]))
                )
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return received


def sqs_event(bodies: list[Any], queue: str = "Queue") -> dict[str, Any]:
    """A Lambda SQS event carrying `bodies` (JSON-encoded unless already strings)."""
    return {
        "Records": [
            {
                "messageId": f"m-{i}",
                "receiptHandle": f"r-{i}",
                "body": body if isinstance(body, str) else json.dumps(body),
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1764480000000",
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": "1764480000001",
                },
                "messageAttributes": {},
                "md5OfBody": "0" * 32,
                "eventSource": "aws:sqs",
                "eventSourceARN": f"arn:aws:sqs:us-east-1:123456789012:{queue}",
                "awsRegion": "us-east-1",
            }
            for i, body in enumerate(bodies)
        ]
    }


def load_event(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())


@contextmanager
def moto_account(monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    """The template's resources in an in-process moto account, and the functions' environment."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    # DynamoDB applies each write atomically; moto alone does not, and tests run takers in threads.
    serialize_item_operations()
    query_one_partition()  # as the local stack runs moto: a Query reads its partition, not the table
    with mock_aws():
        for cached in (aws._session, aws._client, aws._table, get_settings):
            cached.cache_clear()  # clients made before the mock would reach for real AWS
        template = load_template(DEFAULT_TEMPLATE)
        resolver = Resolver(template, {})
        for logical_id, resource in template["Resources"].items():
            if resource.get("Type") == "AWS::Serverless::HttpApi":
                resolver.add_resource(logical_id, logical_id)
        clients = {name: boto3.client(name) for name in ("sqs", "dynamodb", "s3")}
        resources = create_resources(template, resolver, clients)
        specs = function_specs(template, DEFAULT_TEMPLATE.parent, resolver)
        for key, value in merged_environment(specs).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "WARNING")
        get_settings.cache_clear()
        yield Aws(resources, {s.logical_id: s for s in specs})
    for cached in (aws._session, aws._client, aws._table, get_settings):
        cached.cache_clear()
