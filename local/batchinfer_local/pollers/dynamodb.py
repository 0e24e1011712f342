"""Lambda's DynamoDB stream event source mapping: `StreamPoller` and the event record it sends.

Rules of https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html (event, batching window, partial
batch responses by sequence number, retries) and
https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html (filter criteria).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from ..functions import DynamoDbEventSpec
from ..runtime import InvocationError, Invoker
from .poller import Poller, reported_failures

log = logging.getLogger(__name__)


def stream_record(record: dict[str, Any], stream_arn: str, region: str) -> dict[str, Any]:
    """A Lambda DynamoDB event record from a GetRecords record (boto3's shape: a datetime
    `ApproximateCreationDateTime`, which Lambda sends as Unix seconds)."""
    dynamodb = dict(record["dynamodb"])
    created = dynamodb.get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        dynamodb["ApproximateCreationDateTime"] = int(created.timestamp())
    return {
        "eventID": record["eventID"],
        "eventName": record["eventName"],
        "eventVersion": record.get("eventVersion", "1.1"),
        "eventSource": "aws:dynamodb",
        "awsRegion": region,
        "dynamodb": dynamodb,
        "eventSourceARN": stream_arn,
    }


def failed_sequence(result: Any, records: list[dict[str, Any]]) -> int | None:
    """The index of the first record to retry from a stream handler's partial batch response (None: all
    succeeded): the lowest reported sequence number is retried with every record after it; a malformed
    answer or an unknown `itemIdentifier` fails the whole batch (`reported_failures`'s rules)."""
    numbers = [record["dynamodb"]["SequenceNumber"] for record in records]
    failed = reported_failures(result, numbers)
    if failed is None:
        return 0
    return min((numbers.index(number) for number in failed), default=None)


class StreamPoller(Poller):
    """Lambda's DynamoDB stream event source mapping for one function and stream: a poller thread, one
    batch in flight per shard, records in order.

    It reads with the function's role (`streams`: Lambda polls with the execution role, hence
    AWSLambdaDynamoDBExecutionRole): DescribeStream, GetShardIterator (StartingPosition), then GetRecords
    every `poll_seconds` (Lambda polls a stream shard four times a second; locally each poll costs
    about 2.5 ms of CPU), gathering up to BatchSize records or until MaximumBatchingWindowInSeconds has
    passed since the first. Records that match no `FilterCriteria` pattern (moto's EventBridge pattern
    matcher, the syntax Lambda uses) are dropped, as Lambda drops them. A failed invocation is retried
    with the same records after `redelivery_delay` seconds, up to MaximumRetryAttempts (-1: until it
    succeeds; OnFailure destinations and bisection are not emulated: an exhausted batch is logged and
    skipped); with ReportBatchItemFailures, the records from the first failed one are retried.
    `caught_up_at` is the `time.monotonic()` of the last poll that found nothing left to deliver.
    """

    def __init__(
        self,
        function: Invoker,
        source: DynamoDbEventSpec,
        streams: Any,
        region: str,
        redelivery_delay: float,
        stopping: threading.Event,
        poll_seconds: float = 0.25,
    ) -> None:
        super().__init__("ddb", function, source, stopping)
        from moto.events.models import EventPattern

        self.source = source
        self._streams, self._region = streams, region
        self._delay, self._poll = max(0.0, redelivery_delay), poll_seconds
        self._patterns = [EventPattern.load(pattern) for pattern in source.filter_patterns]
        # By shard: the sequence number of the last record read, and of the last one settled.
        self._read: dict[str, str] = {}
        self._delivered: dict[str, str] = {}
        self.caught_up_at = 0.0

    def run(self) -> None:
        """Poll until the stack stops; errors are logged and polling continues."""
        iterators: dict[str, str] = {}
        pending: dict[str, list[dict[str, Any]]] = {}
        while not self._stopping.is_set():
            try:
                if not iterators:
                    iterators, pending = self._iterators(), {}
                polled_at = time.monotonic()
                idle = True
                for shard, iterator in list(iterators.items()):
                    response = self._streams.get_records(ShardIterator=iterator, Limit=1000)
                    iterators[shard] = response.get("NextShardIterator") or iterator
                    records = [
                        stream_record(r, self.source.stream_arn, self._region) for r in response["Records"]
                    ]
                    pending.setdefault(shard, []).extend(r for r in records if self._matches(r))
                    if records:
                        self._read[shard] = records[-1]["dynamodb"]["SequenceNumber"]
                    while pending[shard] and not self._stopping.is_set():
                        idle = False
                        batch = self._gather(shard, iterators, pending)
                        self._deliver(batch)
                    if shard in self._read and not pending[shard]:
                        self._delivered[shard] = self._read[shard]
                if idle:
                    self.caught_up_at = polled_at
            except Exception:
                if self._stopping.is_set():
                    return  # moto is shutting down under us
                log.exception("%s: polling failed", self.name)
                iterators = {}
            self._stopping.wait(self._poll)

    def _iterators(self) -> dict[str, str]:
        """An iterator per shard: from StartingPosition, or after the last record delivered (a restart
        after an error resumes where delivery stopped, as a mapping's checkpoint does)."""
        stream = self._streams.describe_stream(StreamArn=self.source.stream_arn)["StreamDescription"]
        iterators = {}
        for shard in stream.get("Shards", []):
            position: dict[str, str] = {"ShardIteratorType": self.source.starting_position}
            if shard["ShardId"] in self._delivered:
                position = {
                    "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                    "SequenceNumber": self._delivered[shard["ShardId"]],
                }
            iterators[shard["ShardId"]] = self._streams.get_shard_iterator(
                StreamArn=self.source.stream_arn, ShardId=shard["ShardId"], **position
            )["ShardIterator"]
        return iterators

    def _matches(self, record: dict[str, Any]) -> bool:
        return not self._patterns or any(pattern.matches_event(record) for pattern in self._patterns)

    def _gather(
        self, shard: str, iterators: dict[str, str], pending: dict[str, list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Up to BatchSize records of `shard`, waiting out the batching window for more."""
        window_ends = time.monotonic() + self.source.maximum_batching_window
        while len(pending[shard]) < self.source.batch_size and time.monotonic() < window_ends:
            if self._stopping.wait(min(self._poll, max(0.0, window_ends - time.monotonic()))):
                break
            response = self._streams.get_records(ShardIterator=iterators[shard], Limit=1000)
            iterators[shard] = response.get("NextShardIterator") or iterators[shard]
            records = [stream_record(r, self.source.stream_arn, self._region) for r in response["Records"]]
            if records:
                self._read[shard] = records[-1]["dynamodb"]["SequenceNumber"]
            pending[shard].extend(r for r in records if self._matches(r))
        batch = pending[shard][: self.source.batch_size]
        del pending[shard][: len(batch)]
        return batch

    def _deliver(self, batch: list[dict[str, Any]]) -> None:
        attempt = 0
        while batch and not self._stopping.is_set():
            try:
                with self.function.activity.running():
                    result = self.function.invoke({"Records": batch})
                first = failed_sequence(result, batch) if self.source.reports_batch_item_failures else None
                if first is None:
                    return
                batch = batch[first:]
                reason = f"{len(batch)} record(s) reported failed"
            except InvocationError as error:
                reason = str(error)
            attempt += 1
            if 0 <= self.source.maximum_retry_attempts < attempt:
                log.warning("%s: retries exhausted, %d record(s) skipped: %s", self.name, len(batch), reason)
                return
            log.warning("%s: a stream batch failed, retried in %.0f s: %s", self.name, self._delay, reason)
            self._stopping.wait(self._delay)
