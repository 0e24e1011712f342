"""Batch headers (`items.BatchHeader`, keys in `keys`): create, read, list, and every status change.

Every status change is an `update_item` whose condition lists the allowed source statuses
(`wire.status.allowed_sources`); a failed condition is reported as `None`/`False`, never raised.

Batches created through `create_limited` are counted in their account's active-batch counter
(`active_counted` on the header); the one write that makes such a batch terminal decrements it in the
same transaction, so the counter is exact under concurrent creates and transitions.

Open batches are in the sparse index `OpenBatches` (`keys.open_batch`): a header is written with its
index attributes unless it is terminal already, and the one write that makes it terminal REMOVEs
them, so the index holds exactly the open batches and the sweeper reads those only
(`open_headers`). Headers written before the index existed are put into it once by
`backfill_open_index`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from batchinfer.data import accounts, keys
from batchinfer.data.accounts import ACTIVE_RETRY_AFTER_S, LimitExceeded
from batchinfer.data.items import BatchChanges, BatchHeader, LiveProgress, OpenBackfill
from batchinfer.data.table import (
    assignments,
    conditional,
    handle,
    items,
    now,
    pages,
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
        **({} if is_terminal(header.status) else keys.open_batch(header.id)),
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
    prepare_owner: str | None = None,
    at: int | None = None,
) -> BatchHeader | None:
    """Move a batch to `target` if its status is an allowed source (and, with `all_shards_done`,
    `shards_done = shards_total`; with `prepare_owner`, if that prepare holds the prepare lease),
    writing `changes` too.

    Stamps the status's timestamp field (`in_progress_at`, ...) with `at` (default now). Returns the
    new header, or None when the condition failed (a concurrent or repeated step: a no-op, not an
    error). A terminal `target` of a counted batch also decrements its account's active-batch
    counter, in the same transaction (only one write can make a batch terminal, so it is decremented
    exactly once). A terminal `target` also leaves `OpenBatches` (its attributes REMOVEd in the same
    update).
    """
    sets = {**(changes.assigned() if changes else {}), TIMESTAMP_FIELD[target]: now() if at is None else at}
    expression, names, values = assignments(sets)
    sources = sorted(allowed_sources(target))
    names["#status"] = "status"
    values |= {":target": target.value, **{f":s{i}": source.value for i, source in enumerate(sources)}}
    condition = f"#status IN ({', '.join(f':s{i}' for i in range(len(sources)))})"
    if all_shards_done:
        condition = f"({condition}) AND (shards_done = shards_total)"
    if prepare_owner is not None:
        condition = f"({condition}) AND prepare_owner = :prepare_owner"
        values[":prepare_owner"] = prepare_owner
    removed = f" REMOVE {', '.join(keys.OPEN_ATTRIBUTES)}" if is_terminal(target) else ""
    update = {
        "Key": keys.batch(batch_id),
        "UpdateExpression": f"SET #status = :target, {expression}{removed}",
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


# A batch prepare may still act on (it starts a validating one, re-sends a running one's shard messages).
_PREPARABLE = "#status IN (:validating, :in_progress)"
_PREPARABLE_VALUES = {
    ":validating": BatchStatus.VALIDATING.value,
    ":in_progress": BatchStatus.IN_PROGRESS.value,
}
# No live prepare lease (a lease is live until the second `prepare_lease_until` has passed).
_PREPARE_FREE = "(attribute_not_exists(prepare_lease_until) OR prepare_lease_until < :now)"


def _prepare_write(batch_id: str, update: str, condition: str, values: dict[str, Any], **params: Any) -> Any:
    """One conditional UpdateItem of the header's prepare attributes (with `_PREPARABLE`'s names and
    values when `condition` has it): its response, or None when `condition` failed."""
    if _PREPARABLE in condition:
        params["ExpressionAttributeNames"] = {"#status": "status"}
        values = {**_PREPARABLE_VALUES, **values}
    return conditional(
        handle().update_item,
        Key=keys.batch(batch_id),
        UpdateExpression=update,
        ConditionExpression=condition,
        ExpressionAttributeValues=values,
        **params,
    )


def claim_prepare(batch_id: str, *, owner: str, lease_seconds: int) -> BatchHeader | None:
    """Lease a `validating` or `in_progress` batch to the prepare `owner` for `lease_seconds` (so one
    prepare at a time streams its input or sends its shard messages); the prepare message
    waiting for it has arrived (`prepare_queued_at` removed). One UpdateItem.

    Returns the header as it was before the claim (its `prepare_lease_until` says whether the last
    prepare finished: `items.BatchHeader`), or None when the batch is in another status or a live
    lease of another prepare holds it (nothing written).
    """
    at = now()
    result = _prepare_write(
        batch_id,
        "SET prepare_owner = :owner, prepare_lease_until = :until REMOVE prepare_queued_at",
        f"{_PREPARABLE} AND {_PREPARE_FREE}",
        {":owner": owner, ":until": at + lease_seconds, ":now": at},
        ReturnValues="ALL_OLD",
    )
    return None if result is None else BatchHeader.model_validate(result["Attributes"])


def renew_prepare(batch_id: str, *, owner: str, lease_seconds: int) -> bool:
    """Extend `owner`'s prepare lease to `lease_seconds` from now (one heartbeat: a conditional
    UpdateItem, 1 WRU). False when `owner` no longer holds it (another prepare claimed it, `owner`
    released it, or the batch left `validating`/`in_progress`, e.g. cancelled). Other errors are raised."""
    return (
        _prepare_write(
            batch_id,
            "SET prepare_lease_until = :until",
            f"{_PREPARABLE} AND prepare_owner = :owner AND attribute_exists(prepare_lease_until)",
            {":owner": owner, ":until": now() + lease_seconds},
        )
        is not None
    )


def release_prepare(batch_id: str, *, owner: str, finished: bool) -> bool:
    """Give up `owner`'s prepare lease: `finished` (its shard messages are all sent, or it ended the
    batch) REMOVEs `prepare_lease_until`; otherwise (it failed) the lease lapses at once but stays
    present, so the next prepare can claim it now and knows the shard messages may be unsent. False
    when `owner` does not hold it (nothing changed)."""
    update = "REMOVE prepare_lease_until" if finished else "SET prepare_lease_until = :lapsed"
    values: dict[str, Any] = {":owner": owner} | ({} if finished else {":lapsed": 0})
    return _prepare_write(batch_id, update, "prepare_owner = :owner", values) is not None


def queue_prepare(batch_id: str, *, at: int) -> bool:
    """Record that a prepare message is sent at `at` (Unix seconds: `prepare_queued_at`, see
    `BatchHeader.prepare_waiting`), before sending it. False, writing nothing, when the batch is not
    `validating`/`in_progress` or a live prepare lease holds it (a prepare works on it: none is sent)."""
    return (
        _prepare_write(
            batch_id,
            "SET prepare_queued_at = :at",
            f"{_PREPARABLE} AND {_PREPARE_FREE}",
            {":at": at, ":now": at},
        )
        is not None
    )


def unqueue_prepare(batch_id: str, *, at: int | None = None) -> bool:
    """Record that no prepare message waits any more: REMOVE `prepare_queued_at` if it is `at` (a send
    that failed after `queue_prepare(at=at)`), or with `at` None if a live prepare lease holds the
    batch (a `busy` prepare received its message). False when that condition failed (nothing changed)."""
    if at is not None:
        condition, values = "prepare_queued_at = :at", {":at": at}
    else:
        condition, values = f"{_PREPARABLE} AND prepare_lease_until >= :now", {":now": now()}
    return _prepare_write(batch_id, "REMOVE prepare_queued_at", condition, values) is not None


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


def page(
    account_id: str,
    *,
    limit: int,
    after: str | None = None,
    before: str | None = None,
    endpoint: str | None = None,
) -> tuple[list[BatchHeader], bool]:
    """An account's batches newest first: (`limit` headers, has_more).

    The page is the one right after batch `after` (older ones: has_more says whether still older ones
    follow) or, given `before`, right before batch `before` (newer ones: has_more says whether still
    newer ones precede it), newest first either way. `endpoint`: only batches of that endpoint. A
    batch `after`/`before` that the account does not own gives an empty page.
    """
    table, start, anchor_id = handle(), None, before or after
    if anchor_id:
        # The stored GSI1 sort key (it holds a write time) says where the page starts.
        anchor = table.get_item(Key=keys.batch(anchor_id), ConsistentRead=False).get("Item")
        if anchor is None or anchor.get("account_id") != account_id:
            return [], False
        start = keys.index_position(anchor)
    found, has_more = read_page(
        table.query,
        limit=limit,
        start=start,
        keep=lambda item: (
            item["PK"].startswith(keys.BATCH_PREFIX)
            and (endpoint is None or item.get("endpoint") == endpoint)
        ),
        IndexName="GSI1",
        KeyConditionExpression="GSI1PK = :pk",
        ScanIndexForward=before is not None,
        Limit=limit + 1,
        ExpressionAttributeValues={":pk": keys.account_batches(account_id)},
    )
    ordered = found[::-1] if before is not None else found
    return [BatchHeader.model_validate(item) for item in ordered], has_more


def delete(batch_id: str) -> None:
    """Delete a batch's header and its shard items (one partition), for good. Its files are the
    caller's to delete."""
    table = handle()
    entries = items(
        table.query,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": keys.batch(batch_id)["PK"]},
        ProjectionExpression="PK, SK",
    )
    with table.batch_writer() as writer:
        for entry in entries:
            writer.delete_item(Key={"PK": entry["PK"], "SK": entry["SK"]})


def open_headers() -> Iterator[BatchHeader]:
    """Every open (non-terminal) batch header, for the sweeper: one query of `OpenBatches`, paged,
    then a consistent read of each header it names.

    The index projects only keys: a header changes at every shard commit and progress write, and
    with its attributes projected each of those would be written to the index too. The index is
    eventually consistent, so a batch that ended a moment ago may still be named: its header,
    read consistently, is terminal and skipped.
    """
    for entry in items(
        handle().query,
        IndexName=keys.OPEN_INDEX,
        KeyConditionExpression="OPENPK = :open",
        ExpressionAttributeValues={":open": keys.OPEN},
    ):
        header = get(keys.open_batch_id(entry))
        if header is not None and not is_terminal(header.status):
            yield header


BACKFILL_PAGES = 50  # scan pages (up to 1 MB each) per sweep: a few seconds of the sweeper's 300


def backfill_open_index(*, max_pages: int = BACKFILL_PAGES) -> int | None:
    """Put the open batch headers written before `OpenBatches` existed into it: one table scan over
    all sweeps, `max_pages` pages a call, resumed where the last call stopped (`items.OpenBackfill`),
    never again once it ended. Each header gets the index attributes only if it is still open and
    has none (a conditional update: a batch ending meanwhile stays out).

    Returns the number of headers put into the index, or None when the backfill had ended already
    (no scan).
    """
    table = handle()
    stored = table.get_item(Key=keys.open_backfill(), ConsistentRead=True).get("Item")
    state = OpenBackfill.model_validate(stored) if stored else OpenBackfill()
    if state.done:
        return None
    open_values = {f":o{i}": status.value for i, status in enumerate(OPEN_STATUSES)}
    still_open = f"#status IN ({', '.join(open_values)}) AND attribute_not_exists(OPENPK)"
    params: dict[str, Any] = {
        "FilterExpression": f"SK = :meta AND begins_with(PK, :batch) AND {still_open}",
        "ProjectionExpression": "#id",
        "ExpressionAttributeNames": {"#status": "status", "#id": "id"},
        "ExpressionAttributeValues": {":meta": keys.META, ":batch": keys.BATCH_PREFIX, **open_values},
    }
    if state.position:
        params["ExclusiveStartKey"] = state.position
    added = 0
    for n, (found, position) in enumerate(pages(table.scan, **params), start=1):
        for item in found:
            expression, names, values = assignments(keys.open_batch(item["id"]))
            put = conditional(
                table.update_item,
                Key=keys.batch(item["id"]),
                UpdateExpression=f"SET {expression}",
                ConditionExpression=still_open,
                ExpressionAttributeNames={**names, "#status": "status"},
                ExpressionAttributeValues={**values, **open_values},
            )
            added += put is not None
        state = OpenBackfill(done=position is None, position=position)
        table.put_item(Item={**keys.open_backfill(), **state.stored()})
        if position is None or n >= max_pages:
            break
    return added
