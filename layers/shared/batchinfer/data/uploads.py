"""Upload records (`items.UploadRecord`, keys in `keys`) and their parts (`items.UploadPart`, in the
upload's partition): large files sent to S3 in parts or in one presigned PUT (`api.uploads`).

A pending upload reserves its bytes and its file in the account's storage counter (`data.storage`):
`create`, `complete` (the reservation becomes the file's), `cancel` and `release_expired` change the
counter in the transaction that changes the upload, so each does it once."""

from __future__ import annotations

from typing import Any, Literal

from boto3.dynamodb.conditions import Key

from batchinfer.data import files, keys, storage
from batchinfer.data.items import FileRecord, UploadPart, UploadRecord
from batchinfer.data.table import assignments, conditional, handle, items, now, retry_conflicts, transact
from batchinfer.wire.openai import FileObject


def put(upload: UploadRecord) -> None:
    """Store a new upload record."""
    handle().put_item(Item={**keys.upload(upload.id), **upload.stored()})


def get(upload_id: str) -> UploadRecord | None:
    """An upload record (consistent read), or None."""
    item = handle().get_item(Key=keys.upload(upload_id), ConsistentRead=True).get("Item")
    return UploadRecord.model_validate(item) if item else None


def finish(
    upload_id: str, status: Literal["completed", "cancelled"], *, file: FileObject | None = None
) -> UploadRecord | None:
    """Move a `pending` upload to `status`, with the `file` it became; the new record, or None when it
    was not pending (or does not exist)."""
    expression, names, values = assignments({"file": file.model_dump(mode="json")} if file else {})
    result = conditional(
        handle().update_item,
        Key=keys.upload(upload_id),
        UpdateExpression="SET #status = :status" + (f", {expression}" if expression else ""),
        ConditionExpression="#status = :pending",
        ExpressionAttributeNames={"#status": "status", **names},
        ExpressionAttributeValues={":status": status, ":pending": "pending", **values},
        ReturnValues="ALL_NEW",
    )
    return None if result is None else UploadRecord.model_validate(result["Attributes"])


@retry_conflicts
def create(upload: UploadRecord, limits: storage.StorageLimits) -> None:
    """Store a new pending upload, its expiry marker and its reservation (its bytes and its file) in the
    account's storage counter, in one transaction. Raises `storage.QuotaExceeded` over a quota."""
    storage.check_size(upload.bytes, limits)
    failed = transact(
        [
            {"Put": {"Item": {**keys.upload(upload.id), **upload.stored(), "reserved": True}}},
            storage.count(upload.account_id, upload.bytes, limits, upload=True),
            {"Put": {"Item": {**keys.upload_expiry(upload.expires_at, upload.id), "upload_id": upload.id}}},
        ]
    )
    if failed:
        raise storage.refusal(upload.account_id, upload.bytes, limits, upload=True)


@retry_conflicts
def add_part(part: UploadPart, *, max_parts: int | None = None) -> bool:
    """Store a part of a `pending`, unexpired upload and count it on the upload (`parts`, `part_bytes`),
    in one transaction with those checks; False (nothing stored) when the upload is not pending or has
    expired (it may have been completed meanwhile). Raises `storage.QuotaExceeded` when the upload has
    `max_parts` parts (None: no bound), or when this part would take them past `PART_BYTES_FACTOR` times
    its announced bytes."""
    upload = get(part.upload_id)
    if upload is None:
        return False
    room = storage.PART_BYTES_FACTOR * upload.bytes
    condition = (
        "#status = :pending AND expires_at > :now"
        " AND (attribute_not_exists(part_bytes) OR part_bytes <= :room)"
    )
    values = {
        ":pending": "pending",
        ":now": now(),
        ":room": room - part.bytes,
        ":one": 1,
        ":size": part.bytes,
    }
    if max_parts is not None:
        condition += " AND (attribute_not_exists(parts) OR parts < :max_parts)"
        values[":max_parts"] = max_parts
    update = {
        "Key": keys.upload(part.upload_id),
        "UpdateExpression": "ADD parts :one, part_bytes :size",
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {"#status": "status"},
        "ExpressionAttributeValues": values,
    }
    if not transact(
        [
            {"Update": update},
            {"Put": {"Item": {**keys.upload_part(part.upload_id, part.id), **part.stored()}}},
        ]
    ):
        return True
    now_upload = get(part.upload_id)
    if now_upload is None or now_upload.status != "pending" or now_upload.expires_at <= now():
        return False
    if max_parts is not None and (now_upload.parts or 0) >= max_parts:
        raise storage.QuotaExceeded("parts", max_parts)
    raise storage.QuotaExceeded("part_bytes", room, size=part.bytes, too_large=True)


def _leave_pending(upload: UploadRecord, status: str, changes: dict[str, Any]) -> dict[str, Any]:
    """The transaction action moving `upload` out of `pending` to `status` with `changes`."""
    expression, names, values = assignments(changes)
    return {
        "Update": {
            "Key": keys.upload(upload.id),
            "UpdateExpression": "SET #status = :status" + (f", {expression}" if expression else ""),
            "ConditionExpression": "#status = :pending",
            "ExpressionAttributeNames": {"#status": "status", **names},
            "ExpressionAttributeValues": {":status": status, ":pending": "pending", **values},
        }
    }


@retry_conflicts
def complete(upload: UploadRecord, record: FileRecord, file: FileObject) -> bool:
    """Complete a pending upload into `record` (stored counted: the upload's reservation becomes the
    file's), in one transaction; False (nothing written) when it was not pending any more."""
    counted = record.model_copy(update={"counted": upload.reserved})
    return not transact(
        [
            _leave_pending(upload, "completed", {"file": file.model_dump(mode="json")}),
            {"Put": {"Item": files.item(counted)}},
            *_released(upload, keep_file=True),
        ]
    )


@retry_conflicts
def cancel(upload: UploadRecord, status: str = "cancelled") -> bool:
    """Move a pending upload to `status` (`cancelled`, or `expired` by the sweeper) and give its
    reservation back, in one transaction; False (nothing written) when it was not pending."""
    return not transact([_leave_pending(upload, status, {}), *_released(upload, keep_file=False)])


def _released(upload: UploadRecord, *, keep_file: bool) -> list[dict[str, Any]]:
    """The transaction actions ending an upload's reservation: the file's part of it kept (complete) or
    not, and its expiry marker. None for an upload stored before reservations were (`reserved` unset)."""
    if not upload.reserved:
        return []
    kept = {"uploads": 1} if keep_file else {"size": upload.bytes, "files": 1, "uploads": 1}
    return [
        storage.uncount(upload.account_id, **kept),
        {"Delete": {"Key": keys.upload_expiry(upload.expires_at, upload.id)}},
    ]


def release_expired(at: int | None = None, limit: int = 100) -> int:
    """Give back the reservations of the pending uploads expired at `at` (Unix seconds, default now):
    each becomes `expired`. Returns how many markers were done (at most `limit` a call). A marker whose
    upload completed or was cancelled meanwhile is only dropped."""
    at = now() if at is None else at
    response = handle().query(
        KeyConditionExpression="PK = :pk AND SK < :end",
        ExpressionAttributeValues={":pk": keys.UPLOAD_EXPIRIES, ":end": f"{at + 1:010d}#"},
        Limit=limit,
    )
    for marker in response["Items"]:
        upload = get(marker["upload_id"])
        if upload is None or not cancel(upload, "expired"):
            handle().delete_item(Key={"PK": marker["PK"], "SK": marker["SK"]})
    return len(response["Items"])


def parts(upload_id: str) -> dict[str, UploadPart]:
    """Every part of an upload by id (consistent read)."""
    found = items(
        handle().query,
        KeyConditionExpression=Key("PK").eq(keys.upload(upload_id)["PK"])
        & Key("SK").begins_with(keys.PART_PREFIX),
        ConsistentRead=True,
    )
    return {part.id: part for part in map(UploadPart.model_validate, found)}
