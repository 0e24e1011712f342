"""Invoke functions the way Lambda does: the context, SQS event source mappings, schedules.

Event shapes and rules follow the Lambda developer guide:
- SQS: https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html (event, partial batch responses,
  batching window) and https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html (maximum
  concurrency of the mapping);
- Schedule: https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-run-lambda-schedule.html (an
  asynchronous invocation per tick, whether or not the previous one has ended);
- DynamoDB streams: https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html (event, batching window,
  partial batch responses by sequence number, retries) and
  https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html (filter criteria).
The event sources drive an `Invoker`: `environments.EnvironmentPool`, the function's execution
environments, as many at once as its concurrency allows.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol

from aws_lambda_powertools.utilities.typing import LambdaContext

from .functions import DynamoDbEventSpec, FunctionSpec, ScheduleEventSpec, SqsEventSpec
from .moto_compat import md5_hex

log = logging.getLogger(__name__)


class LocalLambdaContext(LambdaContext):
    """The `context` argument of a local invocation (Powertools' `LambdaContext` interface).

    `get_remaining_time_in_millis()` counts down to `deadline` (a `time.monotonic()` value; default
    the function's Timeout from now), floored at 0.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        request_id: str | None = None,
        deadline: float | None = None,
        log_stream_name: str | None = None,
    ) -> None:
        self._function_name = spec.function_name
        self._function_version = "$LATEST"
        self._invoked_function_arn = spec.function_arn
        self._memory_limit_in_mb = spec.memory_size
        self._aws_request_id = request_id or str(uuid.uuid4())
        self._log_group_name = f"/aws/lambda/{spec.function_name}"
        self._log_stream_name = log_stream_name or log_stream(spec)
        self._identity = None  # type: ignore[assignment]
        self._client_context = None  # type: ignore[assignment]
        self._deadline = time.monotonic() + spec.timeout if deadline is None else deadline

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]
        """Milliseconds left before the invocation's deadline (0 once it has passed)."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def log_stream(spec: FunctionSpec) -> str:
    """A new execution environment's log stream name, as Lambda names them."""
    return f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"


class InvocationError(RuntimeError):
    """An invocation failed, as Lambda reports it: `error` is `{"errorType", "errorMessage", "stackTrace"}`
    (the handler's exception, or `Sandbox.Timedout`, `Runtime.ExitError`, `Runtime.ImportModuleError`,
    `Runtime.MarshalError`)."""

    def __init__(self, function: str, error: dict[str, Any]) -> None:
        super().__init__(f"{function}: {error.get('errorType')}: {error.get('errorMessage')}")
        self.error = error


class Throttled(RuntimeError):
    """Every execution environment of the function is busy and it may have no more (Lambda's 429)."""


class Invoker(Protocol):
    """A function the event sources can invoke (`environments.EnvironmentPool`)."""

    spec: FunctionSpec
    activity: Activity

    def invoke(self, event: Any, *, block: bool = True) -> Any:
        """Run one invocation; its JSON result. Raises `InvocationError` (and `Throttled` if not `block`)."""

    @property
    def limit(self) -> int:
        """Most invocations at once."""

    @property
    def environ(self) -> dict[str, str]:
        """The function's variables as its environments see them."""

    def count(self, name: str, by: int = 1) -> None:
        """Add to one of the function's counters (`stats`)."""


class Activity:
    """Counts running invocations; `generation` changes whenever one starts or ends.

    `LocalStack.wait_idle` uses both to know that nothing ran while it looked at the queues.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy = 0
        self.generation = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        """Mark one unit of work as running for the duration of the block."""
        with self._lock:
            self.busy += 1
            self.generation += 1
        try:
            yield
        finally:
            with self._lock:
                self.busy -= 1
                self.generation += 1


def sqs_event(messages: list[dict[str, Any]], queue_arn: str, region: str) -> dict[str, Any]:
    """The Lambda SQS event for messages as returned by ReceiveMessage (all attributes requested)."""
    records = []
    for message in messages:
        record: dict[str, Any] = {
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": message["Body"],
            "attributes": dict(message.get("Attributes") or {}),
            "messageAttributes": {
                name: _message_attribute(value)
                for name, value in (message.get("MessageAttributes") or {}).items()
            },
            "md5OfBody": message["MD5OfBody"],
            "eventSource": "aws:sqs",
            "eventSourceARN": queue_arn,
            "awsRegion": region,
        }
        if "MD5OfMessageAttributes" in message:
            record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
        records.append(record)
    return {"Records": records}


def _message_attribute(value: dict[str, Any]) -> dict[str, Any]:
    # Lambda lower-cases the first letter of each field and base64-encodes binary values.
    converted: dict[str, Any] = {
        "stringListValues": list(value.get("StringListValues") or []),
        "binaryListValues": [base64.b64encode(item).decode() for item in value.get("BinaryListValues") or []],
        "dataType": value["DataType"],
    }
    if "StringValue" in value:
        converted["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        converted["binaryValue"] = base64.b64encode(value["BinaryValue"]).decode()
    return converted


def failed_message_ids(result: Any, message_ids: list[str]) -> set[str]:
    """The message ids to redeliver, from a handler's partial batch response.

    Rules of https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html: a null
    or empty response or `batchItemFailures` is complete success; a malformed response, or an
    `itemIdentifier` that is empty, null or not a message of the batch, fails the whole batch.
    """
    everything = set(message_ids)
    if result is None:
        return set()
    if not isinstance(result, dict):
        log.warning("partial batch response is not an object (%r): the whole batch failed", result)
        return everything
    failures = result.get("batchItemFailures")
    if not failures:
        return set()
    if not isinstance(failures, list):
        log.warning("batchItemFailures is not a list: the whole batch failed")
        return everything
    failed = set()
    for item in failures:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        if not identifier or identifier not in everything:
            log.warning("invalid batchItemFailures entry %r: the whole batch failed", item)
            return everything
        failed.add(identifier)
    return failed


class DuplicateDelivery:
    """Chaos mode's `duplicate_delivery` fault for one event source mapping (SQS is at-least-once).

    The rate and seed come from `BATCHINFER_CHAOS` as the function's environments see it (so changing
    the functions' variables changes it too), drawn from a stream seeded like `batchinfer.core.chaos`'s.
    """

    def __init__(self, function: Invoker) -> None:
        self._function = function
        self._raw: str | None = None
        self._rate, self._random = 0.0, random.Random(0)
        self._lock = threading.Lock()

    def roll(self) -> bool:
        """Whether to deliver one message again."""
        raw = self._function.environ.get("BATCHINFER_CHAOS") or None
        with self._lock:
            if raw != self._raw:
                from batchinfer.core.chaos import ChaosConfig

                config = ChaosConfig.model_validate(json.loads(raw)) if raw else None
                self._raw = raw
                self._rate = config.duplicate_delivery if config else 0.0
                self._random = random.Random(f"{config.seed if config else 0}/duplicate_delivery")
            fired = self._rate > 0 and self._random.random() < self._rate
        if fired:
            self._function.count("chaos:duplicate_delivery")
        return fired


class SqsEventSource(threading.Thread):
    """Lambda's SQS event source mapping for one function and queue: a poller thread and up to
    `concurrency` batches in flight, each invoked in a thread of its own.

    The poller receives with the function's role (`sqs`: Lambda polls with the execution role, hence
    AWSLambdaSQSQueueExecutionRole) while a slot is free: up to BatchSize messages, long polling 1 s,
    then gathering more until the batch is full or MaximumBatchingWindowInSeconds has passed since its
    first record. After the
    invocation it deletes the messages that succeeded (function role). Failed ones become visible again
    after `redelivery_delay` seconds (`admin_sqs`: Lambda itself waits for the queue's VisibilityTimeout,
    far too long locally). A failed invocation fails the whole batch; with ReportBatchItemFailures only
    the reported messages fail. SQS (moto) moves a message to the DLQ after maxReceiveCount receives.
    `concurrency` is ScalingConfig.MaximumConcurrency, else the function's concurrency. `transform`, if
    given, rewrites each body before delivery (see `moto_compat`), with md5OfBody recomputed.
    """

    def __init__(
        self,
        function: Invoker,
        source: SqsEventSpec,
        queue_url: str,
        sqs: Any,
        admin_sqs: Any,
        region: str,
        redelivery_delay: float,
        stopping: threading.Event,
        transform: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(name=f"sqs-{function.spec.logical_id}-{source.name}", daemon=True)
        self.function, self.source, self.queue_url = function, source, queue_url
        self.concurrency = min(function.limit, source.maximum_concurrency or function.limit)
        self._transform = transform
        self._sqs, self._admin_sqs, self._region, self._stopping = sqs, admin_sqs, region, stopping
        self._delay = max(0, round(redelivery_delay))
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._batches: list[threading.Thread] = []
        self._duplicates = DuplicateDelivery(function)

    def run(self) -> None:
        """Poll until the stack stops; errors are logged and polling continues."""
        while not self._stopping.is_set():
            if not self._slots.acquire(timeout=0.5):
                continue
            try:
                messages = self._receive()
            except Exception:
                self._slots.release()
                if self._stopping.is_set():
                    return  # moto is shutting down under us
                log.exception("%s: polling failed", self.name)
                self._stopping.wait(1.0)
                continue
            if not messages:
                self._slots.release()
                continue
            batch = threading.Thread(
                target=self._run_batch, args=(messages,), daemon=True, name=f"{self.name}-batch"
            )
            self._batches = [thread for thread in self._batches if thread.is_alive()] + [batch]
            batch.start()

    def join_batches(self, timeout: float) -> list[threading.Thread]:
        """Wait up to `timeout` seconds in all for the batches in flight; those still running."""
        deadline = time.monotonic() + timeout
        for thread in list(self._batches):
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread for thread in self._batches if thread.is_alive()]

    def _receive(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        window_ends = left = 0.0  # the batching window starts with the first record
        while len(messages) < self.source.batch_size and not self._stopping.is_set():
            if messages:
                left = window_ends - time.monotonic()
                if left <= 0:
                    break  # the batching window has passed: invoke with what there is
            wait = min(20, int(left)) if messages else 1
            response = self._sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, self.source.batch_size - len(messages)),
                WaitTimeSeconds=wait,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            batch = response.get("Messages", [])
            if self._transform is not None:
                for message in batch:
                    body = self._transform(message["Body"])
                    if body != message["Body"]:
                        message["Body"], message["MD5OfBody"] = body, md5_hex(body)
            if batch and not messages:
                window_ends = time.monotonic() + self.source.maximum_batching_window
            messages.extend(batch)
            if not messages:
                break
            if not batch and wait == 0:
                self._stopping.wait(min(left, 0.1))  # under a second of window left: no long poll
        return messages

    def _run_batch(self, messages: list[dict[str, Any]]) -> None:
        try:
            with self.function.activity.running():
                self._process(messages)
        except Exception:
            if not self._stopping.is_set():
                log.exception("%s: a batch could not be settled", self.name)
        finally:
            self._slots.release()

    def _process(self, messages: list[dict[str, Any]]) -> None:
        ids = [message["MessageId"] for message in messages]
        try:
            result = self.function.invoke(sqs_event(messages, self.source.queue_arn, self._region))
            failed = failed_message_ids(result, ids) if self.source.reports_batch_item_failures else set()
        except InvocationError as error:
            if not self._stopping.is_set():
                log.warning(
                    "%s failed on a batch of %d message(s), all will be redelivered: %s",
                    self.function.spec.logical_id,
                    len(ids),
                    error,
                )
            failed = set(ids)
        handles = {message["MessageId"]: message["ReceiptHandle"] for message in messages}
        done = [mid for mid in ids if mid not in failed]
        for chunk in _chunks(done, 10):
            response = self._sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": handles[mid]} for i, mid in enumerate(chunk)],
            )
            for failure in response.get("Failed", []):
                log.warning("%s: could not delete a message: %s", self.name, failure)
        # Chaos mode: SQS is at-least-once; deliver some messages again (`duplicate_delivery`).
        for message in messages:
            if self._duplicates.roll():
                group = message.get("Attributes", {}).get("MessageGroupId")
                self._admin_sqs.send_message(
                    QueueUrl=self.queue_url,
                    MessageBody=message["Body"],
                    **({"MessageGroupId": group} if group else {}),
                )
        retry = [mid for mid in ids if mid in failed]
        for chunk in _chunks(retry, 10):
            self._admin_sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": handles[mid], "VisibilityTimeout": self._delay}
                    for i, mid in enumerate(chunk)
                ],
            )


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def scheduled_event(rule_arn: str, account: str, region: str) -> dict[str, Any]:
    """An EventBridge "Scheduled Event", as a schedule rule sends it to Lambda."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


class ScheduleRunner(threading.Thread):
    """Invokes a function asynchronously every `interval` seconds (first call one interval after start).

    The event is the declared `Input` JSON if any, else a Scheduled Event. Each tick is an invocation of
    its own, whether or not the previous one has ended; a tick the function has no free environment for
    is dropped (Lambda would retry the throttled event later; the next tick comes first here). Errors
    are logged (EventBridge's asynchronous retries are not emulated).
    """

    def __init__(
        self,
        function: Invoker,
        source: ScheduleEventSpec,
        interval: float,
        stack_name: str,
        account: str,
        region: str,
        stopping: threading.Event,
    ) -> None:
        super().__init__(name=f"schedule-{function.spec.logical_id}-{source.name}", daemon=True)
        self.function, self.source, self.interval = function, source, interval
        self._rule_arn = (
            f"arn:aws:events:{region}:{account}:rule/{stack_name}-{function.spec.logical_id}{source.name}"
        )
        self._account, self._region, self._stopping = account, region, stopping
        self._ticks: list[threading.Thread] = []

    def run(self) -> None:
        """Tick until the stack stops."""
        while not self._stopping.wait(self.interval):
            event = (
                json.loads(self.source.input)
                if self.source.input is not None
                else scheduled_event(self._rule_arn, self._account, self._region)
            )
            tick = threading.Thread(target=self._invoke, args=(event,), daemon=True, name=f"{self.name}-tick")
            self._ticks = [thread for thread in self._ticks if thread.is_alive()] + [tick]
            tick.start()

    def join_batches(self, timeout: float) -> list[threading.Thread]:
        """Wait up to `timeout` seconds in all for running ticks; those still running."""
        deadline = time.monotonic() + timeout
        for thread in list(self._ticks):
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread for thread in self._ticks if thread.is_alive()]

    def _invoke(self, event: dict[str, Any]) -> None:
        try:
            self.function.invoke(event, block=False)
        except Throttled:
            log.info("%s: throttled, this tick is dropped", self.name)
        except InvocationError as error:
            if not self._stopping.is_set():
                log.warning("%s: scheduled invocation failed: %s", self.name, error)


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
    succeeded). Rules of https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html:
    the lowest reported sequence number is retried with every record after it; a malformed answer or an
    unknown `itemIdentifier` fails the whole batch."""
    numbers = [record["dynamodb"]["SequenceNumber"] for record in records]
    if result is None:
        return None
    if not isinstance(result, dict):
        return 0
    if not result.get("batchItemFailures"):
        return None
    failures = result["batchItemFailures"]
    if not isinstance(failures, list):
        return 0
    found = []
    for item in failures:
        identifier = item.get("itemIdentifier") if isinstance(item, dict) else None
        if identifier not in numbers:
            return 0
        found.append(numbers.index(identifier))
    return min(found)


class DynamoDbStreamSource(threading.Thread):
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
        super().__init__(name=f"ddb-{function.spec.logical_id}-{source.name}", daemon=True)
        from moto.events.models import EventPattern

        self.function, self.source = function, source
        self._streams, self._region, self._stopping = streams, region, stopping
        self._delay, self._poll = max(0.0, redelivery_delay), poll_seconds
        self._patterns = [EventPattern.load(pattern) for pattern in source.filter_patterns]
        self._batches: list[threading.Thread] = []
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

    def join_batches(self, timeout: float) -> list[threading.Thread]:
        """Invocations run on the poller thread: nothing else to wait for."""
        return []

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
