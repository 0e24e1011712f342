"""Lambda's SQS event source mapping: `SqsPoller`, the event it sends and chaos mode's duplicates.

Rules of https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html (event, partial batch responses,
batching window) and https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html (maximum
concurrency of the mapping). S3 notifications reach their function this way too: through the queue
they are sent to, each body completed by `transform` (`moto_compat.complete_s3_notification`).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..functions import SqsEventSpec
from ..moto_compat import md5_hex
from ..runtime import InvocationError, Invoker
from .poller import Poller, reported_failures

log = logging.getLogger(__name__)

# SQS's most entries in one DeleteMessageBatch / ChangeMessageVisibilityBatch, and messages per receive.
SQS_BATCH_LIMIT = 10


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
    """The message ids to redeliver, from a handler's partial batch response (`reported_failures`'s
    rules): a malformed response, or one naming a message not of the batch, fails the whole batch."""
    failed = reported_failures(result, message_ids)
    return set(message_ids) if failed is None else failed


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


class SqsPoller(Poller):
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
        super().__init__("sqs", function, source, stopping)
        self.source, self.queue_url = source, queue_url
        self.concurrency = min(function.limit, source.maximum_concurrency or function.limit)
        self._transform = transform
        self._sqs, self._admin_sqs, self._region = sqs, admin_sqs, region
        self._delay = max(0, round(redelivery_delay))
        self._slots = threading.BoundedSemaphore(self.concurrency)
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
            self._spawn(self._run_batch, messages, "batch")

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
                MaxNumberOfMessages=min(SQS_BATCH_LIMIT, self.source.batch_size - len(messages)),
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
                try:
                    self._process(messages)
                except Exception:
                    if self._stopping.is_set():
                        return
                    log.exception("%s: a batch could not be settled, it will be redelivered", self.name)
                    self._settle(messages, {message["MessageId"] for message in messages})
        except Exception:
            if not self._stopping.is_set():
                log.exception("%s: a batch could not be made visible again", self.name)
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
        self._settle(messages, failed)

    def _settle(self, messages: list[dict[str, Any]], failed: set[str]) -> None:
        """Delete the messages that succeeded, redeliver (chaos) some, make the failed ones visible again."""
        ids = [message["MessageId"] for message in messages]
        handles = {message["MessageId"]: message["ReceiptHandle"] for message in messages}
        done = [mid for mid in ids if mid not in failed]
        for chunk in _chunks(done, SQS_BATCH_LIMIT):
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
        for chunk in _chunks(retry, SQS_BATCH_LIMIT):
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
