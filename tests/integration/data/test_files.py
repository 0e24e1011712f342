"""File records (data/files.py) in moto's copy of the template's table: what is stored, and the
per-account listing in creation order with `after`, `purpose` and pages."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from batchinfer.core import aws
from batchinfer.data import files, keys
from batchinfer.data.items import FileRecord
from support.data import small_pages
from support.moto_env import Aws

T0 = 1_800_000_000


def record(
    file_id: str, created_at: int = T0, account: str = "acct", purpose: str = "batch", **fields: object
) -> FileRecord:
    return FileRecord(
        **{
            "id": file_id,
            "bytes": 1234,
            "created_at": created_at,
            "filename": f"{file_id}.jsonl",
            "purpose": purpose,
            "account_id": account,
            "bucket": "data",
            "key": f"files/{file_id}",
            **fields,
        }
    )


def test_put_get_delete(moto_aws: Aws) -> None:
    files.put(record("file-1"))
    item = aws.table().get_item(Key=keys.file("file-1"))["Item"]
    assert re.fullmatch(rf"{T0}#\d{{19}}#file-1", item.pop("GSI1SK"))
    assert item == {
        "PK": "FILE#file-1",
        "SK": "META",
        "GSI1PK": "FILES#acct",
        "id": "file-1",
        "object": "file",
        "bytes": 1234,
        "created_at": T0,
        "filename": "file-1.jsonl",
        "purpose": "batch",
        "status": "processed",
        "account_id": "acct",
        "bucket": "data",
        "key": "files/file-1",
    }
    assert isinstance(item["bytes"], Decimal)
    got = files.get("file-1")
    assert got == record("file-1") and type(got.bytes) is int and got.where is None
    files.put(record("file-1", where="", bytes=99))  # a result file's record written again
    assert files.get("file-1") == record("file-1", where="", bytes=99)
    files.delete("file-1")
    assert files.get("file-1") is None
    files.delete("file-1")  # already gone: fine


def test_page_in_either_order_with_after(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(5):
        files.put(record(f"file-{n}", created_at=T0 + n))
    files.put(record("file-theirs", account="other", created_at=T0 + 2))
    calls = small_pages(monkeypatch, "query", limit=2)
    newest = [f"file-{n}" for n in (4, 3, 2, 1, 0)]

    first, more = files.page("acct", limit=3)
    assert ([f.id for f in first], more) == (newest[:3], True)
    assert len(calls) == 2  # four items read (one past the limit), two per page
    rest, more = files.page("acct", limit=3, after=first[-1].id)
    assert ([f.id for f in rest], more) == (newest[3:], False)
    oldest, more = files.page("acct", limit=2, newest_first=False, after="file-0")
    assert ([f.id for f in oldest], more) == (["file-1", "file-2"], True)
    assert files.page("acct", limit=10) == ([record(i, created_at=T0 + int(i[-1])) for i in newest], False)


def test_page_by_purpose(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(6):
        files.put(record(f"file-{n}", created_at=T0 + n, purpose="batch" if n % 3 == 0 else "batch_output"))
    small_pages(monkeypatch, "query", limit=1)  # the filter drops items of a page, pages go on
    inputs, more = files.page("acct", limit=5, purpose="batch")
    assert ([f.id for f in inputs], more) == (["file-3", "file-0"], False)
    outputs, more = files.page("acct", limit=2, purpose="batch_output", newest_first=False)
    assert ([f.id for f in outputs], more) == (["file-1", "file-2"], True)


def test_page_after_a_file_the_account_does_not_own_is_empty(moto_aws: Aws) -> None:
    files.put(record("file-mine"))
    files.put(record("file-theirs", account="other"))
    assert files.page("acct", limit=10, after="file-theirs") == ([], False)
    assert files.page("acct", limit=10, after="file-missing") == ([], False)
    assert files.page("other", limit=10) == ([record("file-theirs", account="other")], False)
