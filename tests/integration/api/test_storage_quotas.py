"""Storage quotas per account (data/storage.py) on `/v1/files`, `/v1/uploads` and upload parts, through
the API function in-process in moto's copy of the template's resources: a running total over its
quota is a 429 `insufficient_quota` (`x-should-retry: false`), an object larger than the whole quota a
413, both in the OpenAI envelope; deleting a file, cancelling or expiring an upload gives its bytes
back, once, and concurrent creates and deletes count exactly."""

from __future__ import annotations

import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, files, s3, storage, uploads
from batchinfer.data.items import FileRecord, UploadRecord
from batchinfer.wire.openai import FileObject
from support.moto_env import Aws, load_event

KEY = "sk-bi-sample-key-for-sam-local-invoke"  # the sample events' key, of account "default"
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'
SIZE = len(LINE)  # 91


@pytest.fixture
def api(moto_aws: Aws) -> Aws:
    accounts.create_key("default", secret=KEY)
    return moto_aws


def call(
    aws: Aws, method: str, path: str, body: bytes = b"", content_type: str = ""
) -> tuple[int, dict, Any]:
    """One request of the sample key's account: (status, headers, parsed JSON body)."""
    event = load_event("api-retrieve-batch.json")
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["requestContext"]["http"]["method"] = method
    event["pathParameters"] = {"proxy": path.removeprefix("/v1/")}
    if content_type:
        event["headers"] = {**event["headers"], "content-type": content_type}
    if body:
        event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode(), True
    response = aws.invoke("ApiFunction", event)
    return response["statusCode"], response.get("headers") or {}, json.loads(response["body"] or "null")


def multipart(path: str, field: str, data: bytes, **form: str) -> tuple[bytes, str]:
    request = httpx.Request("POST", f"http://api{path}", data=form, files={field: ("in.jsonl", data)})
    return request.read(), request.headers["content-type"]


def upload_file(aws: Aws, data: bytes = LINE) -> tuple[int, dict, Any]:
    return call(aws, "POST", "/v1/files", *multipart("/v1/files", "file", data, purpose="batch"))


def create_upload(aws: Aws, size: int) -> tuple[int, dict, Any]:
    body = {"filename": "big.jsonl", "purpose": "batch", "bytes": size, "mime_type": "text/jsonl"}
    return call(aws, "POST", "/v1/uploads", json.dumps(body).encode(), "application/json")


def add_part(aws: Aws, upload_id: str, data: bytes) -> tuple[int, dict, Any]:
    path = f"/v1/uploads/{upload_id}/parts"
    return call(aws, "POST", path, *multipart(path, "data", data))


def used(account_id: str = "default") -> tuple[int, int, int]:
    counter = storage.usage(account_id)
    return counter.bytes, counter.files, counter.uploads


def quota_error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "insufficient_quota", "param": None, "code": code}}


def test_files_over_the_byte_and_count_quotas_are_refused_and_a_delete_gives_room(api: Aws) -> None:
    # Given an account allowed two files' bytes
    accounts.configure_account("default", storage={"max_storage_bytes": 2 * SIZE + 10})
    first, second = (upload_file(api)[2]["id"] for _ in range(2))
    assert used() == (2 * SIZE, 2, 0)
    # When a third file would take it past its bytes
    status, headers, body = upload_file(api)
    # Then it is a 429 that the SDK does not retry, and nothing of it is stored
    assert (status, headers["x-should-retry"]) == (429, "false")
    assert body == quota_error(
        "storage_quota_exceeded",
        f"{SIZE} more bytes would take this account past its storage quota of {2 * SIZE + 10} bytes "
        "(files and pending uploads); delete files to make room.",
    )
    bucket = get_settings().bucket_name
    assert sorted(s3.keys_under(bucket, "files/")) == sorted([f"files/{first}", f"files/{second}"])
    assert used() == (2 * SIZE, 2, 0)
    # A delete gives the bytes back once, however often it is asked
    assert call(api, "DELETE", f"/v1/files/{first}")[0] == 200
    assert call(api, "DELETE", f"/v1/files/{first}")[0] == 404
    assert used() == (SIZE, 1, 0)
    assert upload_file(api)[0] == 200
    # A file larger than the whole quota is a 413: it could never fit
    status, _, body = upload_file(api, LINE * 3)
    assert (status, body["error"]["code"], body["error"]["type"]) == (
        413,
        "file_over_storage_quota",
        "invalid_request_error",
    )
    assert (
        body["error"]["message"]
        == f"{3 * SIZE} bytes are more than this account's whole storage quota of {2 * SIZE + 10} bytes."
    )
    # And the number of files is a quota of its own
    accounts.configure_account("default", storage={"max_storage_bytes": 10**6, "max_stored_files": 2})
    status, _, body = upload_file(api)
    assert (status, body["error"]["code"]) == (429, "file_quota_exceeded")
    assert used() == (2 * SIZE, 2, 0)


def test_an_upload_reserves_its_bytes_until_it_completes_is_cancelled_or_expires(api: Aws) -> None:
    # Given an account of 100 bytes and two pending uploads
    accounts.configure_account("default", storage={"max_storage_bytes": 100, "max_pending_uploads": 2})
    big = create_upload(api, 60)[2]["id"]
    status, _, body = create_upload(api, 50)
    assert (status, body["error"]["code"]) == (429, "storage_quota_exceeded")
    small = create_upload(api, 40)[2]["id"]
    assert used() == (100, 2, 2)
    assert create_upload(api, 1)[2]["error"]["code"] == "upload_quota_exceeded"
    assert create_upload(api, 101)[0] == 413
    # When one is cancelled (twice), its reservation comes back once
    assert call(api, "POST", f"/v1/uploads/{small}/cancel")[0] == 200
    assert call(api, "POST", f"/v1/uploads/{small}/cancel")[0] == 200
    assert used() == (60, 1, 1)
    # A completed one keeps its bytes as its file's, until the file is deleted
    part = add_part(api, big, b"x" * 60)[2]["id"]
    status, _, done = call(
        api,
        "POST",
        f"/v1/uploads/{big}/complete",
        json.dumps({"part_ids": [part]}).encode(),
        "application/json",
    )
    assert (status, done["status"]) == (200, "completed")
    assert used() == (60, 1, 0)
    assert files.get(done["file"]["id"]).counted is True
    assert call(api, "DELETE", f"/v1/files/{done['file']['id']}")[0] == 200
    assert used() == (0, 0, 0)
    # And one left pending past its expiry is given back by the sweeper, once
    late = create_upload(api, 70)[2]["id"]
    expires_at = uploads.get(late).expires_at
    assert uploads.release_expired(at=expires_at - 1) == 0
    assert uploads.release_expired(at=expires_at) == 1
    assert uploads.release_expired(at=expires_at) == 0
    assert (uploads.get(late).status, used()) == ("expired", (0, 0, 0))
    assert call(api, "GET", f"/v1/uploads/{late}")[2]["status"] == "expired"


def test_an_uploads_parts_are_bounded_in_number_and_bytes(api: Aws) -> None:
    # Given an upload of 10 bytes whose account allows 3 parts an upload
    accounts.configure_account("default", storage={"max_upload_parts": 3})
    upload_id = create_upload(api, 10)[2]["id"]
    # Then its parts may hold twice its bytes (a resend of each), no more: a 413
    assert add_part(api, upload_id, b"x" * 15)[0] == 200
    status, _, body = add_part(api, upload_id, b"x" * 6)
    assert status == 413
    assert body["error"] == {
        "message": "This part's 6 bytes would take the upload's parts past 20 bytes (2 times the bytes "
        "announced).",
        "type": "invalid_request_error",
        "param": None,
        "code": "upload_parts_too_large",
    }
    # And at most 3 parts: a 429
    assert [add_part(api, upload_id, b"x")[0] for _ in range(3)] == [200, 200, 429]
    assert add_part(api, upload_id, b"x")[2] == quota_error(
        "upload_part_quota_exceeded", "This upload has 3 parts, the most one upload may have."
    )
    assert (uploads.get(upload_id).parts, uploads.get(upload_id).part_bytes) == (3, 17)
    assert len(uploads.parts(upload_id)) == 3


def record(n: int, account_id: str = "acct") -> FileRecord:
    return FileRecord(
        id=f"file-{n}",
        bytes=10,
        created_at=1_800_000_000,
        filename="in.jsonl",
        purpose="batch",
        account_id=account_id,
        bucket="data",
        key=f"files/file-{n}",
    )


def test_concurrent_creates_and_deletes_count_exactly(moto_aws: Aws) -> None:
    # Given 12 concurrent creates of an account allowed 5 files, two of them the same file
    limits = storage.StorageLimits(max_bytes=1000, max_files=5, max_uploads=1, max_parts=1)
    barrier = threading.Barrier(12)

    def create(n: int) -> str:
        barrier.wait()
        try:
            return "created" if files.create(record(min(n, 10)), limits) else "existed"
        except storage.QuotaExceeded as error:
            return error.kind

    with ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(create, range(12)))
    # Then exactly 5 were stored and counted
    assert outcomes.count("created") == 5 and set(outcomes) <= {"created", "existed", "files"}
    assert used("acct") == (50, 5, 0)
    # When 6 deletes of one stored file run at once
    stored = next(files.get(f"file-{n}") for n in range(11) if files.get(f"file-{n}"))
    with ThreadPoolExecutor(6) as pool:
        removed = list(pool.map(lambda _: files.remove(stored), range(6)))
    # Then one took it, and its bytes came back once
    assert removed.count(True) == 1
    assert used("acct") == (40, 4, 0)


def test_an_upload_stored_before_quotas_moves_no_counter(moto_aws: Aws) -> None:
    # Given two pending uploads stored before reservations were (no `reserved`, no expiry marker)
    for upload_id in ("upload_old1", "upload_old2"):
        uploads.put(
            UploadRecord(
                id=upload_id,
                bytes=10,
                created_at=1_800_000_000,
                expires_at=1_800_003_600,
                filename="in.jsonl",
                purpose="batch",
                mime_type="application/jsonl",
                account_id="acct",
                file_id=f"file-{upload_id}",
                bucket="data",
                key=f"uploads/{upload_id}/object",
            )
        )
    # When one is cancelled and the other completed
    assert uploads.cancel(uploads.get("upload_old1"))
    file = record(7)
    assert uploads.complete(
        uploads.get("upload_old2"),
        file,
        FileObject(**file.model_dump(exclude={"account_id", "bucket", "key", "where", "counted"})),
    )
    # Then the account's counter never moved, and the file is not counted (its delete gives nothing back)
    assert files.get("file-7").counted is None
    assert files.remove(files.get("file-7"))
    assert used("acct") == (0, 0, 0)
