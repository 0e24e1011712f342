"""WebhookFunction delivers one invocation's records at once, each account capped, before the deadline:
a slow or silent receiver delays only its own account's webhooks, and nothing is delivered twice."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from standardwebhooks import Webhook, WebhookVerificationError

from batchinfer.core.settings import get_settings
from batchinfer.data import accounts
from batchinfer.wire.webhooks import event_id
from batchinfer_local.functions import load_handler
from batchinfer_local.runtime import LocalLambdaContext
from support.moto_env import Aws


class Receiver:
    """A loopback webhook receiver: answers 200 at once, after `slow_seconds`, or never (until closed),
    as the batch id of the event says (`instant_*`, `slow_*`, `silent_*`); records each arrival."""

    def __init__(self, slow_seconds: float) -> None:
        self.arrivals: list[tuple[str, float]] = []  # (webhook-id, time.monotonic())
        self.requests: list[tuple[bytes, dict[str, str]]] = []  # (body, headers)
        self.closed = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["content-length"]))
                receiver.requests.append((raw, dict(self.headers.items())))
                body = json.loads(raw)
                receiver.arrivals.append((self.headers["webhook-id"], time.monotonic()))
                kind = body["data"]["id"].split("_")[0]
                if kind == "silent" or (kind == "slow" and receiver.closed.wait(slow_seconds)):
                    receiver.closed.wait()
                    return
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook?token=secret"

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    slow, instant = Receiver(slow_seconds=1.5), Receiver(slow_seconds=1.5)
    yield slow, instant
    slow.close()
    instant.close()


def received_event(moto_aws: Aws, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The WebhookQueue messages of `bodies`, sent and received as Lambda's event source would."""
    sqs, url = boto3.client("sqs"), moto_aws.resources.queue_urls["WebhookQueue"]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    messages: list[dict[str, Any]] = []
    while len(messages) < len(bodies):
        messages += sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
        ).get("Messages", [])
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m["Attributes"],
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:WebhookQueue",
                "awsRegion": "us-east-1",
            }
            for m in messages
        ]
    }


def message(account_id: str, batch_id: str) -> dict[str, Any]:
    return {
        "batch_id": batch_id,
        "account_id": account_id,
        "type": "batch.completed",
        "event_id": event_id(batch_id, "batch.completed"),
        "created_at": 1_800_000_000,
    }


def test_a_slow_and_a_silent_receiver_delay_only_their_own_account(
    moto_aws: Aws, receivers: tuple[Receiver, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given one account whose receiver is slow for some events and silent for others, and another
    # account whose receiver answers at once; a POST times out after 1 s, two of an account at a time
    slow, instant = receivers
    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "1")
    monkeypatch.setenv("WEBHOOK_ALLOW_LOOPBACK", "true")
    accounts.set_webhook("tenant-a", slow.url)
    accounts.set_webhook("tenant-b", instant.url)
    own = [message("tenant-a", f"{kind}_{i}") for i in range(3) for kind in ("slow", "silent")]
    event = received_event(moto_aws, [*own, message("tenant-b", "instant_0")])
    spec = moto_aws.specs["WebhookFunction"]
    handler = load_handler(spec)
    # When the function gets them all in one invocation with 3.5 s left (the other account's last)
    started = time.monotonic()
    answer = handler(event, LocalLambdaContext(spec, deadline=started + 3.5))
    ended = time.monotonic()
    # Then the instant receiver had its webhook within 2 s, once
    [(instant_id, arrived)] = instant.arrivals
    assert instant_id == event_id("instant_0", "batch.completed")
    assert arrived - started < 2.0
    # And the invocation ended before its deadline, every record of the slow account a failure
    assert ended - started < 3.5
    by_message = {r["messageId"]: json.loads(r["body"])["batch_id"] for r in event["Records"]}
    failed = sorted(by_message[f["itemIdentifier"]] for f in answer["batchItemFailures"])
    assert failed == sorted(m["batch_id"] for m in own)
    # And at most two of its POSTs were in flight at once: 2 at 0 s, 2 at 1 s, none started after
    assert len(slow.arrivals) == 4
    # And no event reached a receiver twice
    assert len({webhook_id for webhook_id, _ in slow.arrivals}) == 4


@pytest.mark.parametrize("host", ["127.0.0.1", "hooks.rebound.example"])
def test_a_webhook_to_a_loopback_address_is_refused_unless_told_and_logged_without_its_query(
    moto_aws: Aws,
    receivers: tuple[Receiver, Receiver],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    host: str,
) -> None:
    # Given an account whose URL is a loopback address, or a name that resolved to a public address when
    # it was registered and resolves to loopback now (DNS rebinding)
    _, instant = receivers
    real_getaddrinfo = socket.getaddrinfo

    def rebound(name: Any, *args: Any, **kwargs: Any) -> Any:
        return real_getaddrinfo("127.0.0.1" if name == "hooks.rebound.example" else name, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    monkeypatch.setenv("WEBHOOK_ALLOW_LOOPBACK", "true")  # only to register it
    get_settings.cache_clear()
    accounts.set_webhook("tenant-b", instant.url.replace("127.0.0.1", host))
    monkeypatch.delenv("WEBHOOK_ALLOW_LOOPBACK")
    get_settings.cache_clear()
    event = received_event(moto_aws, [message("tenant-b", "instant_0")])
    # When the function delivers it: its only record fails (Powertools raises for a batch that all failed)
    with pytest.raises(BatchProcessingError, match="All records failed"):
        moto_aws.invoke("WebhookFunction", event)
    # Then nothing reached the receiver, and the log shows no query
    assert instant.arrivals == []
    [error] = [r.__dict__["error"] for r in caplog.records if r.getMessage() == "webhook failed"]
    assert error.startswith("webhook to http://") and "/hook failed: " in error
    assert "token=secret" not in caplog.text + error


def test_a_rotated_secret_signs_beside_the_new_one_for_its_grace_then_no_more(
    moto_aws: Aws, receivers: tuple[Receiver, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an account whose webhook secret was rotated with an hour's grace
    _, instant = receivers
    monkeypatch.setenv("WEBHOOK_ALLOW_LOOPBACK", "true")
    get_settings.cache_clear()
    old = accounts.set_webhook("tenant-b", instant.url)
    new = accounts.rotate_webhook_secret("tenant-b", grace_seconds=3600)
    # When a webhook is delivered
    moto_aws.invoke("WebhookFunction", received_event(moto_aws, [message("tenant-b", "instant_0")]))
    # Then it carries both signatures, the new one first, each as the specification computes it
    [(body, headers)] = instant.requests
    at = datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
    webhook_id = event_id("instant_0", "batch.completed")
    signatures = [Webhook(s).sign(msg_id=webhook_id, timestamp=at, data=body.decode()) for s in (new, old)]
    assert headers["webhook-signature"] == " ".join(signatures)
    # And a receiver verifying with either secret accepts it
    for secret in (new, old):
        assert Webhook(secret).verify(body, headers)["data"] == {"id": "instant_0"}
    # When the secret is rotated again with no grace
    newest = accounts.rotate_webhook_secret("tenant-b", grace_seconds=0)
    moto_aws.invoke("WebhookFunction", received_event(moto_aws, [message("tenant-b", "instant_1")]))
    # Then only the newest signs: the one before it verifies no more
    body, headers = instant.requests[1]
    assert headers["webhook-signature"].count("v1,") == 1
    assert Webhook(newest).verify(body, headers)["data"] == {"id": "instant_1"}
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(body, headers)
