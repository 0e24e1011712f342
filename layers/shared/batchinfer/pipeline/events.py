"""Batch status events: every status change of a batch header, read from the table's stream, becomes
an EventBridge event and, for an ending, a webhook delivery (`webhooks`).

Published from the DynamoDB stream (StatusEventsFunction), not by the writers: a function that dies
right after its conditional status write loses no event, and no writer needs to know about events.
At least once: a retried stream batch publishes its events again (the same `id`s in `detail`, the
same webhook ids), so consumers dedupe by `(detail.id, detail-type)` if they must.

EventBridge event (https://docs.aws.amazon.com/eventbridge/latest/ref/events-structure.html):
`source` `batchinfer`, `detail-type` `batch.<status>` (e.g. `batch.in_progress`, `batch.completed`),
`detail` the public OpenAI Batch object as the header holds it at that change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from pydantic import BaseModel

from batchinfer.core.aws import client
from batchinfer.core.observability import metrics
from batchinfer.core.settings import get_settings
from batchinfer.data import keys, sqs
from batchinfer.data.items import BatchHeader
from batchinfer.wire.openai import Batch
from batchinfer.wire.status import BatchStatus, is_terminal
from batchinfer.wire.webhooks import WEBHOOK_TYPES, WebhookType, event_id

SOURCE = "batchinfer"


class WebhookMessage(BaseModel):
    """Body of a WebhookQueue message: one webhook event of one batch, for its account."""

    batch_id: str
    account_id: str
    type: WebhookType
    event_id: str
    created_at: int


class StatusChange(BaseModel):
    """A header write that changed the status: the header after it, and the status before (None: created)."""

    header: BatchHeader
    before: BatchStatus | None


def is_batch_header(item_keys: Mapping[str, Any]) -> bool:
    """Whether a stream record's `Keys` (deserialized) are a batch header's (`data.keys.batch`)."""
    return str(item_keys.get("PK", "")).startswith(keys.BATCH_PREFIX) and item_keys.get("SK") == keys.META


def status_change(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> StatusChange | None:
    """The status change of one stream record's images (plain values), or None when the write left the
    status as it was (progress, counts, sealing) or removed the item."""
    if not new:
        return None
    before = BatchStatus(old["status"]) if old and "status" in old else None
    header = BatchHeader.model_validate(new)
    return None if before == header.status else StatusChange(header=header, before=before)


def batch_object(header: BatchHeader) -> Batch:
    """The public Batch object of a header (its internal attributes dropped; the counts shown to GET)."""
    counts, usage = header.shown_counts()
    shown = header.model_copy(update={"request_counts": counts, "usage": usage})
    return Batch.model_validate(shown.model_dump(include=set(Batch.model_fields), exclude_none=True))


def event_entry(change: StatusChange) -> dict[str, Any]:
    """The PutEvents entry of a status change (`detail-type` `batch.<status>`)."""
    return {
        "Source": SOURCE,
        "DetailType": f"batch.{change.header.status.value}",
        "Detail": batch_object(change.header).model_dump_json(),
        "EventBusName": get_settings().event_bus_name,
    }


def webhook_message(change: StatusChange) -> WebhookMessage | None:
    """The webhook delivery of an ending (`wire.webhooks.WEBHOOK_TYPES`), else None."""
    header = change.header
    kind = WEBHOOK_TYPES.get(header.status)
    if kind is None:
        return None
    at = getattr(header, f"{header.status.value}_at", None) or header.created_at
    return WebhookMessage(
        batch_id=header.id,
        account_id=header.account_id,
        type=kind,
        event_id=event_id(header.id, kind),
        created_at=at,
    )


def publish(change: StatusChange) -> None:
    """Put the change's EventBridge event, then queue its webhook (an ending, with a webhook queue).

    Raises RuntimeError when EventBridge refuses the entry (the stream record is then retried).
    """
    failed = client("events").put_events(Entries=[event_entry(change)])
    if failed.get("FailedEntryCount"):
        entry = failed["Entries"][0]
        raise RuntimeError(
            f"EventBridge refused the event: {entry.get('ErrorCode')} {entry.get('ErrorMessage')}"
        )
    message, queue = webhook_message(change), get_settings().webhook_queue_url
    if message is not None and queue:
        sqs.send(queue, [message], group_id=message.account_id)
    _count(change)


def _count(change: StatusChange) -> None:
    if change.before is None:
        metrics.add_metric(name="BatchesCreated", unit=MetricUnit.Count, value=1)
    if is_terminal(change.header.status):
        # A dimension of this metric alone: the handler's other metrics keep just `service`.
        with single_metric(
            name="BatchesEnded", unit=MetricUnit.Count, value=1, namespace=metrics.namespace
        ) as metric:
            metric.add_dimension(name="service", value=metrics.service or SOURCE)
            metric.add_dimension(name="status", value=change.header.status.value)


def images(record_images: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A stream image (Powertools' deserialized `new_image` / `old_image`: Decimals for numbers) as
    plain JSON values."""
    return json.loads(json.dumps(record_images, default=_number)) if record_images else None


def _number(value: Any) -> Any:
    return int(value) if value == int(value) else float(value)
