"""`GET /v1/files/{id}/content` (api/files.py) on the API function in-process, in moto's copy of the
template's bucket: the function holds at most `INLINE_CONTENT_BYTES` of a file, judged by the object's
own size, so an object larger than its record says is redirected to S3, never read whole."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from batchinfer.api.files import INLINE_CONTENT_BYTES
from batchinfer.core import aws
from batchinfer.data import accounts, files
from batchinfer.data.items import FileRecord
from support.moto_env import Aws, load_event

KEY = "sk-bi-sample-key-for-sam-local-invoke"  # the key of the sample API events


def content_event(file_id: str) -> dict[str, Any]:
    event = load_event("api-retrieve-batch.json")
    path = f"/v1/files/{file_id}/content"
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["pathParameters"] = {"proxy": path.removeprefix("/v1/")}
    return event


@pytest.mark.parametrize(
    ("recorded", "stored", "status"),
    [
        (10, 10, 200),  # small, as recorded: inline
        (10, INLINE_CONTENT_BYTES, 200),  # grown, but still within the inline limit
        (10, INLINE_CONTENT_BYTES + 1, 302),  # grown past it since recorded: redirected, not read
        (INLINE_CONTENT_BYTES + 1, INLINE_CONTENT_BYTES + 1, 302),  # large as recorded
    ],
)
def test_content_is_inline_only_for_objects_within_the_limit(
    moto_aws: Aws, recorded: int, stored: int, status: int
) -> None:
    accounts.create_key("default", secret=KEY)
    data = b"x" * stored
    aws.client("s3").put_object(Bucket=moto_aws.bucket, Key="files/file-big", Body=data)
    files.put(
        FileRecord(
            id="file-big",
            bytes=recorded,
            created_at=1_800_000_000,
            filename="big.jsonl",
            purpose="batch",
            account_id="default",
            bucket=moto_aws.bucket,
            key="files/file-big",
        )
    )

    response = moto_aws.invoke("ApiFunction", content_event("file-big"))

    assert response["statusCode"] == status
    if status == 200:
        body = response["body"]
        assert (base64.b64decode(body) if response["isBase64Encoded"] else body.encode()) == data
    else:
        assert response["body"] == ""
        assert response["headers"]["Location"].startswith(
            f"https://{moto_aws.bucket}.s3.amazonaws.com/files/file-big?"
        )
