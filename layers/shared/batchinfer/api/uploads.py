"""`/v1/uploads`: files too large for one API request, sent straight to S3 with a presigned PUT.

A request through API Gateway and Lambda carries at most 6 MB, while a batch input may be 200 MB.
The flow keeps the shape of OpenAI's Uploads API (https://platform.openai.com/docs/api-reference/uploads)
but replaces its parts with one presigned S3 PUT:

1. `POST /v1/uploads` `{"filename", "purpose": "batch", "bytes", "mime_type"}` -> an Upload
   (`status: pending`) with `upload_url`, valid for `UPLOAD_EXPIRES_SECONDS` (default 1 hour);
2. `PUT <upload_url>` with the file's bytes (and the `upload_headers`);
3. `POST /v1/uploads/{id}/complete` -> the Upload (`status: completed`) whose `file` is the new File
   object, usable as a batch's `input_file_id`. Completing checks that exactly `bytes` bytes arrived.

`POST /v1/uploads/{id}/cancel` drops a pending upload.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from batchinfer.api import links
from batchinfer.api.auth import current_account
from batchinfer.api.errors import ApiError, Conflict, NotFound, documented
from batchinfer.api.files import file_object, new_file_record
from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import files, s3, uploads
from batchinfer.data.items import UploadRecord
from batchinfer.data.table import now
from batchinfer.wire.openai import MAX_ID_LENGTH, CompleteUploadRequest, CreateUploadRequest, Upload

router = Router()
UploadId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH)]


def upload_view(item: UploadRecord) -> Upload:
    """The public Upload object; a pending upload gets a fresh presigned PUT URL."""
    upload = Upload.model_validate(item.model_dump(include=set(Upload.model_fields), exclude_none=True))
    if upload.status == "pending" and item.expires_at <= now():
        return upload.model_copy(update={"status": "expired"})
    if upload.status == "pending":
        url = s3.presigned_put(
            item.bucket, item.key, content_type=item.mime_type, expires_in=max(1, item.expires_at - now())
        )
        return upload.model_copy(
            update={"upload_url": url, "upload_headers": {"Content-Type": item.mime_type}}
        )
    return upload


def owned_upload(upload_id: str) -> UploadRecord:
    """The upload record if the caller's account owns it; else `NotFound`."""
    item = uploads.get(upload_id)
    if item is None or item.account_id != current_account():
        raise NotFound(f"No such Upload object: {upload_id}", code="upload_not_found", param="upload_id")
    return item


@router.post("/v1/uploads", responses=documented(None, links=links.UPLOAD))
def create_upload(request: CreateUploadRequest) -> Upload:
    """Announce a large file; PUT its bytes to the returned upload_url, then complete."""
    settings = get_settings()
    if request.bytes > settings.max_file_bytes:
        raise ApiError(
            f"bytes: {request.bytes} is over the {settings.max_file_bytes}-byte limit of a batch file",
            code="file_too_large",
            param="bytes",
        )
    at, file_id = now(), ids.new_file_id()
    item = UploadRecord(
        id=f"upload_{file_id.removeprefix('file-')}",
        bytes=request.bytes,
        created_at=at,
        expires_at=at + settings.upload_expires_seconds,
        filename=request.filename,
        purpose=request.purpose,
        status="pending",
        mime_type=request.mime_type,
        account_id=current_account(),
        file_id=file_id,
        bucket=settings.bucket_name,
        key=f"files/{file_id}",
    )
    uploads.put(item)
    return upload_view(item)


@router.post(
    "/v1/uploads/<upload_id>/complete", responses=documented(None, 404, 409, links=links.COMPLETED_UPLOAD)
)
def complete_upload(
    upload_id: UploadId, request: Annotated[CompleteUploadRequest | None, Body()] = None
) -> Upload:
    """Turn the uploaded bytes into a File (checks that exactly `bytes` bytes arrived)."""
    item = owned_upload(upload_id)
    if item.status == "completed":
        return upload_view(item)
    if item.status != "pending" or item.expires_at <= now():
        raise Conflict(
            f"Upload {upload_id} is {upload_view(item).status} and can't be completed.",
            code="upload_not_pending",
        )
    size = s3.size(item.bucket, item.key)
    if size is None:
        raise ApiError(
            "Nothing was uploaded: PUT the file's bytes to upload_url first.", code="upload_incomplete"
        )
    if size != item.bytes:
        raise ApiError(
            f"The upload has {size} bytes, but {item.bytes} were announced.",
            code="upload_size_mismatch",
            param="bytes",
        )
    record = new_file_record(
        file_id=item.file_id,
        size=size,
        filename=item.filename,
        purpose=item.purpose,
        account_id=item.account_id,
    )
    files.put(record)
    done = uploads.finish(upload_id, "completed", file=file_object(record))
    return upload_view(done or owned_upload(upload_id))


@router.post("/v1/uploads/<upload_id>/cancel", responses=documented(None, 404, 409))
def cancel_upload(upload_id: UploadId) -> Upload:
    """Drop a pending upload."""
    item = owned_upload(upload_id)
    if item.status == "cancelled":
        return upload_view(item)
    done = uploads.finish(upload_id, "cancelled")
    if done is None:
        raise Conflict(
            f"Upload {upload_id} is {item.status} and can't be cancelled.", code="upload_not_pending"
        )
    s3.delete(item.bucket, item.key)
    return upload_view(done)
