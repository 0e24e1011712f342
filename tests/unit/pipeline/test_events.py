"""Which stream records are status changes, and the event and webhook each makes."""

from __future__ import annotations

import pytest

from batchinfer.pipeline import events
from batchinfer.wire.status import BatchStatus
from batchinfer.wire.webhooks import event_id
from support.data import batch_header


def image(**fields: object) -> dict:
    return batch_header(id="batch_a", account="acme", **fields).stored()


def test_a_write_that_leaves_the_status_as_it_was_is_no_change() -> None:
    before = image(status="in_progress", in_progress_at=1_800_000_001)
    after = {**before, "progress_at": 1_800_000_005}
    assert events.status_change(before, after) is None
    assert events.status_change(before, None) is None  # a deletion


def test_a_creation_and_a_transition_are_changes() -> None:
    created = events.status_change(None, image())
    assert created is not None and (created.before, created.header.status) == (None, BatchStatus.VALIDATING)
    moved = events.status_change(image(), image(status="failed", failed_at=1_800_000_009))
    assert moved is not None and (moved.before, moved.header.status) == (
        BatchStatus.VALIDATING,
        BatchStatus.FAILED,
    )


def test_the_event_is_the_public_batch_object_named_by_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLE_NAME", "t")
    monkeypatch.setenv("BUCKET_NAME", "b")
    events.get_settings.cache_clear()
    change = events.status_change(image(), image(status="failed", failed_at=1_800_000_009))
    assert change is not None
    entry = events.event_entry(change)
    assert (entry["Source"], entry["DetailType"], entry["EventBusName"]) == (
        "batchinfer",
        "batch.failed",
        "default",
    )
    detail = events.batch_object(change.header).model_dump(mode="json")
    assert entry["Detail"] == events.batch_object(change.header).model_dump_json()
    assert (detail["id"], detail["status"], detail["failed_at"]) == ("batch_a", "failed", 1_800_000_009)
    assert not {"account_id", "input_bucket", "output_prefix", "live", "sealed"} & set(detail)
    events.get_settings.cache_clear()


@pytest.mark.parametrize(
    ("status", "stamp", "kind"),
    [
        ("completed", "completed_at", "batch.completed"),
        ("failed", "failed_at", "batch.failed"),
        ("expired", "expired_at", "batch.expired"),
        ("cancelled", "cancelled_at", "batch.cancelled"),
    ],
)
def test_an_ending_gets_a_webhook_stamped_with_its_time(status: str, stamp: str, kind: str) -> None:
    change = events.status_change(image(status="finalizing"), image(status=status, **{stamp: 1_800_000_042}))
    assert change is not None
    assert events.webhook_message(change) == events.WebhookMessage(
        batch_id="batch_a",
        account_id="acme",
        type=kind,
        event_id=event_id("batch_a", kind),
        created_at=1_800_000_042,
    )


@pytest.mark.parametrize("status", ["in_progress", "finalizing", "cancelling"])
def test_other_statuses_get_no_webhook(status: str) -> None:
    change = events.status_change(image(), image(status=status))
    assert change is not None and events.webhook_message(change) is None


def test_only_batch_headers_are_batch_headers() -> None:
    assert events.is_batch_header({"PK": "BATCH#batch_a", "SK": "META"})
    assert not events.is_batch_header({"PK": "BATCH#batch_a", "SK": "SHARD#00001"})
    assert not events.is_batch_header({"PK": "ACCOUNT#acme", "SK": "META"})
