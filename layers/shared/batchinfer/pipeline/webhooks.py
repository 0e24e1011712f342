"""Webhook deliveries: POST an OpenAI-shaped event (`wire.webhooks`) to the URL the batch's account
registered, signed as the Standard Webhooks specification says, by its `standardwebhooks` package
(https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md).

Headers: `webhook-id` (the event id, the same on every delivery of that event, so a receiver drops
duplicates), `webhook-timestamp` (Unix seconds of this attempt) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` with the account's secret). A 2xx answer is
delivered; anything else (an answer, a refused connection, a timeout) fails the message, which
WebhookQueue delivers again after `backoff_seconds`, then its DLQ.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import aiohttp
from standardwebhooks import Webhook

from batchinfer.core.settings import get_settings
from batchinfer.data import accounts
from batchinfer.wire.webhooks import WebhookData, WebhookEvent

# After its n-th failed try (1-based) a delivery waits this long times 2**(n-1), at most
# `MAX_BACKOFF_SECONDS` (an SQS visibility timeout is at most 12 hours): 5, 10, 20, 40 minutes between
# WebhookQueue's 5 tries.
BASE_BACKOFF_SECONDS = 300
MAX_BACKOFF_SECONDS = 43_200


class DeliveryFailed(RuntimeError):
    """The receiver did not answer 2xx (`status` None: no answer at all)."""

    def __init__(self, url: str, status: int | None, reason: str) -> None:
        super().__init__(f"webhook to {url} failed: {status or reason}")
        self.status = status


def backoff_seconds(receive_count: int) -> int:
    """Seconds before the next try of a message received `receive_count` times (1, 2, ...)."""
    return min(MAX_BACKOFF_SECONDS, BASE_BACKOFF_SECONDS * 2 ** max(0, receive_count - 1))


def signed_request(event: WebhookEvent, secret: str, at: datetime) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one delivery of `event` at time `at`."""
    body = event.model_dump_json()
    signature = Webhook(secret).sign(msg_id=event.id, timestamp=at, data=body)
    return body.encode(), {
        "content-type": "application/json",
        "webhook-id": event.id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def deliver(*, batch_id: str, account_id: str, type: str, event_id: str, created_at: int) -> str:
    """Deliver one webhook event; `delivered`, or `no_webhook` when the account registered none (then
    nothing is sent, and the event is done).

    Raises DeliveryFailed: no 2xx answer within `Settings.webhook_timeout_seconds`.
    """
    account = accounts.get_account(account_id)
    if not account.webhook_url or not account.webhook_secret:
        return "no_webhook"
    event = WebhookEvent(id=event_id, type=type, created_at=created_at, data=WebhookData(id=batch_id))  # type: ignore[arg-type]
    body, headers = signed_request(event, account.webhook_secret, datetime.now(UTC))
    asyncio.run(_post(account.webhook_url, body, headers, get_settings().webhook_timeout_seconds))
    return "delivered"


async def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.post(url, data=body, headers=headers, allow_redirects=False) as response,
        ):
            if not 200 <= response.status < 300:
                raise DeliveryFailed(url, response.status, response.reason or "")
    except (aiohttp.ClientError, TimeoutError) as error:
        raise DeliveryFailed(url, None, type(error).__name__) from error
