"""Batch headers (`items.BatchHeader`, keys in `keys`): create, read, list, and every status change.

Every status change is an `update_item` whose condition lists the allowed source statuses
(`wire.status.allowed_sources`); a failed condition is reported as `None`/`False`, never raised.

Batches created through `create_limited` are counted in their account's active-batch counter
(`active_counted` on the header); the one write that makes such a batch terminal decrements it in the
same transaction, so the counter is exact under concurrent creates and transitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from batchinfer.data import accounts, keys
from batchinfer.data.accounts import ACTIVE_RETRY_AFTER_S, LimitExceeded
from batchinfer.data.items import BatchChanges, BatchHeader, LiveProgress
from batchinfer.data.table import (
    assignments,
    conditional,
    handle,
    items,
    now,
    read_page,
    retry_conflicts,
    transact,
)
from batchinfer.wire.status import TIMESTAMP_FIELD, BatchStatus, allowed_sources, is_terminal

OPEN_STATUSES = tuple(s for s in BatchStatus if not is_terminal(s))


def _record(header: BatchHeader) -> dict[str, Any]:
    return {
        **keys.indexed(
            keys.batch(header.id),
            keys.account_batches(header.account_id),
            keys.creation_order(header.created_at, header.id),
        ),
        **header.stored(),
    }


def put(header: BatchHeader) -> bool:
    """Store a new batch header, not counted against its account (see `create_limited`).

    Returns False, writing nothing, when a batch with that id exists already (idempotent create).
    """
    return (
        conditional(handle().put_item, Item=_record(header), ConditionExpression="attribute_not_exists(PK)")
        is not None
    )


@retry_conflicts
def create_limited(
    header: BatchHeader, *, max_active: int | None, max_per_minute: int | None, at: int | None = None
) -> bool:
    """Store a new batch header and count it against its account, in one transaction.

    The header (with `active_counted`) is written only if the account has fewer than `max_active`
    counted batches that are not terminal and fewer than `max_per_minute` creations in the calendar
    minute of `at` (Unix seconds, default now); None skips that check (inbox uploads are counted but
    never refused). Returns False, writing nothing, when the batch exists already (idempotent create).
    Raises `accounts.LimitExceeded` when a limit is reached (the rate limit first when both are).
    """
    at = now() if at is None else at
    minute = at - at % 60
    counted = header.model_copy(update={"active_counted": True})
    actions = [
        {"Put": {"Item": _record(counted), "ConditionExpression": "attribute_not_exists(PK)"}},
        accounts.count_active(header.account_id, max_active),
    ]
    if max_per_minute is not None:
        actions.append(accounts.count_creation(header.account_id, minute, max_per_minute))
    failed = transact(actions)
    if not failed:
        return True
    if 0 in failed:
        return False
    if 2 in failed and max_per_minute is not None:
        raise LimitExceeded("rate", max_per_minute, max(1, minute + 60 - at))
    if 1 in failed and max_active is not None:
        raise LimitExceeded("active", max_active, ACTIVE_RETRY_AFTER_S)
    raise RuntimeError(f"unconditional actions {sorted(failed)} failed a condition")


def get(batch_id: str, *, consistent: bool = True) -> BatchHeader | None:
    """The batch header, or None."""
    item = handle().get_item(Key=keys.batch(batch_id), ConsistentRead=consistent).get("Item")
    return BatchHeader.model_validate(item) if item else None


def transition(
    batch_id: str,
    target: BatchStatus,
    *,
    changes: BatchChanges | None = None,
    all_shards_done: bool = False,
    at: int | None = None,
) -> BatchHeader | None:
    """Move a batch to `target` if its status is an allowed source (and, with `all_shards_done`,
    `shards_done = shards_total`), writing `changes` too.

    Stamps the status's timestamp field (`in_progress_at`, ...) with `at` (default now). Returns the
    new header, or None when the condition failed (a concurrent or repeated step: a no-op, not an
    error). A terminal `target` of a counted batch also decrements its account's active-batch
    counter, in the same transaction (only one write can make a batch terminal, so it is decremented
    exactly once).
    """
    sets = {**(changes.assigned() if changes else {}), TIMESTAMP_FIELD[target]: now() if at is None else at}
    expression, names, values = assignments(sets)
    sources = sorted(allowed_sources(target))
    names["#status"] = "status"
    values |= {":target": target.value, **{f":s{i}": source.value for i, source in enumerate(sources)}}
    condition = f"#status IN ({', '.join(f':s{i}' for i in range(len(sources)))})"
    if all_shards_done:
        condition = f"({condition}) AND (shards_done = shards_total)"
    update = {
        "Key": keys.batch(batch_id),
        "UpdateExpression": f"SET #status = :target, {expression}",
        "ConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    if is_terminal(target):
        header = get(batch_id)
        if header is not None and header.active_counted:
            return _transition_counted(batch_id, header.account_id, update)
    result = conditional(handle().update_item, **update, ReturnValues="ALL_NEW")
    return None if result is None else BatchHeader.model_validate(result["Attributes"])


@retry_conflicts
def _transition_counted(batch_id: str, account_id: str, update: dict[str, Any]) -> BatchHeader | None:
    if transact([{"Update": update}, accounts.uncount_active(account_id)]):
        return None
    return get(batch_id)


def update(batch_id: str, changes: BatchChanges, *, status: BatchStatus | None = None) -> BatchHeader | None:
    """SET `changes` (at least one field) on an existing batch header, if its status is `status` (None:
    any); the new header, or None when there is no such batch or its status differs. Not a status
    change: those go through `transition`."""
    expression, names, values = assignments(changes.assigned())
    if not expression:
        raise ValueError("no changes to write")
    condition = "attribute_exists(PK)"
    if status is not None:
        names["#status"], values[":status"], condition = "status", status.value, "#status = :status"
    result = conditional(
        handle().update_item,
        Key=keys.batch(batch_id),
        UpdateExpression=f"SET {expression}",
        ConditionExpression=condition,
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
        ReturnValues="ALL_NEW",
    )
    return None if result is None else BatchHeader.model_validate(result["Attributes"])


def publish_progress(batch_id: str, shard_no: int, progress: LiveProgress) -> BatchHeader | None:
    """The shard worker's one periodic write: SET the header's `live.<shard_no>` to `progress`
    (absolute values: a retried or repeated write changes nothing), answering the header as it is
    now (`ReturnValues=ALL_NEW`), so the worker learns a cancel or an expiry with no extra read.

    Returns None when the batch does not exist (nothing written). A header stored without the `live`
    map (written before it existed) fails with DynamoDB's ValidationException.
    """
    result = conditional(
        handle().update_item,
        Key=keys.batch(batch_id),
        UpdateExpression="SET live.#shard = :progress",
        ConditionExpression="attribute_exists(PK)",
        ExpressionAttributeNames={"#shard": str(shard_no)},
        ExpressionAttributeValues={":progress": progress.model_dump(mode="json")},
        ReturnValues="ALL_NEW",
    )
    return None if result is None else BatchHeader.model_validate(result["Attributes"])


def bump_finalize_failures(batch_id: str) -> int:
    """Count one more aggregator run that could not write the batch's result files; the new count."""
    result = handle().update_item(
        Key=keys.batch(batch_id),
        UpdateExpression="ADD finalize_failures :one",
        ExpressionAttributeValues={":one": 1},
        ReturnValues="UPDATED_NEW",
    )
    return int(result["Attributes"]["finalize_failures"])


def begin_expiry(batch_id: str, *, at: int | None = None) -> BatchHeader | None:
    """`in_progress -> finalizing` with `final_status = expired`, not sealed yet: the shard workers see
    it in their next `publish_progress`, stop launching requests and commit what finished; the
    aggregator seals the batch once no live lease holds a shard. None when the batch is not
    `in_progress` (already ending: a repeated or racing step)."""
    return transition(
        batch_id, BatchStatus.FINALIZING, at=at, changes=BatchChanges(final_status=BatchStatus.EXPIRED)
    )


def page(account_id: str, *, limit: int, after: str | None = None) -> tuple[list[BatchHeader], bool]:
    """An account's batches newest first: (`limit` headers after batch `after`, has_more).

    A batch `after` that the account does not own gives an empty page.
    """
    table, start = handle(), None
    if after:
        # The stored GSI1 sort key (it holds a write time) says where the page starts.
        anchor = table.get_item(Key=keys.batch(after), ConsistentRead=False).get("Item")
        if anchor is None or anchor.get("account_id") != account_id:
            return [], False
        start = keys.index_position(anchor)
    found, has_more = read_page(
        table.query,
        limit=limit,
        start=start,
        keep=lambda item: item["PK"].startswith(keys.BATCH_PREFIX),
        IndexName="GSI1",
        KeyConditionExpression="GSI1PK = :pk",
        ScanIndexForward=False,
        Limit=limit + 1,
        ExpressionAttributeValues={":pk": keys.account_batches(account_id)},
    )
    return [BatchHeader.model_validate(item) for item in found], has_more


def scan_open() -> Iterator[BatchHeader]:
    """Every non-terminal batch header (for the sweeper), in no particular order."""
    placeholders = {f":o{i}": status.value for i, status in enumerate(OPEN_STATUSES)}
    for item in items(
        handle().scan,
        FilterExpression=f"SK = :meta AND begins_with(PK, :batch) AND #status IN ({', '.join(placeholders)})",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":meta": keys.META, ":batch": keys.BATCH_PREFIX, **placeholders},
    ):
        yield BatchHeader.model_validate(item)
