"""The official `anthropic` Python SDK against the local stack, changing nothing but the base URL and key.

Message Batches on the embedded model: create, retrieve until ended, list, results (succeeded and
errored), cancel of a running batch (succeeded and canceled), delete, both auth header styles, and the
SDK's exception classes for 401, 404, 413 and 429. Tiny batches (max_tokens <= 8).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic import Anthropic
from anthropic.types.messages import MessageBatch

from batchinfer.data import accounts
from batchinfer_local import LocalStack
from support.api_stack import MODEL, new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(180), DEFAULT.mark]


def params(text: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("anthropic-sdk")) as shared:
        yield shared.stack


@pytest.fixture(scope="module")
def key(stack: LocalStack) -> str:
    return new_account("anthropic-sdk")


@pytest.fixture(scope="module")
def client(stack: LocalStack, key: str) -> Anthropic:
    # The current SDK sends the key as a bearer token (auth_token); older ones as x-api-key.
    return Anthropic(base_url=stack.base_url, auth_token=key, max_retries=0)


def wait(client: Anthropic, batch_id: str, timeout: float = 120.0) -> MessageBatch:
    deadline = time.monotonic() + timeout
    while (batch := client.messages.batches.retrieve(batch_id)).processing_status != "ended":
        counts = batch.request_counts
        assert counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired == 2
        assert time.monotonic() < deadline, f"{batch_id} still {batch.processing_status}"
        time.sleep(0.2)
    return batch


def test_a_message_batch_with_the_anthropic_sdk(client: Anthropic, stack: LocalStack, key: str) -> None:
    # Given a batch of a good request and one the service can't serve (a tool)
    tool = {"name": "t", "input_schema": {"type": "object"}}
    created = client.messages.batches.create(
        requests=[
            {"custom_id": "good", "params": params("Say hello.", system="Be brief.")},
            {"custom_id": "tools", "params": params("Use the tool.", tools=[tool])},
        ]
    )
    assert (created.type, created.processing_status) == ("message_batch", "in_progress")
    assert created.expires_at.timestamp() - created.created_at.timestamp() == 24 * 3600
    # When it ends
    ended = wait(client, created.id)
    # Then the good request succeeded and the other errored, in input order
    assert ended.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 1,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    assert ended.ended_at is not None
    results = list(client.messages.batches.results(created.id))
    assert [(r.custom_id, r.result.type) for r in results] == [("good", "succeeded"), ("tools", "errored")]
    message = results[0].result.message
    assert (message.role, message.model, message.content[0].type) == ("assistant", MODEL, "text")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 4
    assert results[1].result.error.error.type == "invalid_request_error"
    # And the old SDKs' x-api-key header lists it too
    old_style = Anthropic(base_url=stack.base_url, api_key=key, max_retries=0)
    assert created.id in [b.id for b in old_style.messages.batches.list(limit=1000)]
    # And an ended batch deletes; it is gone then
    deleted = client.messages.batches.delete(created.id)
    assert (deleted.id, deleted.type) == (created.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(created.id)


def test_cancel_of_a_running_batch_keeps_its_answers(client: Anthropic) -> None:
    # Given a running batch that has answered some of its requests (64: more than the model runs at once,
    # so that some still wait when the first answers are counted, however fast they come)
    requests = [{"custom_id": f"r{i}", "params": params(f"Count to {i}.", max_tokens=8)} for i in range(64)]
    batch = client.messages.batches.create(requests=requests)
    deadline = time.monotonic() + 60
    while client.messages.batches.retrieve(batch.id).request_counts.succeeded == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # When it is cancelled
    canceling = client.messages.batches.cancel(batch.id)
    assert canceling.processing_status in ("canceling", "ended")
    deadline = time.monotonic() + 60
    while (ended := client.messages.batches.retrieve(batch.id)).processing_status != "ended":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # Then what ran succeeded and the rest is canceled: every request once
    counts = ended.request_counts
    assert counts.succeeded >= 1 and counts.canceled >= 1
    assert (counts.succeeded + counts.canceled, counts.errored, counts.processing) == (64, 0, 0)
    results = list(client.messages.batches.results(batch.id))
    assert [r.custom_id for r in results] == [f"r{i}" for i in range(64)]
    assert sum(r.result.type == "canceled" for r in results) == counts.canceled


def test_the_sdk_raises_its_own_exceptions(stack: LocalStack, client: Anthropic) -> None:
    with pytest.raises(anthropic.AuthenticationError):
        Anthropic(base_url=stack.base_url, api_key="sk-bi-unknown", max_retries=0).messages.batches.list()
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.batches.retrieve("batch_0000")
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert missing.value.request_id is not None and missing.value.request_id.startswith("req_")
    with pytest.raises(anthropic.APIStatusError) as too_large:
        client.messages.batches.create(requests=[{"custom_id": f"r{i}", "params": {}} for i in range(50_001)])
    assert (too_large.value.status_code, too_large.value.body["error"]["type"]) == (413, "request_too_large")
    limited = Anthropic(base_url=stack.base_url, api_key=new_account("anthropic-429"), max_retries=0)
    accounts.configure_account("anthropic-429", max_active_batches=1)
    limited.messages.batches.create(requests=[{"custom_id": "a", "params": params("Hi.", max_tokens=1)}])
    with pytest.raises(anthropic.RateLimitError):
        limited.messages.batches.create(requests=[{"custom_id": "a", "params": params("Hi.", max_tokens=1)}])
