"""Webhook deliveries: POST an OpenAI-shaped event (`wire.webhooks`) to the URL the batch's account
registered, signed as the Standard Webhooks specification says, by its `standardwebhooks` package
(https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md).

Headers: `webhook-id` (the event id, the same on every delivery of that event, so a receiver drops
duplicates), `webhook-timestamp` (Unix seconds of this attempt) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` with the account's secret; during the grace
after a rotation a second `v1,...` with the previous secret, space-separated). A 2xx answer is
delivered; anything else (an answer, a refused connection, a timeout) fails the message, which
WebhookQueue delivers again after `backoff_seconds`, then its DLQ.

One invocation delivers its records at once (`Deliveries`): each account has at most
`Settings.webhook_account_in_flight` POSTs in flight, each POST at most `webhook_timeout_seconds`, and
none starts that could not end before the invocation's deadline; a record left untried (`Untried`)
comes back as it is. So a slow or silent receiver delays only its own account's webhooks.

A POST goes only to a public address (`core.netguard`), checked on the addresses the host resolves
to when connecting (`GuardedResolver`); redirects are not followed; logs and errors show the URL
without its query or credentials.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from standardwebhooks import Webhook

from batchinfer.core.netguard import ForbiddenAddress, check_url, forbidden, safe_url
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts
from batchinfer.wire.webhooks import WebhookData, WebhookEvent

# After its n-th failed try (1-based) a delivery waits this long times 2**(n-1), at most
# `MAX_BACKOFF_SECONDS` (an SQS visibility timeout is at most 12 hours): 5, 10, 20, 40 minutes between
# WebhookQueue's 5 tries.
BASE_BACKOFF_SECONDS = 300
MAX_BACKOFF_SECONDS = 43_200
# A POST shorter than this is not worth starting: its record is left for the next invocation instead.
MIN_POST_SECONDS = 0.5


class DeliveryFailed(RuntimeError):
    """The receiver did not answer 2xx (`status` None: no answer at all)."""

    def __init__(self, url: str, status: int | None, reason: str) -> None:
        super().__init__(f"webhook to {safe_url(url)} failed: {status or reason}")
        self.status = status


class Untried(RuntimeError):
    """The invocation's deadline came before this delivery could start (its account's other POSTs held
    every slot): nothing was sent, and the message comes back as it is."""


@dataclass
class Deliveries:
    """The deliveries of one invocation: no POST starts after `deadline` minus its timeout (a
    `time.monotonic()` value), and at most `per_account` run at once for one account."""

    deadline: float
    per_account: int
    timeout: float
    _slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    @classmethod
    def until(cls, deadline: float) -> Deliveries:
        """Deliveries ending by `deadline`, with the deployment's timeout and per-account cap."""
        settings = get_settings()
        return cls(deadline, settings.webhook_account_in_flight, settings.webhook_timeout_seconds)

    def slot(self, account_id: str) -> asyncio.Semaphore:
        """The account's in-flight cap (one semaphore per account, made on first use)."""
        return self._slots.setdefault(account_id, asyncio.Semaphore(self.per_account))

    def seconds_left(self) -> float:
        """Seconds the next POST may take: its timeout, less near the deadline."""
        return min(self.timeout, self.deadline - time.monotonic())


def backoff_seconds(receive_count: int) -> int:
    """Seconds before the next try of a message received `receive_count` times (1, 2, ...)."""
    return min(MAX_BACKOFF_SECONDS, BASE_BACKOFF_SECONDS * 2 ** max(0, receive_count - 1))


def signed_request(
    event: WebhookEvent, secrets: str | list[str], at: datetime
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one delivery of `event` at time `at`, signed with the secret, or with
    each of a list of them (the current one first; a rotated-out one during its grace):
    `webhook-signature` holds one `v1,<signature>` per secret, space-separated, as Standard Webhooks
    allows."""
    body = event.model_dump_json()
    secrets = [secrets] if isinstance(secrets, str) else secrets
    signature = " ".join(Webhook(secret).sign(msg_id=event.id, timestamp=at, data=body) for secret in secrets)
    return body.encode(), {
        "content-type": "application/json",
        "webhook-id": event.id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


async def deliver(
    deliveries: Deliveries, *, batch_id: str, account_id: str, type: str, event_id: str, created_at: int
) -> str:
    """Deliver one webhook event within `deliveries`' limits; `delivered`, or `no_webhook` when the
    account registered none (then nothing is sent, and the event is done).

    Raises DeliveryFailed: no 2xx answer within the POST's timeout. Raises Untried: no slot of the
    account freed in time for a POST to end before the deadline.
    """
    account = await asyncio.to_thread(accounts.get_account, account_id)
    if not account.webhook_url or not account.webhook_secret:
        return "no_webhook"
    event = WebhookEvent(id=event_id, type=type, created_at=created_at, data=WebhookData(id=batch_id))  # type: ignore[arg-type]
    slot = deliveries.slot(account_id)
    try:
        await asyncio.wait_for(slot.acquire(), deliveries.deadline - time.monotonic() - MIN_POST_SECONDS)
    except TimeoutError as error:
        raise Untried(f"no slot for account {account_id} before the deadline") from error
    try:
        seconds = deliveries.seconds_left()
        if seconds < MIN_POST_SECONDS:
            raise Untried(f"{seconds:.1f} s left before the deadline")
        at = datetime.now(UTC)
        body, headers = signed_request(event, account.webhook_secrets(int(at.timestamp())), at)
        await _post(account.webhook_url, body, headers, seconds)
    finally:
        slot.release()
    return "delivered"


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a name any of whose addresses is not public (`OSError`, which
    aiohttp raises as a `ClientConnectorError`): a connection only ever goes to a checked address."""

    def __init__(self, *, allow_loopback: bool = False) -> None:
        self._resolver = DefaultResolver()
        self._allow_loopback = allow_loopback

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The addresses of `host`; raises OSError when one of them is forbidden."""
        found = await self._resolver.resolve(host, port, family)
        if any(
            forbidden(ipaddress.ip_address(r["host"]), allow_loopback=self._allow_loopback) for r in found
        ):
            raise OSError(f"webhook host {host} resolves to an address that is not public")
        return found

    async def close(self) -> None:
        """Close the wrapped resolver."""
        await self._resolver.close()


async def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    allow_loopback = get_settings().webhook_allow_loopback
    try:
        check_url(url, allow_loopback=allow_loopback)
    except ForbiddenAddress as error:
        raise DeliveryFailed(url, None, str(error)) from None
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(allow_loopback=allow_loopback))
    try:
        async with (
            aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as session,
            session.post(url, data=body, headers=headers, allow_redirects=False) as response,
        ):
            if not 200 <= response.status < 300:
                raise DeliveryFailed(url, response.status, response.reason or "")
    except (aiohttp.ClientError, TimeoutError) as error:
        raise DeliveryFailed(url, None, type(error).__name__) from error
