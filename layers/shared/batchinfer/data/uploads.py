"""Upload records (`items.UploadRecord`, keys in `keys`): large files sent straight to S3 (`api.uploads`)."""

from __future__ import annotations

from typing import Literal

from batchinfer.data import keys
from batchinfer.data.items import UploadRecord
from batchinfer.data.table import assignments, conditional, handle
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
