"""Webhook signing (Standard Webhooks) and the retry backoff."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

import pytest
from openai import OpenAI
from standardwebhooks import Webhook, WebhookVerificationError

from batchinfer.pipeline.webhooks import backoff_seconds, signed_request
from batchinfer.wire.webhooks import WebhookData, WebhookEvent

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
EVENT = WebhookEvent(
    id="evt_1", type="batch.completed", created_at=1_800_000_000, data=WebhookData(id="batch_a")
)


def test_a_delivery_is_signed_as_the_standard_webhooks_specification_says() -> None:
    at = datetime.now(UTC).replace(microsecond=0)
    body, headers = signed_request(EVENT, SECRET, at)
    timestamp = str(int(at.timestamp()))
    assert body == EVENT.model_dump_json().encode()
    # The spec's signature: base64 HMAC-SHA256 of "<id>.<timestamp>.<body>" keyed by the secret's bytes
    expected = base64.b64encode(
        hmac.new(b"k" * 32, b"evt_1." + timestamp.encode() + b"." + body, hashlib.sha256).digest()
    )
    assert headers == {
        "content-type": "application/json",
        "webhook-id": "evt_1",
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + expected.decode(),
    }
    assert Webhook(SECRET).verify(body, headers) == EVENT.model_dump()


def test_a_delivery_older_than_five_minutes_does_not_verify() -> None:
    body, headers = signed_request(EVENT, SECRET, datetime(2026, 1, 1, tzinfo=UTC))
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(SECRET).verify(body, headers)


@pytest.mark.parametrize(("tries", "seconds"), [(1, 300), (2, 600), (3, 1200), (4, 2400), (9, 43_200)])
def test_backoff_doubles_up_to_the_longest_sqs_visibility(tries: int, seconds: int) -> None:
    assert backoff_seconds(tries) == seconds


@pytest.mark.parametrize("kind", ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"])
def test_the_openai_sdk_unwraps_a_delivery_into_its_batch_event(kind: str) -> None:
    # The official SDK's verifier and models (client.webhooks.unwrap): the shape and signature OpenAI sends.
    event = WebhookEvent(id="evt_2", type=kind, created_at=1_800_000_000, data=WebhookData(id="batch_a"))  # type: ignore[arg-type]
    body, headers = signed_request(event, SECRET, datetime.now(UTC))
    unwrapped = OpenAI(api_key="unused", webhook_secret=SECRET).webhooks.unwrap(body.decode(), headers)
    assert type(unwrapped).__name__ == "Batch" + kind.removeprefix("batch.").capitalize() + "WebhookEvent"
    assert (unwrapped.id, unwrapped.type, unwrapped.created_at, unwrapped.data.id) == (
        "evt_2",
        kind,
        1_800_000_000,
        "batch_a",
    )


def test_a_delivery_during_a_rotation_carries_both_signatures_each_verifying() -> None:
    # Given the current secret and the one rotated out, still in its grace
    old = "whsec_" + base64.b64encode(b"o" * 32).decode()
    at = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
    # When a delivery is signed with both
    body, headers = signed_request(EVENT, [SECRET, old], at)
    # Then `webhook-signature` holds both, space-separated, the current one first
    assert headers["webhook-timestamp"] == "1800000000"
    assert headers["webhook-signature"] == (
        "v1,yGfzi5DfDo/yOuyotY7+qZER3cDw+RE7JLtx0gmj5q4= v1,xil0+SoDrMcsjy0PhrGNtE4kJSZN++KbIxHmlWV1GHE="
    )
    expected_old = hmac.new(b"o" * 32, b"evt_1.1800000000." + body, hashlib.sha256).digest()
    assert headers["webhook-signature"].split(" ")[1] == "v1," + base64.b64encode(expected_old).decode()
    # And a receiver holding either secret accepts it: standardwebhooks, and the openai SDK's verifier
    body, headers = signed_request(EVENT, [SECRET, old], datetime.now(UTC))
    for secret in (SECRET, old):
        assert Webhook(secret).verify(body, headers) == EVENT.model_dump()
        client = OpenAI(api_key="unused", webhook_secret=secret)
        assert client.webhooks.unwrap(body.decode(), headers).id == "evt_1"
