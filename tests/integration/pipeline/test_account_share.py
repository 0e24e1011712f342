"""One account's share of a backend's shard workers is bounded (`AccountShardShare`): a
shard of an account whose slots on the model are all held waits (its message comes back later,
nothing counted, the model not called, the sweeper sees it queued), then completes normally.

Moto in-process and the scripted model (`support.scripted`); the same with concurrent workers in the
local stack's processes is tests/integration/local/test_fair_delivery.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer.core import aws
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, inflight, keys, shards
from batchinfer.data.sqs import ShardMessage
from batchinfer.data.table import now
from batchinfer.pipeline import sweep
from batchinfer.pipeline.shard import worker
from support.api_stack import HoldableUpstream
from support.moto_env import Aws
from support.pipeline import prepared
from support.scripted import SCRIPTED, scripted_model


def text(*prompts: str) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": SCRIPTED, "max_tokens": 2, "messages": [{"role": "user", "content": p}]},
            }
        )
        + "\n"
        for i, p in enumerate(prompts)
    ).encode()


@pytest.fixture
def upstream(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    # Two slots per account and model: half of MaxShardWorkers = 4.
    for key, value in {"MAX_SHARD_WORKERS": "4", "ACCOUNT_SHARD_SHARE": "0.5"}.items():
        monkeypatch.setenv(key, value)
    with scripted_model(tmp_path, monkeypatch) as serving:
        try:
            yield serving
        finally:
            serving.release()


def run(batch_id: str, shard: int, owner: str) -> str:
    return worker.process_shard(
        ShardMessage(batch_id=batch_id, shard=shard), owner=owner, time_left_ms=lambda: 900_000
    )


def test_a_shard_that_finds_no_slot_waits_counting_nothing_and_then_completes(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough that the message sent again stays delayed through the steps below on a loaded machine
    monkeypatch.setattr(worker, "SLOT_WAIT_SECONDS", 6)
    # Given account A's batch of three one-request shards, B's of one, and A's two slots on the model
    # held by two live workers in other environments (the worker's loop is one per process: the
    # concurrent workers themselves run in the local stack's test, tests/integration/local)
    a = prepared(moto_aws, text("Say a0.", "Say a1.", "Say a2."), monkeypatch, shard_size=1, account_id="A")
    b = prepared(moto_aws, text("Say b0."), monkeypatch, shard_size=1, account_id="B")
    slots = keys.shard_slots("A")
    held = [inflight.acquire(slots, limit=2, owner=f"env{n}", lease_s=60) for n in (1, 2)]

    # When A's third shard is delivered: it waits, counting nothing, and never calls the model
    assert run(a, 2, "a2") == "waiting"
    waiting = shards.get(a, 2)
    assert (waiting.attempts, waiting.redrives, waiting.lease_owner) == (0, None, None)
    assert now() - 2 <= waiting.queued_at <= now()
    assert upstream.arrivals == []
    assert moto_aws.grouped("ShardsQueue") == []  # sent again with a delay
    # while B's shard runs at once
    assert run(b, 0, "b0") == "done"
    assert upstream.arrivals == ["Say b0."]
    # and once A's slots were free and its first shards ran, a duplicate of a done shard's message
    # that finds no slot is dropped, not sent again
    for n, owner in zip(held, ("env1", "env2"), strict=True):
        assert inflight.release(slots, n, owner=owner)
    assert run(a, 0, "a0") == "done" and run(a, 1, "a1") == "done"
    blocking = [inflight.acquire(slots, limit=2, owner=f"env{n}", lease_s=60) for n in (1, 2)]
    assert run(a, 0, "a0-again") == "duplicate"
    assert moto_aws.grouped("ShardsQueue") == []

    # And the sweeper, finding A's batch quiet, sees a queued message, not a stuck shard
    monkeypatch.setenv("STUCK_AFTER_SECONDS", "1")
    get_settings.cache_clear()
    at = now() + 2
    monkeypatch.setattr(sweep, "now", lambda: at)
    assert sweep.sweep()["shards"] == 0
    assert shards.get(a, 2).redrives is None

    # Then, its slots free again, the message comes back after its delay (in A's group) and the shard
    # completes normally: one claim, no re-drive
    for n, owner in zip(blocking, ("env1", "env2"), strict=True):
        assert inflight.release(slots, n, owner=owner)
    deadline = time.monotonic() + 12
    while not (back := moto_aws.grouped("ShardsQueue")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert back == [("A", {"batch_id": a, "shard": 2})]
    assert run(a, 2, "a2-again") == "done"
    done = shards.get(a, 2)
    assert (done.state, done.attempts, done.redrives, done.completed) == ("done", 1, None, 1)
    assert batches.get(a).request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert upstream.arrivals == ["Say b0.", "Say a0.", "Say a1.", "Say a2."]
    # and every slot was given back
    leased = aws.table().query(
        KeyConditionExpression="PK = :pk AND begins_with(SK, :sk)",
        ExpressionAttributeValues={":pk": "ACCOUNT#A", ":sk": slots.prefix},
    )["Items"]
    assert leased == []
