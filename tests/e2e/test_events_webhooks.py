"""Status events and webhooks through the local stack: the batch table's stream drives
StatusEventsFunction (with its own role), whose EventBridge events reach a rule's queue and whose
webhooks reach a loopback receiver, signed as Standard Webhooks says."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from batchinfer.data import accounts
from batchinfer.wire.webhooks import event_id
from batchinfer_local import LocalStack
from support.api_stack import (
    SCRIPTED,
    HoldableUpstream,
    api_client,
    chat_line,
    create,
    jsonl,
    new_account,
    stack_with_upstream,
    upload,
    wait_for,
    wait_until,
)

RULE = "all-batchinfer-events"


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A webhook endpoint on loopback: records every POST; answers 503 to the first `refuse` of them."""

    def __init__(self, refuse: int = 0) -> None:
        self.received: list[Delivery] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.received.append(Delivery({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(503 if len(receiver.received) <= refuse else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/hooks"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, HoldableUpstream, str]]:
    # The receivers are on loopback, which webhooks reach only when the stack is told so.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WEBHOOK_ALLOW_LOOPBACK", "true")
        with stack_with_upstream(
            tmp_path_factory.mktemp("registry"),
            parameter_overrides={"ShardSize": "2", "RemoteShardSize": "2"},
        ) as (
            stack,
            upstream,
        ):
            # What a user does to route the events: a rule on the default bus with a queue as its target.
            queue_url = stack.sqs.create_queue(QueueName="batch-events")["QueueUrl"]
            arn = stack.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"]
            events = stack.client("events")
            events.put_rule(Name=RULE, EventPattern=json.dumps({"source": ["batchinfer"]}))
            events.put_targets(Rule=RULE, Targets=[{"Id": "queue", "Arn": arn}])
            yield stack, upstream, queue_url


def _events(stack: LocalStack, queue_url: str, batch_id: str, until: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        for message in stack.sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            stack.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            event = json.loads(message["Body"])
            if event["detail"]["id"] == batch_id:
                found.append(event)
        return any(event["detail-type"] == until for event in found)

    wait_until(arrived, timeout=60, what=f"{until} event")
    return found


def test_every_status_change_reaches_an_eventbridge_rule_through_its_queue(
    running: tuple[LocalStack, HoldableUpstream, str],
) -> None:
    stack, _, queue_url = running
    # Given an account's batch of three requests on the scripted model (two shards)
    http = api_client(stack, new_account("events"))
    lines = jsonl(*(chat_line(f"r{i}", f"hello {i}", model=SCRIPTED) for i in range(3)))
    batch_id = create(http, upload(http, lines)).json()["id"]
    # When it runs to its end
    done = wait_for(http, batch_id)
    assert done["status"] == "completed"
    # Then the rule's queue got one event per status, in order, each the Batch object of that moment
    events = _events(stack, queue_url, batch_id, "batch.completed")
    assert [event["detail-type"] for event in events] == [
        "batch.validating",
        "batch.in_progress",
        "batch.finalizing",
        "batch.completed",
    ]
    assert {event["source"] for event in events} == {"batchinfer"}
    assert events[-1]["detail"] == http.get(f"/batches/{batch_id}").json()
    assert events[0]["detail"]["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert events[-1]["detail"]["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    # TokenHub fidelity: nothing failed, so there is no error file
    assert done["error_file_id"] is None
    # And StatusEventsFunction ran with its own role: its invocations are counted in its pool
    assert stack.invocations("StatusEventsFunction") >= 1


def test_an_ending_sends_a_signed_webhook_retried_with_the_same_id(
    running: tuple[LocalStack, HoldableUpstream, str],
) -> None:
    stack, _, _ = running
    with Receiver(refuse=1) as receiver:
        # Given an account with a webhook URL on loopback (which refuses the first delivery)
        http = api_client(stack, new_account("hooks"))
        secret = accounts.set_webhook("hooks", receiver.url)
        assert secret is not None and secret.startswith("whsec_")
        lines = jsonl(
            chat_line("ok", "hello", model=SCRIPTED), chat_line("bad", "FAIL please", model=SCRIPTED)
        )
        batch_id = create(http, upload(http, lines)).json()["id"]
        # When the batch completes (one line failed)
        done = wait_for(http, batch_id)
        wait_until(lambda: len(receiver.received) >= 2, timeout=60, what="a second delivery")
    assert done["status"] == "completed" and done["request_counts"] == {
        "total": 2,
        "completed": 1,
        "failed": 1,
    }
    # Then the refused delivery came again with the same webhook-id, and verifies with the account's secret
    first, second = receiver.received[:2]
    expected_id = event_id(batch_id, "batch.completed")
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == expected_id
    assert first.body == second.body
    assert first.headers["content-type"] == "application/json"
    payload = Webhook(secret).verify(second.body, second.headers)
    assert payload == {
        "object": "event",
        "id": expected_id,
        "type": "batch.completed",
        "created_at": done["completed_at"],
        "data": {"id": batch_id},
    }
    # And it does not verify with another secret, nor with a changed body
    with pytest.raises(WebhookVerificationError):
        Webhook(accounts.set_webhook("someone-else", receiver.url) or "").verify(second.body, second.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(second.body.replace(b"completed", b"cancelled"), second.headers)
    assert len(receiver.received) == 2  # delivered: not sent a third time
