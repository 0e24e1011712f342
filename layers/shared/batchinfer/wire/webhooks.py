"""Webhook events in OpenAI's shape: `{"object": "event", "id", "type", "created_at", "data": {"id"}}`.

https://platform.openai.com/docs/guides/webhooks (batch events: `batch.completed`, `batch.failed`,
`batch.expired`, `batch.cancelled`; `data.id` is the batch id). Deliveries are signed as the Standard
Webhooks specification says (https://www.standardwebhooks.com): `pipeline.webhooks`.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel

from batchinfer.wire.status import BatchStatus

WebhookType = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]

# The terminal statuses OpenAI sends a webhook for, and the event type of each.
WEBHOOK_TYPES: dict[BatchStatus, WebhookType] = {
    BatchStatus.COMPLETED: "batch.completed",
    BatchStatus.FAILED: "batch.failed",
    BatchStatus.EXPIRED: "batch.expired",
    BatchStatus.CANCELLED: "batch.cancelled",
}


class WebhookData(BaseModel):
    """The event's object: the batch, by id."""

    id: str


class WebhookEvent(BaseModel):
    """One webhook event; `created_at` is Unix seconds (the batch's `<status>_at`, so a redelivery
    sends the same body)."""

    object: Literal["event"] = "event"
    id: str
    type: WebhookType
    created_at: int
    data: WebhookData


def event_id(batch_id: str, event_type: str) -> str:
    """The stable id of the event `event_type` of `batch_id`: `evt_` and 32 hex digits of a SHA-256.

    It is also the Standard Webhooks `webhook-id` header, the same on every delivery of that event, so
    a receiver drops duplicates by it (deliveries are at least once).
    """
    return "evt_" + hashlib.sha256(f"{batch_id}/{event_type}".encode()).hexdigest()[:32]
