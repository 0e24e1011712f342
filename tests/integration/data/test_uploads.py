"""Upload records (data/uploads.py) in moto's copy of the template's table: what is stored and the
one conditional move out of `pending`."""

from __future__ import annotations

from decimal import Decimal

from batchinfer.core import aws
from batchinfer.data import keys, uploads
from batchinfer.data.items import UploadRecord
from batchinfer.wire.openai import FileObject
from support.moto_env import Aws

T0 = 1_800_000_000


def pending(upload_id: str = "upload_1") -> UploadRecord:
    return UploadRecord(
        id=upload_id,
        bytes=300_000_000,
        created_at=T0,
        expires_at=T0 + 3600,
        filename="big.jsonl",
        purpose="batch",
        mime_type="application/jsonl",
        account_id="acct",
        file_id="file-1",
        bucket="data",
        key="files/file-1",
    )


def test_put_and_get(moto_aws: Aws) -> None:
    uploads.put(pending())
    item = aws.table().get_item(Key=keys.upload("upload_1"))["Item"]
    assert item == {
        "PK": "UPLOAD#upload_1",
        "SK": "META",
        "id": "upload_1",
        "object": "upload",
        "bytes": 300_000_000,
        "created_at": T0,
        "expires_at": T0 + 3600,
        "filename": "big.jsonl",
        "purpose": "batch",
        "status": "pending",
        "mime_type": "application/jsonl",
        "account_id": "acct",
        "file_id": "file-1",
        "bucket": "data",
        "key": "files/file-1",
    }
    assert isinstance(item["bytes"], Decimal)
    got = uploads.get("upload_1")
    assert got == pending() and type(got.bytes) is int
    assert uploads.get("upload_missing") is None


def test_finish_moves_a_pending_upload_once(moto_aws: Aws) -> None:
    uploads.put(pending())
    file = FileObject(
        id="file-1", bytes=300_000_000, created_at=T0 + 60, filename="big.jsonl", purpose="batch"
    )
    done = uploads.finish("upload_1", "completed", file=file)
    assert done == pending().model_copy(update={"status": "completed", "file": file})
    assert aws.table().get_item(Key=keys.upload("upload_1"))["Item"]["file"] == {
        "id": "file-1",
        "object": "file",
        "bytes": 300_000_000,
        "created_at": T0 + 60,
        "filename": "big.jsonl",
        "purpose": "batch",
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
    assert uploads.finish("upload_1", "completed", file=file) is None
    assert uploads.finish("upload_1", "cancelled") is None
    assert uploads.get("upload_1") == done


def test_cancel_a_pending_upload(moto_aws: Aws) -> None:
    uploads.put(pending("upload_2"))
    assert uploads.finish("upload_2", "cancelled") == pending("upload_2").model_copy(
        update={"status": "cancelled"}
    )
    assert uploads.finish("upload_missing", "cancelled") is None
    assert "Item" not in aws.table().get_item(Key=keys.upload("upload_missing"))
