"""The shard lease's heartbeat: a worker renews its short lease while it works, so a slow
shard is never taken from its live worker, a crashed worker's shard is free one lease after its last
beat, and a worker that lost its lease stops and commits nothing.

The worker runs in a thread against moto in-process and the scripted model (`support.scripted`):
`HOLD` prompts wait for the test's `release()`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from batchinfer.core import aws, chaos
from batchinfer.data import batches, keys, s3, shards
from batchinfer.data.sqs import ShardMessage
from batchinfer.data.table import now
from batchinfer.pipeline import aggregate
from batchinfer.pipeline.shard import worker
from support.api_stack import HoldableUpstream
from support.moto_env import Aws
from support.pipeline import prepared, result_lines, run_shard
from support.scripted import SCRIPTED, scripted_model

LEASE = 2  # SHARD_LEASE_SECONDS: beats every 2/3 s
OWNER = "test"  # the owner `support.pipeline.run_shard` claims as


def chat_line(custom_id: str, prompt: str) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": SCRIPTED, "max_tokens": 2, "messages": [{"role": "user", "content": prompt}]},
        }
    )


@pytest.fixture
def upstream(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    with scripted_model(tmp_path, monkeypatch) as serving:
        try:
            yield serving
        finally:
            serving.release()  # a held request's server thread ends


def start(aws_: Aws, monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    """A running batch of one shard: `HOLD 0` (held by the upstream), then `Say 1.` .. `Say 3.`."""
    for key, value in {"SHARD_LEASE_SECONDS": str(LEASE), **env}.items():
        monkeypatch.setenv(key, value)
    lines = [chat_line("r0", "HOLD 0"), *(chat_line(f"r{i}", f"Say {i}.") for i in (1, 2, 3))]
    return prepared(aws_, "".join(line + "\n" for line in lines).encode(), monkeypatch, shard_size=4)


@contextmanager
def worker_thread(upstream: HoldableUpstream, batch_id: str) -> Iterator[Future[str]]:
    """`worker.process_shard` of shard 0 in a thread, once its `HOLD` request is at the model; the
    upstream answers it at the latest when the block ends."""
    with ThreadPoolExecutor(1) as pool:
        try:
            running = pool.submit(run_shard, batch_id, 0)
            assert upstream.held.wait(10)
            yield running
        finally:
            upstream.release()


def take_over(batch_id: str, owner: str = "thief") -> None:
    """Another message claims the shard, as if the worker's lease had run out (it was paused)."""
    aws.table().update_item(
        Key=keys.shard(batch_id, 0),
        UpdateExpression="SET lease_until = :past",
        ExpressionAttributeValues={":past": now() - 10},
    )
    assert shards.claim(batch_id, 0, owner=owner, lease_seconds=60) is not None


def test_a_worker_keeps_its_shard_longer_than_its_lease(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker whose first request is held by the model for longer than a lease (and a second)
    batch_id = start(moto_aws, monkeypatch)
    with worker_thread(upstream, batch_id) as running:
        time.sleep(LEASE + 1.5)
        # Then its lease was renewed: a second message's claim gets nothing
        assert shards.claim(batch_id, 0, owner="second", lease_seconds=LEASE) is None
        held = shards.get(batch_id, 0)
        assert (held.lease_owner, held.attempts) == (OWNER, 1)
        assert now() <= held.lease_until <= now() + LEASE
        upstream.release()
        assert running.result(timeout=30) == "done"
    header = batches.get(batch_id)
    assert (header.request_counts.completed, header.request_counts.failed, header.shards_done) == (4, 0, 1)
    assert sorted(upstream.arrivals) == ["HOLD 0", "Say 1.", "Say 2.", "Say 3."]  # each asked once


def test_a_worker_whose_lease_was_taken_stops_and_commits_nothing(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker with one request in flight at a time, its first held at the model
    batch_id = start(moto_aws, monkeypatch, WORKER_CONCURRENCY="1")
    with worker_thread(upstream, batch_id) as running:
        # When another message takes the shard over (this worker was too slow to renew)
        take_over(batch_id)
        # Then its next beat finds the new owner: it stops without the model's answer
        assert running.result(timeout=10) == "lost"
    assert upstream.arrivals == ["HOLD 0"]  # nothing more was launched
    shard = shards.get(batch_id, 0)
    assert (shard.lease_owner, shard.next_index, shard.parts, shard.completed) == ("thief", 0, [], 0)
    assert s3.keys_under(moto_aws.bucket, f"batches/{batch_id}/results/") == []  # no PUT
    header = batches.get(batch_id)
    assert (header.request_counts.completed, header.shards_done) == (0, 0)
    assert moto_aws.messages("ShardsQueue") == []  # no continuation: the shard is its new holder's


def test_a_commit_after_the_lease_was_taken_is_refused(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker whose lease is taken over just before its commit (no beat in between)
    batch_id = start(moto_aws, monkeypatch)
    upstream.release()

    def crash_point(fault: str) -> None:
        if fault == "crash_before_commit":
            take_over(batch_id)

    monkeypatch.setattr(chaos, "crash_point", crash_point)
    # Then its commit is refused: the shard's owner is part of the commit's condition
    assert run_shard(batch_id, 0) == "conflict"
    shard = shards.get(batch_id, 0)
    assert (shard.lease_owner, shard.next_index, shard.parts, shard.completed) == ("thief", 0, [], 0)
    assert shard.lease_until is not None and shard.lease_until >= now()  # the thief's lease is left alone
    header = batches.get(batch_id)
    assert (header.request_counts.completed, header.shards_done) == (0, 0)


def test_a_crashed_workers_shard_is_claimable_one_lease_after_its_last_beat(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker that ran longer than a lease, then died before its commit
    batch_id = start(moto_aws, monkeypatch)

    def crash_point(fault: str) -> None:
        if fault == "crash_before_commit":
            raise chaos.ChaosCrash(fault)

    monkeypatch.setattr(chaos, "crash_point", crash_point)
    with worker_thread(upstream, batch_id) as running:
        time.sleep(LEASE + 1.5)
        upstream.release()
        with pytest.raises(chaos.ChaosCrash):
            running.result(timeout=30)
    # Then its last beat's lease still holds the shard, for at most one lease more
    assert shards.claim(batch_id, 0, owner="next", lease_seconds=LEASE) is None
    until = shards.get(batch_id, 0).lease_until
    assert now() <= until <= now() + LEASE
    # and once it ran out (no beat after the crash), the next message claims it
    time.sleep(until + 1 - time.time() + 0.05)
    assert shards.get(batch_id, 0).lease_until == until
    claimed = shards.claim(batch_id, 0, owner="next", lease_seconds=LEASE)
    assert claimed is not None and (claimed.lease_owner, claimed.attempts) == ("next", 2)


def test_a_writer_paused_past_its_lease_never_overwrites_the_new_holders_results(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch of one shard of four requests, a long lease (no beat during the test)
    for key, value in {"SHARD_LEASE_SECONDS": "60", "WORKER_CONCURRENCY": "1"}.items():
        monkeypatch.setenv(key, value)
    text = "".join(chat_line(f"r{i}", f"Say {i}.") + "\n" for i in range(4))
    batch_id = prepared(moto_aws, text.encode(), monkeypatch, shard_size=4)
    put_bytes, seconds = s3.put_bytes, []

    def paused_put(bucket: str, key: str, data: bytes, *args: object, **kwargs: object) -> None:
        if "/results/" in key and not seconds:
            # The first writer passed its `held()` check, then paused past its lease: a second message
            # claims the shard and runs it to its commit before the first one's PUT lands.
            seconds.append(key)
            aws.table().update_item(
                Key=keys.shard(batch_id, 0),
                UpdateExpression="SET lease_until = :past",
                ExpressionAttributeValues={":past": now() - 10},
            )
            second = worker.process_shard(
                ShardMessage(batch_id=batch_id, shard=0), owner="second", time_left_ms=lambda: 900_000
            )
            assert second == "done"
        put_bytes(bucket, key, data, *args, **kwargs)

    monkeypatch.setattr(s3, "put_bytes", paused_put)
    # When the first writer then PUTs its results and tries to commit them
    assert run_shard(batch_id, 0) == "conflict"
    # Then only the second writer's results are committed, and the aggregated output is its bytes
    shard = shards.get(batch_id, 0)
    assert (shard.state, shard.lease_owner, shard.completed, len(shard.parts)) == ("done", "second", 4, 1)
    assert aggregate.finalize_batch(batch_id) == "completed"
    header = batches.get(batch_id)
    lines = result_lines(header.output_file_id)
    assert [(line["custom_id"], line["response"]["body"]["id"]) for line in lines] == [
        ("r0", "chatcmpl-5"),
        ("r1", "chatcmpl-6"),
        ("r2", "chatcmpl-7"),
        ("r3", "chatcmpl-8"),
    ]
    assert [line["response"]["body"]["choices"][0]["message"]["content"] for line in lines] == [
        f"echo: Say {i}." for i in range(4)
    ]
    assert header.error_file_id is None
    assert upstream.arrivals == [f"Say {i}." for i in range(4)] * 2  # the first writer's, then the second's
    # and the refused writer's key is gone: only the committed one is left
    assert s3.keys_under(moto_aws.bucket, f"batches/{batch_id}/results/") == [shard.parts[0].key]
    assert seconds[0] != shard.parts[0].key
