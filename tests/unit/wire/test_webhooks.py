"""OpenAI's webhook event shape and its stable ids."""

from __future__ import annotations

from batchinfer.wire.status import BatchStatus
from batchinfer.wire.webhooks import WEBHOOK_TYPES, WebhookData, WebhookEvent, event_id


def test_the_event_id_is_stable_per_batch_and_type() -> None:
    first = event_id("batch_a", "batch.completed")
    assert first == event_id("batch_a", "batch.completed")
    assert len(first) == 36 and first.startswith("evt_")
    assert len({first, event_id("batch_a", "batch.failed"), event_id("batch_b", "batch.completed")}) == 3


def test_webhooks_are_sent_for_the_four_endings_only() -> None:
    assert WEBHOOK_TYPES == {
        BatchStatus.COMPLETED: "batch.completed",
        BatchStatus.FAILED: "batch.failed",
        BatchStatus.EXPIRED: "batch.expired",
        BatchStatus.CANCELLED: "batch.cancelled",
    }


def test_the_event_serializes_as_openai_sends_it() -> None:
    event = WebhookEvent(
        id="evt_1", type="batch.expired", created_at=1_800_000_000, data=WebhookData(id="batch_a")
    )
    assert event.model_dump_json() == (
        '{"object":"event","id":"evt_1","type":"batch.expired","created_at":1800000000,"data":{"id":"batch_a"}}'
    )
