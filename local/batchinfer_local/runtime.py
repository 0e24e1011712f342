"""Invoke handlers the way Lambda does: a Lambda context, SQS event-source pollers, schedules.

Event shapes follow the Lambda developer guide:
- SQS: https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html (event, partial batch responses)
- Schedule: https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-run-lambda-schedule.html
Each function has one execution environment: its invocations are serialized, as concurrent
calls into one module would share state (e.g. a Powertools resolver's current event) that
Lambda keeps apart.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from batchinfer.core import chaos

from .functions import FunctionSpec, Handler, ScheduleEventSpec, SqsEventSpec
from .moto_compat import md5_hex

log = logging.getLogger(__name__)


class LocalLambdaContext(LambdaContext):
    """The `context` argument of a local invocation (Powertools' `LambdaContext` interface).

    `get_remaining_time_in_millis()` counts down from the function's Timeout, floored at 0.
    """

    def __init__(self, spec: FunctionSpec, request_id: str | None = None) -> None:
        self._function_name = spec.function_name
        self._function_version = "$LATEST"
        self._invoked_function_arn = spec.function_arn
        self._memory_limit_in_mb = spec.memory_size
        self._aws_request_id = request_id or str(uuid.uuid4())
        self._log_group_name = f"/aws/lambda/{spec.function_name}"
        self._log_stream_name = f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"
        self._identity = None  # type: ignore[assignment]
        self._client_context = None  # type: ignore[assignment]
        self._deadline = time.monotonic() + spec.timeout

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]
        """Milliseconds left before the function's Timeout (0 once it has passed)."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class InvocationTimeout(RuntimeError):
    """The handler returned after the function's Timeout; Lambda would have failed the invocation."""


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


class FunctionRuntime:
    """One function's execution environment: its loaded handler and a lock serializing invocations."""

    def __init__(self, spec: FunctionSpec, handler: Handler, activity: Activity) -> None:
        self.spec = spec
        self.handler = handler
        self.activity = activity
        self.invocations = 0
        self._lock = threading.Lock()

    def invoke(self, event: dict[str, Any]) -> Any:
        """Call the handler with a JSON copy of `event` and a fresh context; return its JSON result.

        Raises:
            Exception: whatever the handler raised.
            InvocationTimeout: the handler took longer than the function's Timeout.
            TypeError: the result is not JSON-serializable (Lambda's Runtime.MarshalError).
        """
        # Lambda hands over a freshly parsed payload and serializes the result.
        payload = json.loads(json.dumps(event))
        with self.activity.running(), self._lock:
            context = LocalLambdaContext(self.spec)
            self.invocations += 1
            started = time.monotonic()
            result = self.handler(payload, context)
            elapsed = time.monotonic() - started
        if elapsed > self.spec.timeout:
            raise InvocationTimeout(
                f"{self.spec.logical_id}: Task timed out after {self.spec.timeout:.2f} seconds ({elapsed:.2f} s)"
            )
        return json.loads(json.dumps(result))


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
                name: _message_attribute(value) for name, value in (message.get("MessageAttributes") or {}).items()
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


class SqsPoller(threading.Thread):
    """Lambda's SQS event source mapping for one function and queue, as a thread.

    Receives up to BatchSize messages (long polling 1 s), invokes the handler, deletes the
    messages that succeeded and makes the failed ones visible again after `redelivery_delay`
    seconds (SQS takes whole seconds). A handler error fails the whole batch; with
    ReportBatchItemFailures only the reported messages fail. Moving a message to the DLQ after
    maxReceiveCount receives is done by SQS (moto) on receive, as in AWS. `transform`, if given,
    rewrites each body before delivery (see `moto_compat`), with md5OfBody recomputed.
    """

    def __init__(
        self,
        runtime: FunctionRuntime,
        source: SqsEventSpec,
        queue_url: str,
        sqs: Any,
        region: str,
        redelivery_delay: float,
        stopping: threading.Event,
        transform: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(name=f"sqs-{runtime.spec.logical_id}-{source.name}", daemon=True)
        self.runtime, self.source, self.queue_url = runtime, source, queue_url
        self._transform = transform
        self._sqs, self._region, self._stopping = sqs, region, stopping
        self._delay = max(0, round(redelivery_delay))

    def run(self) -> None:
        """Poll until the stack stops; errors are logged and polling continues."""
        while not self._stopping.is_set():
            try:
                messages = self._receive()
                if messages:
                    with self.runtime.activity.running():
                        self._process(messages)
            except Exception:
                if self._stopping.is_set():
                    return  # moto is shutting down under us
                log.exception("%s: polling failed", self.name)
                self._stopping.wait(1.0)

    def _receive(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        while len(messages) < self.source.batch_size:
            response = self._sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, self.source.batch_size - len(messages)),
                WaitTimeSeconds=0 if messages else 1,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            batch = response.get("Messages", [])
            if self._transform is not None:
                for message in batch:
                    body = self._transform(message["Body"])
                    if body != message["Body"]:
                        message["Body"], message["MD5OfBody"] = body, md5_hex(body)
            messages.extend(batch)
            if not batch or self._stopping.is_set():
                break
        return messages

    def _process(self, messages: list[dict[str, Any]]) -> None:
        ids = [message["MessageId"] for message in messages]
        try:
            result = self.runtime.invoke(sqs_event(messages, self.source.queue_arn, self._region))
            failed = failed_message_ids(result, ids) if self.source.reports_batch_item_failures else set()
        except Exception:
            log.exception("%s failed on a batch of %d message(s); all will be redelivered", self.runtime.spec.logical_id, len(ids))
            failed = set(ids)
        handles = {message["MessageId"]: message["ReceiptHandle"] for message in messages}
        done = [mid for mid in ids if mid not in failed]
        for chunk in _chunks(done, 10):
            response = self._sqs.delete_message_batch(
                QueueUrl=self.queue_url, Entries=[{"Id": str(i), "ReceiptHandle": handles[mid]} for i, mid in enumerate(chunk)]
            )
            for failure in response.get("Failed", []):
                log.warning("%s: could not delete a message: %s", self.name, failure)
        # Chaos mode: SQS is at-least-once; deliver some messages again (`duplicate_delivery`).
        for message in messages:
            if chaos.roll("duplicate_delivery"):
                self._sqs.send_message(QueueUrl=self.queue_url, MessageBody=message["Body"])
        retry = [mid for mid in ids if mid in failed]
        for chunk in _chunks(retry, 10):
            self._sqs.change_message_visibility_batch(
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
    """Invokes a function every `interval` seconds (first call one interval after start).

    The event is the declared `Input` JSON if any, else a Scheduled Event. Errors are logged
    (EventBridge's asynchronous retries are not emulated).
    """

    def __init__(
        self,
        runtime: FunctionRuntime,
        source: ScheduleEventSpec,
        interval: float,
        stack_name: str,
        account: str,
        region: str,
        stopping: threading.Event,
    ) -> None:
        super().__init__(name=f"schedule-{runtime.spec.logical_id}-{source.name}", daemon=True)
        self.runtime, self.source, self.interval = runtime, source, interval
        self._rule_arn = f"arn:aws:events:{region}:{account}:rule/{stack_name}-{runtime.spec.logical_id}{source.name}"
        self._account, self._region, self._stopping = account, region, stopping

    def run(self) -> None:
        """Tick until the stack stops."""
        while not self._stopping.wait(self.interval):
            event = (
                json.loads(self.source.input)
                if self.source.input is not None
                else scheduled_event(self._rule_arn, self._account, self._region)
            )
            try:
                self.runtime.invoke(event)
            except Exception:
                log.exception("%s: scheduled invocation failed", self.name)
