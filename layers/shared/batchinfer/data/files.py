"""File records (`items.FileRecord`, keys in `keys`): batch inputs and results, listed per account.

Files an account stores itself are `counted` in its storage counter (`data.storage`): `create` and
`remove` change the counter in the transaction that stores or deletes the record."""

from __future__ import annotations

from typing import Any

from batchinfer.data import keys, storage
from batchinfer.data.items import FileRecord
from batchinfer.data.table import handle, read_page, retry_conflicts, transact


def item(record: FileRecord) -> dict[str, Any]:
    """The stored item of a file record: its keys, its GSI1 position, its attributes."""
    return {
        **keys.indexed(
            keys.file(record.id),
            keys.account_files(record.account_id),
            keys.creation_order(record.created_at, record.id),
        ),
        **record.stored(),
    }


def put(record: FileRecord) -> None:
    """Store (or overwrite: the aggregator writes a result file's record again when it runs again) a
    file record that is not counted."""
    handle().put_item(Item=item(record))


@retry_conflicts
def create(record: FileRecord, limits: storage.StorageLimits) -> bool:
    """Store a new file record, `counted`, and count it in its account's storage, in one transaction.
    False (nothing written) when a record of that id exists already (a retried create). Raises
    `storage.QuotaExceeded` when it would take the account past a quota."""
    storage.check_size(record.bytes, limits)
    counted = record.model_copy(update={"counted": True})
    failed = transact(
        [
            {"Put": {"Item": item(counted), "ConditionExpression": "attribute_not_exists(PK)"}},
            storage.count(record.account_id, record.bytes, limits),
        ]
    )
    if 0 in failed:
        return False
    if failed:
        raise storage.refusal(record.account_id, record.bytes, limits)
    return True


@retry_conflicts
def remove(record: FileRecord) -> bool:
    """Delete a file record, giving its bytes back to its account's storage when it was counted (once:
    the delete and the count are one transaction on the record's existence). False when it was gone."""
    if not record.counted:
        handle().delete_item(Key=keys.file(record.id))
        return True
    return not transact(
        [
            {"Delete": {"Key": keys.file(record.id), "ConditionExpression": "attribute_exists(PK)"}},
            storage.uncount(record.account_id, size=record.bytes, files=1),
        ]
    )


def get(file_id: str, *, consistent: bool = False) -> FileRecord | None:
    """A file record (eventually consistent read unless `consistent`), or None."""
    item = handle().get_item(Key=keys.file(file_id), ConsistentRead=consistent).get("Item")
    return FileRecord.model_validate(item) if item else None


def delete(file_id: str) -> None:
    """Delete a file record (not its object); deleting a missing one is not an error."""
    handle().delete_item(Key=keys.file(file_id))


def schedule_expiry(record: FileRecord) -> None:
    """Mark `record` (with its `expires_at`) for the sweeper's `due_expiries`; idempotent."""
    assert record.expires_at is not None
    handle().put_item(Item={**keys.file_expiry(record.expires_at, record.id), "file_id": record.id})


def due_expiries(at: int, limit: int = 100) -> list[tuple[int, str]]:
    """Up to `limit` (expires_at, file id) of the files due at `at` (Unix seconds), earliest first."""
    response = handle().query(
        KeyConditionExpression="PK = :pk AND SK < :end",
        ExpressionAttributeValues={":pk": keys.EXPIRIES, ":end": f"{at + 1:010d}#"},
        Limit=limit,
    )
    return [(int(item["SK"].split("#", 1)[0]), item["file_id"]) for item in response["Items"]]


def drop_expiry(expires_at: int, file_id: str) -> None:
    """Remove a file's expiry marker (done with it); removing a missing one is not an error."""
    handle().delete_item(Key=keys.file_expiry(expires_at, file_id))


def page(
    account_id: str,
    *,
    limit: int,
    after: str | None = None,
    purpose: str | None = None,
    newest_first: bool = True,
) -> tuple[list[FileRecord], bool]:
    """An account's files in creation order: (`limit` records after file `after`, has_more).

    `purpose` keeps only files of that purpose. A file `after` that the account does not own gives
    an empty page.
    """
    values = {":pk": keys.account_files(account_id)}
    query = {
        "IndexName": "GSI1",
        "KeyConditionExpression": "GSI1PK = :pk",
        "ScanIndexForward": not newest_first,
    }
    if purpose is not None:
        query["FilterExpression"] = "purpose = :purpose"
        values[":purpose"] = purpose
    table, start = handle(), None
    if after:
        # The stored GSI1 sort key (it holds a write time) says where the page starts.
        anchor = table.get_item(Key=keys.file(after)).get("Item")
        if anchor is None or anchor.get("account_id") != account_id:
            return [], False
        start = keys.index_position(anchor)
    found, has_more = read_page(
        table.query, limit=limit, start=start, ExpressionAttributeValues=values, **query
    )
    return [FileRecord.model_validate(item) for item in found], has_more
