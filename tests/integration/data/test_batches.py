"""Batch headers (data/batches.py) in moto's copy of the template's table: what is stored, the
conditional writes and transactions of creation and every status change, listing and scanning."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from batchinfer.core import aws
from batchinfer.data import accounts, batches, keys
from batchinfer.data.accounts import LimitExceeded
from batchinfer.data.items import BatchChanges, BatchHeader
from batchinfer.data.table import CONFLICT_ATTEMPTS, TransactionConflict
from batchinfer.wire.openai import BatchErrors, LineErrorOut, RequestCounts
from batchinfer.wire.status import BatchStatus
from support.data import batch_header, intercept_transactions, small_pages
from support.moto_env import Aws

T0 = 1_800_000_000


def stored(batch_id: str) -> dict:
    return aws.table().get_item(Key=keys.batch(batch_id))["Item"]


def counted(account: str = "acct") -> int:
    return accounts.active_batches(account)


# ---- creation --------------------------------------------------------------------------------------


def test_put_stores_the_header_once_with_its_keys(moto_aws: Aws) -> None:
    header = batch_header(id="batch_1", metadata={"k": "v"})
    assert batches.put(header) is True
    assert batches.put(batch_header(id="batch_1", account="other")) is False
    item = stored("batch_1")
    assert re.fullmatch(rf"{T0}#\d{{19}}#batch_1", item.pop("GSI1SK"))
    assert item == {
        "PK": "BATCH#batch_1",
        "SK": "META",
        "GSI1PK": "ACCOUNT#acct",
        "OPENPK": "OPEN",  # open: in the OpenBatches index
        "OPENSK": "batch_1",
        "id": "batch_1",
        "object": "batch",
        "account_id": "acct",
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-x",
        "completion_window": "24h",
        "status": "validating",
        "created_at": T0,
        "expires_at": T0 + 86_400,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cached_tokens": 0},
        "metadata": {"k": "v"},
        "shards_total": 0,
        "shards_done": 0,
        "input_bucket": "in-bucket",
        "input_key": "files/file-x",
        "input_where": "",
        "output_bucket": "out-bucket",
        "output_prefix": "batches/batch_1/",
        "output_where": "",
        "live": {},
    }
    assert counted() == 0


def test_get_reads_decimals_back_as_ints(moto_aws: Aws) -> None:
    header = batch_header(request_counts=RequestCounts(total=7, completed=3, failed=1))
    batches.put(header)
    assert isinstance(stored(header.id)["created_at"], Decimal)  # what DynamoDB hands back
    got = batches.get(header.id)
    assert got == header
    assert type(got.created_at) is int and type(got.request_counts.completed) is int
    assert batches.get(header.id, consistent=False) == header
    assert batches.get("batch_missing") is None


def test_create_limited_counts_the_batch_with_its_header(moto_aws: Aws) -> None:
    header = batch_header()
    assert batches.create_limited(header, max_active=2, max_per_minute=5, at=T0 + 75) is True
    assert batches.get(header.id) == header.model_copy(update={"active_counted": True})
    assert stored(header.id)["active_counted"] is True
    minute = T0 + 60  # T0 is a minute's first second
    assert aws.table().get_item(Key=keys.rate_counter("acct", minute))["Item"] == {
        "PK": "ACCOUNT#acct",
        "SK": f"RATE#{minute}",
        "creates": 1,
        "ttl": minute + 3600,
    }
    assert aws.table().get_item(Key=keys.active_counter("acct"))["Item"] == {
        "PK": "ACCOUNT#acct",
        "SK": "LIMITS",
        "active_batches": 1,
    }


def test_creations_per_minute_are_counted_per_calendar_minute(moto_aws: Aws) -> None:
    minute = T0 - T0 % 60
    for second in (0, 10, 20):
        assert batches.create_limited(batch_header(), max_active=None, max_per_minute=3, at=minute + second)
    refused = batch_header()
    with pytest.raises(LimitExceeded) as error:
        batches.create_limited(refused, max_active=None, max_per_minute=3, at=minute + 45)
    assert (error.value.kind, error.value.limit, error.value.retry_after) == ("rate", 3, 15)
    assert batches.get(refused.id) is None
    assert batches.create_limited(batch_header(), max_active=None, max_per_minute=3, at=minute + 60)
    assert counted() == 4  # the refused one was not counted


def test_active_limit_and_exactly_once_decrement(moto_aws: Aws) -> None:
    first, second, third = batch_header(), batch_header(), batch_header()
    assert batches.create_limited(first, max_active=2, max_per_minute=None)
    assert batches.create_limited(second, max_active=2, max_per_minute=None)
    assert not batches.create_limited(first, max_active=None, max_per_minute=None)  # exists: not counted
    with pytest.raises(LimitExceeded) as refused:
        batches.create_limited(third, max_active=2, max_per_minute=None)
    assert (refused.value.kind, refused.value.limit, refused.value.retry_after) == ("active", 2, 30)
    assert batches.get(third.id) is None

    # A terminal transition decrements once, however often it is attempted; non-terminal ones don't.
    assert batches.transition(first.id, BatchStatus.FAILED, at=T0 + 5).status == BatchStatus.FAILED
    assert batches.transition(first.id, BatchStatus.FAILED) is None
    assert batches.transition(second.id, BatchStatus.CANCELLING).status == BatchStatus.CANCELLING
    assert counted() == 1
    assert batches.create_limited(third, max_active=2, max_per_minute=None)
    assert counted() == 2
    assert batches.get(first.id).failed_at == T0 + 5


def test_both_limits_reached_refuse_for_the_rate(moto_aws: Aws) -> None:
    assert batches.create_limited(batch_header(), max_active=1, max_per_minute=1, at=T0)
    with pytest.raises(LimitExceeded) as refused:
        batches.create_limited(batch_header(), max_active=1, max_per_minute=1, at=T0 + 1)
    assert (refused.value.kind, refused.value.retry_after) == ("rate", 59)


def test_batches_written_without_counting_are_never_decremented(moto_aws: Aws) -> None:
    header = batch_header()
    assert batches.put(header)
    assert batches.transition(header.id, BatchStatus.FAILED).status == BatchStatus.FAILED
    assert counted() == 0


def test_create_limited_retries_a_conflict_and_counts_once(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = intercept_transactions(monkeypatch, "conflict", "conflict")
    header = batch_header()
    assert batches.create_limited(header, max_active=5, max_per_minute=5, at=T0)
    assert len(seen.calls) == 3 and len(seen.waits) == 2
    assert [len(items) for items in seen.calls] == [3, 3, 3]
    assert counted() == 1 and batches.get(header.id).active_counted is True


def test_create_limited_raises_a_conflict_that_persists(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = intercept_transactions(monkeypatch, *["conflict"] * CONFLICT_ATTEMPTS)
    header = batch_header()
    with pytest.raises(TransactionConflict):
        batches.create_limited(header, max_active=5, max_per_minute=None)
    assert len(seen.calls) == CONFLICT_ATTEMPTS
    assert batches.get(header.id) is None and counted() == 0


# ---- status changes --------------------------------------------------------------------------------


def test_transition_from_an_allowed_source_stamps_its_time_and_writes_the_changes(moto_aws: Aws) -> None:
    header = batch_header()
    batches.put(header)
    started = batches.transition(
        header.id,
        BatchStatus.IN_PROGRESS,
        at=T0 + 10,
        changes=BatchChanges(shards_total=3, model="m", request_counts=RequestCounts(total=5)),
    )
    assert started == header.model_copy(
        update={
            "status": BatchStatus.IN_PROGRESS,
            "in_progress_at": T0 + 10,
            "shards_total": 3,
            "model": "m",
            "request_counts": RequestCounts(total=5, completed=0, failed=0),
        }
    )
    assert stored(header.id)["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    # validating -> in_progress only: a repeated or late step changes nothing
    assert (
        batches.transition(header.id, BatchStatus.IN_PROGRESS, changes=BatchChanges(shards_total=9)) is None
    )
    assert batches.transition(header.id, BatchStatus.COMPLETED) is None
    assert batches.get(header.id) == started


def test_transition_writes_given_nulls_and_errors(moto_aws: Aws) -> None:
    header = batch_header()
    batches.put(header)
    errors = BatchErrors(data=[LineErrorOut(code="invalid_json_line", message="bad", line=2)])
    failed = batches.transition(
        header.id, BatchStatus.FAILED, at=T0 + 3, changes=BatchChanges(errors=errors, output_file_id=None)
    )
    assert (failed.errors, failed.failed_at, failed.output_file_id) == (errors, T0 + 3, None)
    item = stored(header.id)
    assert item["errors"] == {
        "object": "list",
        "data": [{"code": "invalid_json_line", "message": "bad", "param": None, "line": 2}],
    }
    assert "output_file_id" in item and item["output_file_id"] is None


def test_transition_to_finalizing_can_require_every_shard_done(moto_aws: Aws) -> None:
    header = batch_header(status=BatchStatus.IN_PROGRESS, shards_total=2, shards_done=1)
    batches.put(header)
    seal = BatchChanges(sealed=True, final_status=BatchStatus.COMPLETED)
    assert batches.transition(header.id, BatchStatus.FINALIZING, changes=seal, all_shards_done=True) is None
    batches.put(header.model_copy(update={"id": "batch_done", "shards_done": 2}))
    sealed = batches.transition("batch_done", BatchStatus.FINALIZING, changes=seal, all_shards_done=True)
    assert (sealed.status, sealed.sealed, sealed.final_status) == (
        BatchStatus.FINALIZING,
        True,
        BatchStatus.COMPLETED,
    )


def test_a_counted_terminal_transition_retries_conflicts(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    header = batch_header()
    batches.create_limited(header, max_active=None, max_per_minute=None)
    seen = intercept_transactions(monkeypatch, "conflict")
    ended = batches.transition(header.id, BatchStatus.FAILED, at=T0 + 1)
    assert (ended.status, ended.failed_at) == (BatchStatus.FAILED, T0 + 1)
    assert len(seen.calls) == 2 and counted() == 0
    assert [list(item) for item in seen.calls[1]] == [["Update"], ["Update"]]
    assert seen.calls[1][1]["Update"]["Key"] == keys.active_counter("acct")


def test_update_needs_the_batch_and_optionally_its_status(moto_aws: Aws) -> None:
    header = batch_header(status=BatchStatus.CANCELLING)
    batches.put(header)
    seal = BatchChanges(sealed=True, final_status=BatchStatus.CANCELLED)
    assert batches.update(header.id, seal, status=BatchStatus.IN_PROGRESS) is None
    assert batches.update(header.id, seal, status=BatchStatus.CANCELLING) == header.model_copy(
        update={"sealed": True, "final_status": BatchStatus.CANCELLED}
    )
    assert batches.update(header.id, BatchChanges(expires_at=T0)).expires_at == T0
    assert batches.update("batch_missing", BatchChanges(expires_at=T0)) is None
    assert "Item" not in aws.table().get_item(Key=keys.batch("batch_missing"))
    with pytest.raises(ValueError, match="no changes"):
        batches.update(header.id, BatchChanges())


def test_changes_refuse_unknown_attributes() -> None:
    with pytest.raises(ValueError, match="shards_don"):
        BatchChanges(shards_don=1)  # type: ignore[call-arg]


# ---- listing ---------------------------------------------------------------------------------------


def test_page_lists_an_accounts_batches_newest_first(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    made = [batch_header(created_at=T0 + n) for n in range(5)]
    for header in made:
        batches.create_limited(header, max_active=None, max_per_minute=None)
    batches.put(batch_header(account="other", created_at=T0 + 9))
    newest = [h.id for h in reversed(made)]
    calls = small_pages(monkeypatch, "query", limit=2)

    first, more = batches.page("acct", limit=2)
    assert ([h.id for h in first], more) == (newest[:2], True)
    assert calls[0]["Limit"] == 3
    second, more = batches.page("acct", limit=2, after=first[-1].id)
    assert ([h.id for h in second], more) == (newest[2:4], True)
    last, more = batches.page("acct", limit=2, after=second[-1].id)
    assert ([h.id for h in last], more) == (newest[4:], False)
    assert batches.page("acct", limit=10) == (
        [h.model_copy(update={"active_counted": True}) for h in reversed(made)],
        False,
    )
    assert batches.page("nobody", limit=10) == ([], False)


def test_page_after_a_batch_the_account_does_not_own_is_empty(moto_aws: Aws) -> None:
    mine, theirs = batch_header(), batch_header(account="other")
    batches.put(mine)
    batches.put(theirs)
    assert batches.page("acct", limit=10, after=theirs.id) == ([], False)
    assert batches.page("acct", limit=10, after="batch_missing") == ([], False)
    assert batches.page("acct", limit=10, after=mine.id) == ([], False)


def open_index() -> list[str]:
    """The batch ids in `OpenBatches`, read from the index itself."""
    answer = aws.table().query(
        IndexName="OpenBatches",
        KeyConditionExpression="OPENPK = :open",
        ExpressionAttributeValues={":open": "OPEN"},
    )
    return [entry["OPENSK"] for entry in answer["Items"]]


def test_only_open_batches_are_in_the_open_index_and_an_ending_one_leaves_it(moto_aws: Aws) -> None:
    # Given a batch stored in every status (a terminal header stored as such: an inbox upload refused)
    by_status = {status: batch_header(id=f"batch_{status.value}", status=status) for status in BatchStatus}
    for header in by_status.values():
        batches.put(header)
    assert sorted(open_index()) == [
        "batch_cancelling",
        "batch_finalizing",
        "batch_in_progress",
        "batch_validating",
    ]
    assert (stored("batch_validating")["OPENPK"], stored("batch_validating")["OPENSK"]) == (
        "OPEN",
        "batch_validating",
    )
    assert "OPENPK" not in stored("batch_completed") and "OPENSK" not in stored("batch_completed")

    # When open batches end: a counted one (transaction) and one not counted (single update)
    counted_batch = batch_header(id="batch_counted")
    assert batches.create_limited(counted_batch, max_active=5, max_per_minute=None)
    assert "batch_counted" in open_index()
    assert batches.transition("batch_counted", BatchStatus.FAILED) is not None
    assert batches.transition("batch_validating", BatchStatus.FAILED) is not None
    # and a transition whose condition fails (finalizing -> failed is allowed, validating -> completed not)
    assert batches.transition("batch_in_progress", BatchStatus.COMPLETED) is None

    # Then both left the index (their index attributes removed in the same write), the rest stayed
    assert sorted(open_index()) == ["batch_cancelling", "batch_finalizing", "batch_in_progress"]
    for batch_id in ("batch_counted", "batch_validating"):
        item = stored(batch_id)
        assert (item["status"], "OPENPK" in item, "OPENSK" in item) == ("failed", False, False)
    assert counted() == 0


def test_open_headers_reads_the_index_page_by_page(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    by_status = {status: batch_header(status=status) for status in BatchStatus}
    for header in by_status.values():
        batches.put(header)
    accounts.ensure_account("acct")  # other items in the table are not batches
    calls = small_pages(monkeypatch, "query", limit=1)
    found = sorted(batches.open_headers(), key=lambda h: h.status)
    assert [h.status for h in found] == sorted(
        [BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING]
    )
    assert all(h == by_status[h.status] for h in found)
    # pages of one entry (moto ends the last one without a next key), all from the index
    assert [c["IndexName"] for c in calls] == ["OpenBatches"] * 4


def test_a_header_ended_after_the_index_named_it_is_skipped(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the index is eventually consistent: it may still name a batch that ended a moment ago)
    header = batch_header(id="batch_late")
    batches.put(header)
    monkeypatch.setattr(
        batches, "get", lambda batch_id: header.model_copy(update={"status": BatchStatus.FAILED})
    )
    assert list(batches.open_headers()) == []


def put_before_the_index(header: BatchHeader) -> None:
    """Store `header` as the code before `OpenBatches` did: without the index attributes."""
    record = {**keys.batch(header.id), **header.stored()}
    aws.table().put_item(Item=record)


def test_the_backfill_puts_old_open_batches_into_the_index_once_resuming_page_by_page(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given headers written before the index: one per status
    for status in BatchStatus:
        put_before_the_index(batch_header(id=f"batch_{status.value}", status=status))
    batches.put(batch_header(id="batch_new"))  # and one written since: in the index already
    assert open_index() == ["batch_new"]
    scans = small_pages(monkeypatch, "scan", limit=3)

    # When the backfill runs two pages a sweep (10 items, 3 a page: 4 pages)
    first = batches.backfill_open_index(max_pages=2)
    progress = aws.table().get_item(Key=keys.open_backfill())["Item"]
    assert (len(scans), progress["done"], len(open_index())) == (2, False, 1 + first)
    second = batches.backfill_open_index(max_pages=2)
    assert len(scans) == 4

    # Then every open one is in the index, no terminal one; the scan resumed where it stopped and ended
    assert sorted(open_index()) == [
        "batch_cancelling",
        "batch_finalizing",
        "batch_in_progress",
        "batch_new",
        "batch_validating",
    ]
    assert first + second == 4
    assert scans[2]["ExclusiveStartKey"] == progress["position"]
    assert aws.table().get_item(Key=keys.open_backfill())["Item"] == {**keys.open_backfill(), "done": True}
    # and it never scans again
    assert batches.backfill_open_index() is None
    assert len(scans) == 4


def test_the_backfill_leaves_a_batch_that_ended_meanwhile_out(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = batch_header(id="batch_old")
    put_before_the_index(old)
    real_scan = aws.table().scan

    def scan_then_end(**params: Any) -> Any:
        answer = real_scan(**params)
        assert batches.transition("batch_old", BatchStatus.FAILED) is not None  # ends after the scan saw it
        return answer

    monkeypatch.setattr(aws.table(), "scan", scan_then_end)
    assert batches.backfill_open_index() == 0
    assert open_index() == []
    assert "OPENPK" not in stored("batch_old")


# ---- the prepare lease -----------------------------------------------------------------------------


NOW = batches.now()  # the lease's clock: the real one


def prepare_state(batch_id: str) -> tuple[Any, ...]:
    item = stored(batch_id)
    return tuple(item.get(name) for name in ("prepare_owner", "prepare_lease_until", "prepare_queued_at"))


def test_the_prepare_lease_is_held_by_one_prepare_at_a_time(moto_aws: Aws) -> None:
    header = batch_header(prepare_queued_at=NOW)
    assert batches.put(header)
    # A claim takes the lease and the waiting message; a second one is refused while the lease is live
    before = batches.claim_prepare(header.id, owner="a", lease_seconds=60)
    assert (before.prepare_owner, before.prepare_queued_at) == (None, NOW)  # the header as it was
    owner, until, queued = prepare_state(header.id)
    assert (owner, queued) == ("a", None) and until >= batches.now() + 59
    assert batches.claim_prepare(header.id, owner="b", lease_seconds=60) is None
    assert batches.queue_prepare(header.id, at=NOW + 1) is False  # a prepare works on it: none is sent
    # Only its owner renews it
    assert batches.renew_prepare(header.id, owner="b", lease_seconds=60) is False
    assert batches.renew_prepare(header.id, owner="a", lease_seconds=120) is True
    assert prepare_state(header.id)[1] >= batches.now() + 119
    # A busy prepare's message arrived: it waits no more (only while a live lease holds the batch)
    aws.table().update_item(
        Key=keys.batch(header.id),
        UpdateExpression="SET prepare_queued_at = :t",
        ExpressionAttributeValues={":t": NOW},
    )
    assert batches.unqueue_prepare(header.id) is True
    assert prepare_state(header.id)[2] is None
    # A failed prepare lapses its lease (still present); a finished one removes it
    assert batches.release_prepare(header.id, owner="b", finished=False) is False
    assert batches.release_prepare(header.id, owner="a", finished=False) is True
    assert prepare_state(header.id) == ("a", 0, None)
    assert batches.unqueue_prepare(header.id) is False  # no live lease
    assert batches.claim_prepare(header.id, owner="b", lease_seconds=60).prepare_lease_until == 0
    assert batches.release_prepare(header.id, owner="b", finished=True) is True
    assert prepare_state(header.id) == ("b", None, None)
    assert batches.renew_prepare(header.id, owner="b", lease_seconds=60) is False  # never revived


def test_a_prepare_message_is_recorded_only_for_a_batch_prepare_may_act_on(moto_aws: Aws) -> None:
    header = batch_header()
    assert batches.put(header)
    assert batches.queue_prepare(header.id, at=NOW) is True
    assert batches.unqueue_prepare(header.id, at=NOW + 1) is False  # another send's record stays
    assert prepare_state(header.id) == (None, None, NOW)
    assert batches.unqueue_prepare(header.id, at=NOW) is True
    assert prepare_state(header.id) == (None, None, None)
    # The start is conditional on the lease's owner
    assert batches.claim_prepare(header.id, owner="a", lease_seconds=60) is not None
    assert batches.transition(header.id, BatchStatus.IN_PROGRESS, prepare_owner="b") is None
    assert batches.transition(header.id, BatchStatus.IN_PROGRESS, prepare_owner="a") is not None
    assert batches.transition(header.id, BatchStatus.CANCELLING) is not None
    # Past in_progress: no claim, no record
    assert batches.release_prepare(header.id, owner="a", finished=True) is True
    assert batches.claim_prepare(header.id, owner="c", lease_seconds=60) is None
    assert batches.queue_prepare(header.id, at=NOW) is False
    assert prepare_state(header.id) == ("a", None, None)
