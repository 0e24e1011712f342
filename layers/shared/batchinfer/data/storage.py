"""Storage quotas of an account: the bytes and number of its files and pending uploads, and the parts of
one upload.

The account's storage counter (`keys.storage_counter`) holds `bytes` (its counted files' bytes plus
the announced bytes of its pending uploads: a pending upload reserves what its file will hold),
`files` (counted files plus pending uploads: each becomes one file) and `uploads` (pending uploads).
Every change of it is an action of the transaction that stores, completes, cancels, expires or
deletes what it counts (`count`, `uncount`), so the counter equals what is stored under any
concurrency and any redelivery: a create that lost its answer and runs again, or two deletes of one
file, change it once. A file counts when its record says `counted` (files the account stored through
`/v1/files` and `/v1/uploads`); result files and files the service writes itself do not.

A part of an upload is counted on the upload's record (`parts`, `part_bytes`, `data.uploads`): at
most `max_parts` parts, holding at most `PART_BYTES_FACTOR` times the announced bytes (room to send
every part once more after a lost answer).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from batchinfer.core.settings import get_settings
from batchinfer.data import keys
from batchinfer.data.items import Account
from batchinfer.data.table import Table, handle

PART_BYTES_FACTOR = 2
# The account settings (`items.Account`) that override the deployment's storage quotas.
QUOTA_FIELDS = ("max_storage_bytes", "max_stored_files", "max_pending_uploads", "max_upload_parts")
QuotaKind = Literal["bytes", "files", "uploads", "parts", "part_bytes"]


class StorageLimits(BaseModel):
    """The storage quotas one account is held to (`storage_limits`)."""

    max_bytes: int = Field(description="bytes of its counted files and pending uploads together")
    max_files: int = Field(description="counted files and pending uploads together")
    max_uploads: int = Field(description="pending uploads")
    max_parts: int = Field(description="parts of one upload")


class StorageUsage(BaseModel):
    """An account's storage counter (`keys.storage_counter`)."""

    bytes: int = 0
    files: int = 0
    uploads: int = 0


class QuotaExceeded(Exception):
    """A store refused by a storage quota: `kind` names the quota, `limit` its value, `size` the bytes
    asked for. `too_large`: the object alone is over the quota (it can never fit; HTTP 413), else the
    running total is (deleting files frees room; HTTP 429). `code` and `message` are the OpenAI
    error's."""

    def __init__(self, kind: QuotaKind, limit: int, *, size: int = 0, too_large: bool = False) -> None:
        super().__init__(f"{kind} quota {limit} reached")
        self.kind, self.limit, self.size, self.too_large = kind, limit, size, too_large

    @property
    def code(self) -> str:
        if self.too_large:
            return "upload_parts_too_large" if self.kind == "part_bytes" else "file_over_storage_quota"
        return {
            "bytes": "storage_quota_exceeded",
            "files": "file_quota_exceeded",
            "uploads": "upload_quota_exceeded",
            "parts": "upload_part_quota_exceeded",
            "part_bytes": "upload_parts_too_large",
        }[self.kind]

    @property
    def message(self) -> str:
        if self.kind == "part_bytes":
            return (
                f"This part's {self.size} bytes would take the upload's parts past {self.limit} bytes "
                f"({PART_BYTES_FACTOR} times the bytes announced)."
            )
        if self.too_large:
            return (
                f"{self.size} bytes are more than this account's whole storage quota of {self.limit} bytes."
            )
        return {
            "bytes": f"{self.size} more bytes would take this account past its storage quota of "
            f"{self.limit} bytes (files and pending uploads); delete files to make room.",
            "files": f"This account stores its quota of {self.limit} files (pending uploads included); "
            "delete files to make room.",
            "uploads": f"This account has {self.limit} pending uploads, the most it may have; complete or "
            "cancel one first.",
            "parts": f"This upload has {self.limit} parts, the most one upload may have.",
        }[self.kind]


def storage_limits(account: Account) -> StorageLimits:
    """The account's storage quotas: its own settings where it has them, else the deployment's
    (`Settings.max_storage_bytes`, `max_stored_files`, `max_pending_uploads`, `max_upload_parts`)."""
    settings = get_settings()
    return StorageLimits(
        max_bytes=account.max_storage_bytes or settings.max_storage_bytes,
        max_files=account.max_stored_files or settings.max_stored_files,
        max_uploads=account.max_pending_uploads or settings.max_pending_uploads,
        max_parts=account.max_upload_parts or settings.max_upload_parts,
    )


def usage(account_id: str, *, table: Table | None = None) -> StorageUsage:
    """The account's storage counter (consistent read)."""
    item = handle(table).get_item(Key=keys.storage_counter(account_id), ConsistentRead=True).get("Item")
    return StorageUsage.model_validate(item or {})


def check_size(size: int, limits: StorageLimits) -> None:
    """Raise `QuotaExceeded` (`too_large`) when `size` bytes could not fit even in an empty account."""
    if size > limits.max_bytes:
        raise QuotaExceeded("bytes", limits.max_bytes, size=size, too_large=True)


def count(account_id: str, size: int, limits: StorageLimits, *, upload: bool = False) -> dict[str, Any]:
    """The transaction action counting a new file (or, `upload`, a pending upload) of `size` bytes,
    refused (a failed condition) when it would take the account past a quota."""
    condition = [
        "(attribute_not_exists(#bytes) OR #bytes <= :room)",
        "(attribute_not_exists(#files) OR #files < :max_files)",
    ]
    values: dict[str, Any] = {":size": size, ":one": 1, ":room": limits.max_bytes - size}
    values[":max_files"] = limits.max_files
    update = "ADD #bytes :size, #files :one"
    names = {"#bytes": "bytes", "#files": "files"}
    if upload:
        condition.append("(attribute_not_exists(#uploads) OR #uploads < :max_uploads)")
        values[":max_uploads"] = limits.max_uploads
        update += ", #uploads :one"
        names["#uploads"] = "uploads"
    return {
        "Update": {
            "Key": keys.storage_counter(account_id),
            "UpdateExpression": update,
            "ConditionExpression": " AND ".join(condition),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
    }


def uncount(account_id: str, *, size: int = 0, files: int = 0, uploads: int = 0) -> dict[str, Any]:
    """The transaction action taking `size` bytes, `files` files and `uploads` pending uploads off the
    account's counter (a file deleted; an upload completed, cancelled or expired)."""
    changes = {"bytes": size, "files": files, "uploads": uploads}
    names = {f"#{name}": name for name, value in changes.items() if value}
    return {
        "Update": {
            "Key": keys.storage_counter(account_id),
            "UpdateExpression": "ADD " + ", ".join(f"#{name} :{name}" for name in changes if changes[name]),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": {f":{name}": -value for name, value in changes.items() if value},
        }
    }


def refusal(account_id: str, size: int, limits: StorageLimits, *, upload: bool = False) -> QuotaExceeded:
    """The `QuotaExceeded` naming which quota refused a `count` of `size` bytes (read after the fact;
    the bytes quota when the counter moved meanwhile)."""
    used = usage(account_id)
    if upload and used.uploads >= limits.max_uploads:
        return QuotaExceeded("uploads", limits.max_uploads, size=size)
    if used.files >= limits.max_files:
        return QuotaExceeded("files", limits.max_files, size=size)
    return QuotaExceeded("bytes", limits.max_bytes, size=size)
