"""Shards (data/shards.py) in moto's copy of the template's table: the write-once put, the lease, and
the commit transaction with the batch header (its conditions and its conflict retry)."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from batchinfer.core import aws
from batchinfer.data import batches, keys, shards
from batchinfer.data.items import BatchChanges, LiveProgress, ResultPart, Shard
from batchinfer.data.table import CONFLICT_ATTEMPTS, TransactionConflict, now
from batchinfer.wire.openai import RequestCounts
from batchinfer.wire.status import BatchStatus
from support.data import batch_header, intercept_transactions, small_pages
from support.moto_env import Aws

COUNTS = {"completed": 1, "failed": 1, "input_tokens": 10, "output_tokens": 4}


def stored(batch_id: str, shard_no: int) -> dict:
    return aws.table().get_item(Key=keys.shard(batch_id, shard_no))["Item"]


def new_shard(n: int = 0, size: int = 5) -> Shard:
    return Shard(shard=n, size=size, first_line=1 + n * size, input_key=f"batches/b/shards/{n:05d}.tsv")


def part(start: int, end: int) -> ResultPart:
    return ResultPart(
        key=f"batches/b/results/00000-{start:06d}.jsonl", start=start, end=end, output_bytes=30, bytes=70
    )


@pytest.fixture
def running(moto_aws: Aws) -> str:
    """A running batch of one shard of 5 requests, claimed by `w1`."""
    header = batch_header(
        status=BatchStatus.IN_PROGRESS, shards_total=1, request_counts=RequestCounts(total=5)
    )
    batches.put(header)
    shards.put(header.id, new_shard())
    shards.claim(header.id, 0, owner="w1", lease_seconds=60)
    return header.id


def test_put_writes_a_pending_shard_once(moto_aws: Aws) -> None:
    assert shards.put("b", new_shard(3)) is True
    assert stored("b", 3) == {
        "PK": "BATCH#b",
        "SK": "SHARD#00003",
        "shard": 3,
        "size": 5,
        "first_line": 16,
        "input_key": "batches/b/shards/00003.tsv",
        "state": "pending",
        "next_index": 0,
        "parts": [],
        "completed": 0,
        "failed": 0,
        "attempts": 0,
    }
    shards.claim("b", 3, owner="w", lease_seconds=60)
    assert shards.put("b", new_shard(3)) is False  # a repeated prepare resets nothing
    assert stored("b", 3)["attempts"] == 1


def test_get_and_query_read_decimals_back_as_ints(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    order = list(range(12))
    random.Random(7).shuffle(order)
    for n in order:
        shards.put("b", new_shard(n))
    shards.put("other", new_shard(0))
    batches.put(batch_header(id="b"))  # shares the partition; not a shard
    assert isinstance(stored("b", 4)["size"], Decimal)
    assert shards.get("b", 4) == new_shard(4) and type(shards.get("b", 4).size) is int
    assert shards.get("b", 12) is None
    calls = small_pages(monkeypatch, "query", limit=5)
    assert list(shards.query("b")) == [new_shard(n) for n in range(12)]
    assert len(calls) == 3 and all(call["ConsistentRead"] for call in calls)


def test_claim_leases_to_one_owner_at_a_time(moto_aws: Aws) -> None:
    shards.put("b", new_shard())
    at = now()
    first = shards.claim("b", 0, owner="w1", lease_seconds=60)
    assert (first.lease_owner, first.attempts) == ("w1", 1) and at + 60 <= first.lease_until <= now() + 60
    assert shards.claim("b", 0, owner="w2", lease_seconds=60) is None  # live lease
    assert shards.claim("missing", 0, owner="w2", lease_seconds=60) is None
    assert stored("b", 0)["lease_owner"] == "w1"


def test_an_expired_lease_can_be_claimed_again(moto_aws: Aws) -> None:
    shards.put("b", new_shard())
    shards.claim("b", 0, owner="w1", lease_seconds=-1)  # ends before now
    again = shards.claim("b", 0, owner="w2", lease_seconds=60)
    assert (again.lease_owner, again.attempts) == ("w2", 2)


def test_release_only_by_the_owner(running: str) -> None:
    assert shards.release(running, 0, owner="w2") is False
    assert stored(running, 0)["lease_until"] > 0
    assert shards.release(running, 0, owner="w1") is True
    assert "lease_until" not in stored(running, 0)
    assert shards.claim(running, 0, owner="w2", lease_seconds=60).lease_owner == "w2"


def test_a_continuation_hands_its_attempt_back(running: str) -> None:
    assert stored(running, 0)["attempts"] == 1
    assert shards.release(running, 0, owner="w2", continuation=True) is False  # not the holder: unchanged
    assert stored(running, 0)["attempts"] == 1
    assert shards.release(running, 0, owner="w1", continuation=True) is True
    assert "lease_until" not in stored(running, 0) and stored(running, 0)["attempts"] == 0
    assert shards.claim(running, 0, owner="w2", lease_seconds=60).attempts == 1


def test_renew_extends_only_the_holders_live_lease(running: str) -> None:
    claimed_until = stored(running, 0)["lease_until"]
    at = now()
    assert shards.renew(running, 0, owner="w1", lease_seconds=90) is True
    assert at + 90 <= stored(running, 0)["lease_until"] <= now() + 90 and claimed_until <= at + 60
    assert shards.renew(running, 0, owner="w2", lease_seconds=600) is False  # not the holder: unchanged
    assert stored(running, 0)["lease_until"] <= now() + 90
    assert shards.renew("missing", 0, owner="w1", lease_seconds=90) is False
    # A lease given up is never revived by a late beat
    assert shards.release(running, 0, owner="w1") is True
    assert shards.renew(running, 0, owner="w1", lease_seconds=90) is False
    assert "lease_until" not in stored(running, 0)


def test_renew_of_a_done_shard_is_refused(running: str) -> None:
    assert shards.commit(running, 0, owner="w1", part=part(0, 5), size=5, keep_lease=True, **COUNTS) is True
    until = stored(running, 0)["lease_until"]
    assert shards.renew(running, 0, owner="w1", lease_seconds=600) is False
    assert stored(running, 0)["lease_until"] == until


def test_a_commit_by_a_holder_whose_lease_was_taken_is_refused(running: str) -> None:
    # Given w1's lease taken over by w2 (it ran out while w1 was paused)
    aws.table().update_item(
        Key=keys.shard(running, 0),
        UpdateExpression="SET lease_until = :past",
        ExpressionAttributeValues={":past": now() - 1},
    )
    assert shards.claim(running, 0, owner="w2", lease_seconds=60) is not None
    shard, header = shards.get(running, 0), batches.get(running)
    # Then w1's commit of the same start is refused, nothing written; w2's goes through
    assert shards.commit(running, 0, owner="w1", part=part(0, 2), size=5, **COUNTS) is False
    assert shards.get(running, 0) == shard and batches.get(running) == header
    assert shards.commit(running, 0, owner="w2", part=part(0, 2), size=5, **COUNTS) is True
    assert shards.get(running, 0).next_index == 2


def test_bump_redrives_counts_from_one(moto_aws: Aws) -> None:
    shards.put("b", new_shard())
    assert shards.get("b", 0).redrives is None
    assert [shards.bump_redrives("b", 0, at=1000 + n) for n in range(3)] == [1, 2, 3]
    assert (shards.get("b", 0).redrives, shards.get("b", 0).queued_at) == (
        3,
        1002,
    )  # the re-sent message waits


def test_a_claim_receives_the_queued_message_and_a_continuation_queues_one(running: str) -> None:
    assert "queued_at" not in stored(running, 0)  # `running` was claimed
    at = now()
    assert shards.release(running, 0, owner="w1", continuation=True) is True
    assert at <= stored(running, 0)["queued_at"] <= now()
    assert shards.claim(running, 0, owner="w2", lease_seconds=60).queued_at is None


def test_commit_counts_work_once_in_shard_and_header(running: str) -> None:
    lease = stored(running, 0)["lease_until"]
    assert shards.commit(running, 0, owner="w1", part=part(0, 2), size=5, keep_lease=True, **COUNTS) is True
    shard = shards.get(running, 0)
    assert (shard.state, shard.next_index, shard.parts, shard.completed, shard.failed, shard.lease_until) == (
        "pending",
        2,
        [part(0, 2)],
        1,
        1,
        lease,
    )
    header = batches.get(running)
    assert (header.request_counts, header.usage.model_dump(), header.shards_done) == (
        RequestCounts(total=5, completed=1, failed=1),
        {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14, "cached_tokens": 0},
        0,
    )
    assert (
        header.progress_at == shard.updated_at and lease - 60 <= shard.updated_at <= now()
    )  # claimed at lease - 60

    # The same work again (a redelivered message): refused, nothing written.
    assert shards.commit(running, 0, owner="w1", part=part(0, 2), size=5, **COUNTS) is False
    assert shards.get(running, 0) == shard and batches.get(running) == header

    assert shards.commit(running, 0, owner="w1", part=part(2, 5), size=5, **COUNTS) is True
    done = shards.get(running, 0)
    assert (done.state, done.next_index, done.parts, done.completed, done.lease_until) == (
        "done",
        5,
        [part(0, 2), part(2, 5)],
        2,
        None,
    )
    assert stored(running, 0)["parts"][1] == {
        "key": "batches/b/results/00000-000002.jsonl",
        "start": 2,
        "end": 5,
        "output_bytes": 30,
        "bytes": 70,
    }
    header = batches.get(running)
    assert (header.request_counts.completed, header.usage.total_tokens, header.shards_done) == (2, 28, 1)
    assert shards.commit(running, 0, owner="w1", part=part(5, 5), size=5, **COUNTS) is False  # done


def test_commit_into_a_sealed_batch_is_refused(running: str) -> None:
    batches.update(running, BatchChanges(sealed=True, final_status=BatchStatus.CANCELLED))
    assert shards.commit(running, 0, owner="w1", part=part(0, 2), size=5, **COUNTS) is False
    assert shards.get(running, 0).next_index == 0
    assert batches.get(running).request_counts.completed == 0


def test_commit_retries_conflicts_and_counts_once(running: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = intercept_transactions(monkeypatch, "conflict", "conflict", "conflict")
    assert shards.commit(running, 0, owner="w1", part=part(0, 5), size=5, **COUNTS) is True
    assert len(seen.calls) == 4 and len(seen.waits) == 3
    assert batches.get(running).request_counts.completed == 1
    assert shards.get(running, 0).parts == [part(0, 5)]


def test_commit_raises_conflicts_that_persist(running: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = intercept_transactions(monkeypatch, *["conflict"] * CONFLICT_ATTEMPTS)
    with pytest.raises(TransactionConflict):  # the invocation fails and SQS redelivers: never "counted"
        shards.commit(running, 0, owner="w1", part=part(0, 5), size=5, **COUNTS)
    assert len(seen.calls) == CONFLICT_ATTEMPTS
    assert shards.get(running, 0).next_index == 0 and batches.get(running).request_counts.completed == 0
    # The redelivered message's commit goes through.
    assert shards.commit(running, 0, owner="w1", part=part(0, 5), size=5, **COUNTS) is True


def test_a_failed_condition_is_an_answer_even_with_a_conflict(
    running: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = intercept_transactions(monkeypatch, ["ConditionalCheckFailed", "TransactionConflict"])
    assert shards.commit(running, 0, owner="w1", part=part(0, 5), size=5, **COUNTS) is False
    assert len(seen.calls) == 1 and seen.waits == []


# ---- live progress ----------------------------------------------------------------------------------


def live(start: int = 0, **counts: int) -> LiveProgress:
    return LiveProgress(start=start, at=1, **counts)


def test_publish_sets_absolute_values_and_answers_the_header(running: str) -> None:
    first = batches.publish_progress(running, 0, live(completed=2, input_tokens=20, output_tokens=8))
    again = batches.publish_progress(running, 0, live(completed=2, input_tokens=20, output_tokens=8))
    assert first is not None and again is not None
    assert again.live == {"0": live(completed=2, input_tokens=20, output_tokens=8)}  # not doubled
    assert again.status == BatchStatus.IN_PROGRESS
    counts, usage = again.shown_counts()
    assert counts.model_dump() == {"total": 5, "completed": 2, "failed": 0}
    assert usage.model_dump() == {
        "input_tokens": 20,
        "output_tokens": 8,
        "total_tokens": 28,
        "cached_tokens": 0,
    }
    assert batches.get(running).request_counts.completed == 0  # committed counts untouched


def test_publish_answers_a_cancel(running: str) -> None:
    batches.transition(running, BatchStatus.CANCELLING)
    assert batches.publish_progress(running, 0, live()).status == BatchStatus.CANCELLING
    assert batches.publish_progress("batch_missing", 0, live()) is None


def test_commit_moves_the_live_counts_into_the_committed_ones(running: str) -> None:
    batches.publish_progress(running, 0, live(completed=1, failed=1, input_tokens=10, output_tokens=4))
    assert shards.commit(running, 0, owner="w1", part=part(0, 2), size=5, keep_lease=True, **COUNTS)
    header = batches.get(running)
    assert header.live == {}
    assert header.shown_counts()[0].model_dump() == {"total": 5, "completed": 1, "failed": 1}


def test_commit_keeps_what_was_published_beyond_its_counts(running: str) -> None:
    # A crashed worker had published 3 answers of [0, ...); its successor commits 2 of them so far.
    rest = live(2, completed=1, input_tokens=5)
    assert shards.commit(
        running, 0, owner="w1", part=part(0, 2), size=5, keep_lease=True, live_rest=rest, **COUNTS
    )
    header = batches.get(running)
    assert header.live == {"0": rest}
    assert header.shown_counts()[0].model_dump() == {"total": 5, "completed": 2, "failed": 1}
    # The shard's last commit removes it whatever is left.
    assert shards.commit(
        running, 0, owner="w1", part=part(2, 5), size=5, live_rest=live(5, completed=9), **COUNTS
    )
    assert batches.get(running).live == {}


def test_a_refused_commit_leaves_the_live_counts(running: str) -> None:
    batches.publish_progress(running, 0, live(completed=2))
    assert batches.update(running, BatchChanges(sealed=True))
    assert not shards.commit(running, 0, owner="w1", part=part(0, 2), size=5, **COUNTS)
    assert batches.get(running).live == {"0": live(completed=2)}


def test_shown_counts_are_capped_by_the_total_and_exact_once_terminal(moto_aws: Aws) -> None:
    header = batch_header(
        status=BatchStatus.IN_PROGRESS,
        request_counts=RequestCounts(total=5, completed=2, failed=1),
        live={"0": live(completed=2, failed=1), "1": live(completed=3)},
    )
    assert header.shown_counts()[0].model_dump() == {"total": 5, "completed": 5, "failed": 0}
    ended = header.model_copy(update={"status": BatchStatus.CANCELLED})
    assert ended.shown_counts()[0].model_dump() == {"total": 5, "completed": 2, "failed": 1}
