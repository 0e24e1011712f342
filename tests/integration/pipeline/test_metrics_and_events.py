"""The functions' handlers against moto: the CloudWatch EMF lines Powertools prints (parsed here as
CloudWatch would), and StatusEventsFunction on the batch table's real stream records.

EMF: https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from batchinfer.core.observability import metrics
from batchinfer.data import batches
from batchinfer.data.items import BatchChanges
from batchinfer.wire.status import BatchStatus
from batchinfer.wire.webhooks import event_id
from batchinfer_local.pollers.dynamodb import stream_record
from support.api_stack import HoldableUpstream, chat_line, jsonl
from support.moto_env import Aws, sqs_event
from support.pipeline import create, prepared
from support.scripted import SCRIPTED, scripted_model


@pytest.fixture
def upstream(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    with scripted_model(tmp_path, monkeypatch) as served:
        yield served


@pytest.fixture(autouse=True)
def _fresh_metrics() -> None:
    # Other tests call the pipeline without a handler: what they added was never flushed.
    metrics.clear_metrics()


def emf(
    stdout: str,
) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], list[float]], list[dict[str, Any]]]:
    """The EMF lines of a function's stdout: values by (metric, its dimensions), and the documents."""
    values: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = defaultdict(list)
    documents = []
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        document = json.loads(line)
        if "_aws" not in document:
            continue  # a log line
        documents.append(document)
        for directive in document["_aws"]["CloudWatchMetrics"]:
            (dimension_names,) = directive["Dimensions"]
            dimensions = tuple((name, document[name]) for name in dimension_names)
            for metric in directive["Metrics"]:
                value = document[metric["Name"]]
                values[(metric["Name"], dimensions)].extend(value if isinstance(value, list) else [value])
    return values, documents


SERVICE = (("service", "batchinfer"),)


def test_the_shard_worker_prints_emf_of_its_requests_tokens_and_latency(
    moto_aws: Aws,
    upstream: HoldableUpstream,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a shard of three requests, one of which the model refuses with a 400
    data = jsonl(*(chat_line(f"r{n}", p, model=SCRIPTED) for n, p in enumerate(["a", "FAIL b", "c"])))
    batch_id = prepared(moto_aws, data, monkeypatch, shard_size=3)
    capsys.readouterr()
    # When the ShardWorkerFunction handler runs it
    assert moto_aws.invoke("ShardWorkerFunction", sqs_event([{"batch_id": batch_id, "shard": 0}])) == {
        "batchItemFailures": []
    }
    values, documents = emf(capsys.readouterr().out)
    # Then its EMF document counts exactly what was committed, in the batchinfer namespace
    assert {d["_aws"]["CloudWatchMetrics"][0]["Namespace"] for d in documents} == {"batchinfer"}
    totals = {name: sum(v) for (name, dimensions), v in values.items() if dimensions == SERVICE}
    assert {k: totals[k] for k in ("RequestsCompleted", "RequestsFailed", "InputTokens", "OutputTokens")} == {
        "RequestsCompleted": 2,
        "RequestsFailed": 1,
        "InputTokens": 6,  # the scripted model: 3 prompt and 2 completion tokens per answer
        "OutputTokens": 4,
    }
    latencies = values[("BackendLatency", SERVICE)]
    assert len(latencies) == 2 and all(0 < ms < 30_000 for ms in latencies)  # the two answers, in ms
    units = {m["Name"]: m["Unit"] for d in documents for m in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert (units["BackendLatency"], units["RequestsCompleted"]) == ("Milliseconds", "Count")
    assert "BackendRefusals" not in totals and "Continuations" not in totals


def test_the_sweeper_prints_emf_of_redrives_and_batches_past_their_window(
    moto_aws: Aws,
    upstream: HoldableUpstream,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    batch_id = prepared(moto_aws, jsonl(chat_line("r1", "a", model=SCRIPTED)), monkeypatch)
    batches.update(batch_id, BatchChanges(expires_at=1))
    capsys.readouterr()
    actions = moto_aws.invoke("SweeperFunction", {"source": "aws.events", "detail-type": "Scheduled Event"})
    assert (actions["expired"], actions["past_window"]) == (1, 1)
    values, _ = emf(capsys.readouterr().out)
    assert (values[("BatchesPastWindow", SERVICE)], values[("Redrives", SERVICE)]) == ([1.0], [0.0])


def stream_event(aws: Aws) -> dict[str, Any]:
    """Every record of the batch table's stream so far, as Lambda's DynamoDB event source sends them."""
    table = boto3.client("dynamodb").describe_table(TableName=aws.resources.tables["BatchTable"])["Table"]
    streams, arn = boto3.client("dynamodbstreams"), table["LatestStreamArn"]
    (shard,) = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
    iterator = streams.get_shard_iterator(
        StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = streams.get_records(ShardIterator=iterator)["Records"]
    return {"Records": [stream_record(record, arn, "us-east-1") for record in records]}


def test_status_events_publish_each_status_change_once_and_queue_the_ending_s_webhook(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a rule routing batchinfer's events to a queue
    sqs, events = boto3.client("sqs"), boto3.client("events")
    queue_url = sqs.create_queue(QueueName="routed")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="routed", EventPattern=json.dumps({"source": ["batchinfer"]}))
    events.put_targets(Rule="routed", Targets=[{"Id": "q", "Arn": arn}])
    # And a batch created, then failed, with writes between that leave its status as it was
    batch_id = create(moto_aws, jsonl(chat_line("r1", "a", model=SCRIPTED)), monkeypatch)
    batches.update(batch_id, BatchChanges(model="m"))
    failed = batches.transition(batch_id, BatchStatus.FAILED)
    assert failed is not None
    event = stream_event(moto_aws)
    assert len(event["Records"]) > 3  # account counters and the key items too: the handler skips them
    capsys.readouterr()
    # When StatusEventsFunction gets the stream's records
    assert moto_aws.invoke("StatusEventsFunction", event) == {"batchItemFailures": []}
    # Then one event per status change reached the rule's queue, the Batch object as its detail
    received = [
        json.loads(m["Body"])
        for m in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    ]
    assert [(e["source"], e["detail-type"], e["detail"]["id"]) for e in received] == [
        ("batchinfer", "batch.validating", batch_id),
        ("batchinfer", "batch.failed", batch_id),
    ]
    assert received[1]["detail"]["status"] == "failed" and "account_id" not in received[1]["detail"]
    assert received[1]["detail"]["failed_at"] == failed.failed_at
    # And the ending's webhook delivery is queued with its stable id
    assert moto_aws.messages("WebhookQueue") == [
        {
            "batch_id": batch_id,
            "account_id": "default",
            "type": "batch.failed",
            "event_id": event_id(batch_id, "batch.failed"),
            "created_at": failed.failed_at,
        }
    ]
    # And the EMF counts one batch created and one ended, by status
    values, _ = emf(capsys.readouterr().out)
    assert values[("BatchesCreated", SERVICE)] == [1.0]
    assert values[("BatchesEnded", (("service", "batchinfer"), ("status", "failed")))] == [1.0]
