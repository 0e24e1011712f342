"""`sweep.sweep` against moto: expiry, and each lost message sent again once a batch is quiet.

"Later" is the sweeper's clock moved forward (`sweep.now`); everything else runs at the real time.
Shards that must finish run on the real worker with a scripted model (`support.scripted`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, batches, s3, shards, sqs
from batchinfer.data.items import BatchChanges, ResultPart
from batchinfer.data.table import now
from batchinfer.pipeline import aggregate, prepare, sweep
from batchinfer.wire.status import BatchStatus
from support.api_stack import chat_line, jsonl
from support.data import reads
from support.moto_env import Aws
from support.pipeline import create, prepare_failing, prepared, result_lines, run_shard
from support.scripted import SCRIPTED, scripted_model

NO_ACTIONS = {"expired": 0, "prepare": 0, "shards": 0, "failed_shards": 0, "finalize": 0, "past_window": 0}
QUEUES = ("PrepareQueue", "ShardsQueue", "FinalizeQueue")


@pytest.fixture(autouse=True)
def _scripted(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with scripted_model(tmp_path, monkeypatch):
        yield


def lines(n: int) -> bytes:
    return jsonl(*(chat_line(f"r{i}", f"Say {i}.", model=SCRIPTED) for i in range(1, n + 1)))


def stuck() -> int:
    return get_settings().stuck_after_seconds


def sweep_later(seconds: int) -> dict[str, int]:
    """One sweep with the sweeper's clock `seconds` ahead (a minute short of quiet stays short of it
    however slowly the test runs; real time only adds to a wait that was long enough)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep, "now", lambda: now() + seconds)
        return sweep.sweep()


def test_a_running_batch_past_its_window_begins_its_expiry(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = prepared(moto_aws, lines(3), monkeypatch)
    batches.update(batch_id, BatchChanges(expires_at=now() - 1))
    assert sweep.sweep() == {**NO_ACTIONS, "expired": 1, "past_window": 1}
    header = batches.get(batch_id)
    assert (header.status, header.sealed, header.final_status) == ("finalizing", None, "expired")
    assert moto_aws.messages("FinalizeQueue") == [{"batch_id": batch_id}]
    # A shard's worker still commits what it finished: the aggregator seals after
    part = ResultPart(key="k", start=0, end=2, output_bytes=0, bytes=0)
    assert shards.claim(batch_id, 0, owner="worker", lease_seconds=60) is not None
    assert shards.commit(
        batch_id, 0, part, owner="worker", size=2, completed=2, failed=0, input_tokens=0, output_tokens=0
    )
    header = batches.get(batch_id)
    assert (header.request_counts.completed, header.shards_done) == (2, 1)
    # The next pass leaves it to the aggregator; once quiet (its message lost), it sends it again
    assert sweep.sweep() == {**NO_ACTIONS, "past_window": 1}  # still open past its window
    assert sweep_later(stuck()) == {**NO_ACTIONS, "finalize": 1, "past_window": 1}
    assert moto_aws.messages("FinalizeQueue") == [{"batch_id": batch_id}]
    assert batches.get(batch_id) == header


def test_a_validating_batch_past_its_window_expires_and_frees_its_active_slot(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose prepare keeps dying, past its window
    batch_id = create(moto_aws, lines(3), monkeypatch)
    batches.update(batch_id, BatchChanges(expires_at=now() - 1))
    assert accounts.active_batches("default") == 1
    # When the sweeper passes, once quiet too
    assert sweep_later(stuck()) == {**NO_ACTIONS, "expired": 1, "past_window": 1}
    # Then it is expired, no prepare is sent again, and the account's slot is free
    header = batches.get(batch_id)
    assert (header.status, header.expired_at is not None) == ("expired", True)
    assert moto_aws.messages("PrepareQueue") == []
    assert accounts.active_batches("default") == 0
    assert sweep_later(stuck()) == NO_ACTIONS


@pytest.mark.parametrize("state", ["all_shards_done", "cancelling"])
def test_a_lost_finalize_is_sent_again_once_quiet(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    batch_id = prepared(moto_aws, lines(3), monkeypatch)
    if state == "all_shards_done":
        assert [run_shard(batch_id, n) for n in (0, 1)] == ["done", "done"]
    else:
        assert run_shard(batch_id, 0) == "done"
        assert batches.transition(batch_id, BatchStatus.CANCELLING) is not None
    moto_aws.messages("FinalizeQueue")  # lost
    before = batches.get(batch_id)
    assert sweep_later(stuck() - 60) == NO_ACTIONS
    assert sweep_later(stuck()) == {**NO_ACTIONS, "finalize": 1}
    assert moto_aws.messages("FinalizeQueue") == [{"batch_id": batch_id}]
    assert batches.get(batch_id) == before


def test_a_quiet_validating_batch_gets_its_prepare_again(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREPARE_WAIT_SECONDS", str(stuck()))  # a message not received by then is lost
    batch_id = create(moto_aws, lines(3), monkeypatch)  # its prepare message lost
    assert sweep_later(stuck() - 60) == NO_ACTIONS
    assert sweep_later(stuck()) == {**NO_ACTIONS, "prepare": 1}
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": batch_id}]
    assert prepare.prepare_batch(batch_id) == "in_progress"


def test_a_prepare_message_waiting_in_a_backlog_is_never_sent_again(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose prepare message waits behind other batches' (sent, never received)
    monkeypatch.setenv("PREPARE_WAIT_SECONDS", str(5 * stuck()))  # within the 24h window here
    batch_id = create(moto_aws, lines(3), monkeypatch)
    prepare_message = [{"batch_id": batch_id}]
    # (`create` took the creation's message out of the queue to check it: put back, it waits again)
    sqs.send(get_settings().prepare_queue_url, [sqs.BatchMessage(**prepare_message[0])], group_id="default")

    # When the sweeper looks again and again while the batch is quiet
    sweeps = [sweep_later(stuck() * n) for n in (1, 2, 3, 4)]

    # Then waiting is not failure: the one message still waits, no second one was sent
    assert sweeps == [NO_ACTIONS] * 4
    assert moto_aws.messages("PrepareQueue") == prepare_message
    # Only a message older than `prepare_wait_seconds` is lost: then it is sent again, once
    assert sweep_later(5 * stuck() + 1) == {**NO_ACTIONS, "prepare": 1}
    assert sweep_later(5 * stuck() + 2) == NO_ACTIONS
    assert moto_aws.messages("PrepareQueue") == prepare_message


@pytest.mark.parametrize("death", ["raised", "killed"])
def test_a_prepare_that_died_is_sent_again_once_its_lease_lapsed(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, death: str
) -> None:
    # Given a batch whose prepare died mid-stream, its message received (none waits): one that raised
    # (its lease lapsed at once), or one that was killed (its lease lapses 60 s after its last beat)
    monkeypatch.setenv("STUCK_AFTER_SECONDS", "10")
    batch_id = create(moto_aws, lines(3), monkeypatch)
    if death == "raised":
        prepare_failing(batch_id, prepare.s3, "put_bytes", TimeoutError("the Lambda timed out"))
    else:
        assert batches.claim_prepare(batch_id, owner="dead", lease_seconds=60) is not None

    # When the sweeper looks once the batch is quiet, and again once the lease has lapsed
    first, second = sweep_later(30), sweep_later(61)

    # Then its prepare is sent once, as soon as no lease holds the batch
    sent = {**NO_ACTIONS, "prepare": 1}
    assert (first, second) == ((sent, NO_ACTIONS) if death == "raised" else (NO_ACTIONS, sent))
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": batch_id}]
    # and the batch starts when that message arrives (at the sweeper's time), each shard's message
    # sent exactly once
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batches, "now", lambda: now() + 61)
        assert prepare.prepare_batch(batch_id) == "in_progress"
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": n} for n in (0, 1)]
    assert sweep_later(120) == NO_ACTIONS  # its shard messages wait: nothing more is sent
    assert [moto_aws.messages(queue) for queue in QUEUES] == [[], [], []]


def test_a_shard_waiting_in_a_backlog_is_never_redriven_nor_failed(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose shard messages wait behind other batches' work (sent, never received)
    monkeypatch.setenv("MAX_SHARD_ATTEMPTS", "1")
    monkeypatch.setenv("SHARD_WAIT_SECONDS", str(5 * stuck()))  # within the 24h window here
    batch_id = prepared(moto_aws, lines(3), monkeypatch)

    # When the sweeper looks again and again while the batch is quiet
    sweeps = [sweep_later(stuck() * n) for n in (1, 2, 3, 4)]

    # Then waiting is not failure: nothing re-sent, nothing counted, no line given up
    assert sweeps == [NO_ACTIONS] * 4
    assert [(s.state, s.redrives) for s in shards.query(batch_id)] == [("pending", None), ("pending", None)]
    assert moto_aws.messages("ShardsQueue") == []
    # Only a message older than the queue keeps any (`shard_wait_seconds`) is lost: then it is re-sent
    assert sweep_later(5 * stuck() + 1) == {**NO_ACTIONS, "shards": 2}
    assert [s.redrives for s in shards.query(batch_id)] == [1, 1]


def test_a_shard_whose_worker_died_is_redriven_once_quiet(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a shard a worker claimed and died holding (its lease ran out; SQS would return the message
    # only after the visibility timeout)
    batch_id = prepared(moto_aws, lines(2), monkeypatch)
    assert shards.claim(batch_id, 0, owner="dead", lease_seconds=-1) is not None
    # Then the quiet batch's shard is re-sent and counted
    assert sweep_later(stuck()) == {**NO_ACTIONS, "shards": 1}
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": 0}]
    # and the re-sent message then waits like any other: not re-sent again before it is received
    assert sweep_later(2 * stuck()) == NO_ACTIONS
    assert shards.get(batch_id, 0).redrives == 1


def test_a_leased_shard_holds_off_the_redrive_until_its_lease_ends(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given shard 0 leased by a worker for twice the quiet time, and shard 1 whose message was lost
    # (not received within `shard_wait_seconds`)
    monkeypatch.setenv("SHARD_WAIT_SECONDS", str(stuck()))
    batch_id = prepared(moto_aws, lines(3), monkeypatch)
    assert shards.claim(batch_id, 0, owner="worker", lease_seconds=2 * stuck()) is not None
    # Then a quiet batch with a live lease is slow, not stuck: nothing is sent, nothing counted
    assert sweep_later(stuck() + 1) == NO_ACTIONS
    assert [s.redrives for s in shards.query(batch_id)] == [None, None]
    # Once the lease has ended, both pending shards are sent again
    assert sweep_later(2 * stuck() + 1) == {**NO_ACTIONS, "shards": 2}
    assert moto_aws.messages("ShardsQueue") == [
        {"batch_id": batch_id, "shard": 0},
        {"batch_id": batch_id, "shard": 1},
    ]
    assert [s.redrives for s in shards.query(batch_id)] == [1, 1]


def test_a_shard_redriven_too_often_is_failed_and_the_batch_ends(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (each message lost: never received within `shard_wait_seconds`)
    monkeypatch.setenv("MAX_SHARD_ATTEMPTS", "1")
    monkeypatch.setenv("SHARD_WAIT_SECONDS", str(stuck()))
    batch_id = prepared(moto_aws, lines(2), monkeypatch)
    assert sweep_later(stuck()) == {**NO_ACTIONS, "shards": 1}
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": 0}]  # ... dies again
    assert sweep_later(2 * stuck()) == {**NO_ACTIONS, "failed_shards": 1}
    assert moto_aws.messages("ShardsQueue") == []
    assert moto_aws.messages("FinalizeQueue") == [{"batch_id": batch_id}]
    shard = shards.get(batch_id, 0)
    assert (shard.state, shard.next_index, shard.failed, shard.redrives) == ("done", 2, 2, 2)
    assert aggregate.finalize_batch(batch_id) == "completed"
    header = batches.get(batch_id)
    assert header.request_counts.model_dump() == {"total": 2, "completed": 0, "failed": 2}
    assert [
        (line["custom_id"], line["response"], line["error"]) for line in result_lines(header.error_file_id)
    ] == [
        (
            f"r{i}",
            None,
            {"code": "processing_failed", "message": "The request was not processed after 1 re-drives."},
        )
        for i in (1, 2)
    ]


def test_giving_up_on_a_shard_a_worker_just_claimed_writes_nothing(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a shard the sweeper found without a lease, claimed by a worker the moment after
    batch_id = prepared(moto_aws, lines(2), monkeypatch)
    shard = shards.get(batch_id, 0)
    assert shards.claim(batch_id, 0, owner="worker", lease_seconds=60) is not None

    # When the sweeper gives up on it
    failed = sweep.fail_shard(batch_id, shard, "given up")

    # Then nothing is written under the worker (its result key is its own) and nothing counted
    assert failed is False
    assert s3.keys_under(moto_aws.bucket, f"batches/{batch_id}/results/") == []
    after = shards.get(batch_id, 0)
    assert (after.state, after.next_index, after.failed, after.lease_owner) == ("pending", 0, 0, "worker")


def ended_batches(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A completed, a failed and a cancelled batch (their ids), every queue drained after."""
    completed = prepared(aws, lines(1), monkeypatch)
    assert run_shard(completed, 0) == "done"
    assert aggregate.finalize_batch(completed) == "completed"
    failed = create(aws, b"{oops\n", monkeypatch)
    assert prepare.prepare_batch(failed) == "failed"
    cancelled = create(aws, lines(1), monkeypatch)
    assert batches.transition(cancelled, BatchStatus.CANCELLING) is not None
    assert aggregate.finalize_batch(cancelled) == "cancelled"
    for queue in QUEUES:
        aws.messages(queue)
    return [completed, failed, cancelled]


def test_terminal_batches_are_never_touched(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a completed, a failed and a cancelled batch
    ended_ids = ended_batches(moto_aws, monkeypatch)
    ended = [batches.get(batch_id) for batch_id in ended_ids]
    # When the sweeper runs long after their windows closed
    assert sweep_later(3 * 24 * 3600) == NO_ACTIONS
    assert [batches.get(batch_id) for batch_id in ended_ids] == ended
    assert [moto_aws.messages(queue) for queue in QUEUES] == [[], [], []]


def test_a_sweep_reads_the_open_batches_and_no_item_of_an_ended_one(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a completed, a failed and a cancelled batch, and an open one whose prepare message was lost
    ended_batches(moto_aws, monkeypatch)
    monkeypatch.setenv("PREPARE_WAIT_SECONDS", str(stuck()))  # a message not received by then is lost
    lost = create(moto_aws, lines(1), monkeypatch)
    assert sweep.sweep() == NO_ACTIONS  # (the first sweep also ends the one-off backfill: nothing to add)

    # When the sweeper runs once the open batch is quiet, its reads recorded
    seen = reads(monkeypatch)
    assert sweep_later(stuck()) == {**NO_ACTIONS, "prepare": 1}

    # Then it found the open batch, from one query of the open-batch index that read one entry, and
    # read that batch's header and the backfill's marker: no scan, no item of an ended batch
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": lost}]
    assert [(op, params.get("IndexName"), params.get("Key")) for op, params, _ in seen] == [
        ("get_item", None, {"PK": "SWEEPER", "SK": "OPEN_BACKFILL"}),
        ("query", "OpenBatches", None),
        ("get_item", None, {"PK": f"BATCH#{lost}", "SK": "META"}),
    ]
    assert (seen[1][2]["ScannedCount"], seen[1][2]["Items"][0]["OPENSK"]) == (1, lost)
