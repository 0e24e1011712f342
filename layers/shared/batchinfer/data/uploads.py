"""Upload records (`items.UploadRecord`, keys in `keys`) and their parts (`items.UploadPart`, in the
upload's partition): large files sent to S3 in parts or in one presigned PUT (`api.uploads`)."""

from __future__ import annotations

from typing import Literal

from boto3.dynamodb.conditions import Key

from batchinfer.data import keys
from batchinfer.data.items import UploadPart, UploadRecord
from batchinfer.data.table import assignments, conditional, handle, items, now, transact
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


def add_part(part: UploadPart) -> bool:
    """Store a part of a `pending`, unexpired upload, in one transaction with that check; False (nothing
    stored) when the upload is not pending or has expired (it may have been completed meanwhile)."""
    return not transact(
        [
            {
                "ConditionCheck": {
                    "Key": keys.upload(part.upload_id),
                    "ConditionExpression": "#status = :pending AND expires_at > :now",
                    "ExpressionAttributeNames": {"#status": "status"},
                    "ExpressionAttributeValues": {":pending": "pending", ":now": now()},
                }
            },
            {"Put": {"Item": {**keys.upload_part(part.upload_id, part.id), **part.stored()}}},
        ]
    )


def parts(upload_id: str) -> dict[str, UploadPart]:
    """Every part of an upload by id (consistent read)."""
    found = items(
        handle().query,
        KeyConditionExpression=Key("PK").eq(keys.upload(upload_id)["PK"])
        & Key("SK").begins_with(keys.PART_PREFIX),
        ConsistentRead=True,
    )
    return {part.id: part for part in map(UploadPart.model_validate, found)}
