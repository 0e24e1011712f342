"""`/v1/uploads`: files too large for one API request, in OpenAI's Uploads API shape
(https://platform.openai.com/docs/api-reference/uploads), in parts or with one presigned PUT.

A request through API Gateway and Lambda carries at most 6 MB, while a batch input may be 200 MB.

1. `POST /v1/uploads` `{"filename", "purpose": "batch", "bytes", "mime_type"}` -> an Upload
   (`status: pending`), valid for `UPLOAD_EXPIRES_SECONDS` (default 1 hour);
2. either parts, as OpenAI's: `POST /v1/uploads/{id}/parts` (multipart form field `data`, each part
   below the request limit) -> an Upload Part `{id, object: "upload.part", created_at, upload_id}`;
   or (this service's extension) one `PUT <upload_url>` of the whole file with `upload_headers`: the
   URL is signed for exactly `bytes` bytes of `mime_type`, so S3 refuses any other size;
3. `POST /v1/uploads/{id}/complete` `{"part_ids": [...in order...], "md5"?}` (no parts: the PUT) ->
   the Upload (`status: completed`) whose `file` is the new File, usable as a batch's `input_file_id`.

What a batch reads is written only here: parts and the PUT go to staging keys
(`uploads/<upload_id>/...`, kept by no one: the bucket's lifecycle deletes them after a day), and
complete copies them, streamed, into `files/<file_id>`, checking that exactly `bytes` bytes (and the
`md5`) arrived. So nothing written to an upload after it completed or was cancelled (a part is then
refused; a still-valid PUT URL only rewrites the staging key) changes any file. `POST
/v1/uploads/{id}/cancel` drops a pending upload; `GET /v1/uploads/{id}` shows one. Another account's
upload is 404 on every route.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, File, Path, UploadFile

from batchinfer.api import links
from batchinfer.api.auth import current_account
from batchinfer.api.errors import ApiError, Conflict, NotFound, documented
from batchinfer.api.files import account_storage, file_object, new_file_record
from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import s3, storage, uploads
from batchinfer.data.items import UploadPart, UploadRecord
from batchinfer.data.table import now
from batchinfer.wire.openai import (
    MAX_ID_LENGTH,
    CompleteUploadRequest,
    CreateUploadRequest,
    Upload,
    UploadPartObject,
)

router = Router()
UploadId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH)]
STAGING_PREFIX = "uploads/"


def staging_key(upload_id: str) -> str:
    """Where the presigned PUT of an upload writes."""
    return f"{STAGING_PREFIX}{upload_id}/object"


def part_key(upload_id: str, part_id: str) -> str:
    """Where a part of an upload is kept until complete."""
    return f"{STAGING_PREFIX}{upload_id}/parts/{part_id}"


def upload_view(item: UploadRecord) -> Upload:
    """The public Upload object; a pending upload gets a fresh presigned PUT URL."""
    upload = Upload.model_validate(item.model_dump(include=set(Upload.model_fields), exclude_none=True))
    if upload.status == "pending" and item.expires_at <= now():
        return upload.model_copy(update={"status": "expired"})
    if upload.status == "pending":
        url = s3.presigned_put(
            item.bucket,
            item.key,
            content_type=item.mime_type,
            content_length=item.bytes,
            expires_in=max(1, item.expires_at - now()),
        )
        headers = {"Content-Type": item.mime_type, "Content-Length": str(item.bytes)}
        return upload.model_copy(update={"upload_url": url, "upload_headers": headers})
    return upload


def owned_upload(upload_id: str) -> UploadRecord:
    """The upload record if the caller's account owns it; else `NotFound`."""
    item = uploads.get(upload_id)
    if item is None or item.account_id != current_account():
        raise NotFound(f"No such Upload object: {upload_id}", code="upload_not_found", param="upload_id")
    return item


def _not_pending(item: UploadRecord, action: str) -> Conflict:
    return Conflict(
        f"Upload {item.id} is {upload_view(item).status} and can't {action}.", code="upload_not_pending"
    )


@router.post("/v1/uploads", responses=documented(None, 413, 429, links=links.UPLOAD))
def create_upload(request: CreateUploadRequest) -> Upload:
    """Announce a large file; add its parts (or PUT it to the returned upload_url), then complete."""
    settings = get_settings()
    if request.bytes > settings.max_file_bytes:
        raise ApiError(
            f"bytes: {request.bytes} is over the {settings.max_file_bytes}-byte limit of a batch file",
            code="file_too_large",
            param="bytes",
        )
    at, file_id = now(), ids.new_file_id()
    upload_id = f"upload_{file_id.removeprefix('file-')}"
    item = UploadRecord(
        id=upload_id,
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
        key=staging_key(upload_id),
    )
    uploads.create(item, account_storage(item.account_id))
    return upload_view(item)


@router.get("/v1/uploads/<upload_id>", responses=documented(None, 404))
def retrieve_upload(upload_id: UploadId) -> Upload:
    """An upload (pending ones with a fresh upload_url)."""
    return upload_view(owned_upload(upload_id))


@router.post("/v1/uploads/<upload_id>/parts", responses=documented(None, 404, 409, 413, 429))
def add_upload_part(
    upload_id: UploadId, data: Annotated[UploadFile, File(description="the part's bytes")]
) -> UploadPartObject:
    """Add a part (below the 6 MB a request carries); complete names the parts in the file's order."""
    item = owned_upload(upload_id)
    if item.status != "pending" or item.expires_at <= now():
        raise _not_pending(item, "take parts")
    if not data.content:
        raise ApiError("data: a part must hold at least one byte", code="empty_part", param="data")
    part_id = f"part_{secrets.token_hex(12)}"
    part = UploadPart(
        id=part_id,
        created_at=now(),
        upload_id=upload_id,
        bytes=len(data.content),
        key=part_key(upload_id, part_id),
    )
    max_parts = account_storage(item.account_id).max_parts
    s3.put_bytes(item.bucket, part.key, data.content, "application/octet-stream")
    try:
        added = uploads.add_part(part, max_parts=max_parts)
    except storage.QuotaExceeded:
        s3.delete(item.bucket, part.key)
        raise
    if not added:  # completed, cancelled or expired since it was read
        s3.delete(item.bucket, part.key)
        raise _not_pending(uploads.get(upload_id) or item, "take parts")
    return UploadPartObject(id=part.id, created_at=part.created_at, upload_id=upload_id)


def _sources(item: UploadRecord, part_ids: list[str]) -> list[str]:
    """The staging keys to concatenate: the parts named, in order, or the PUT's object."""
    if not part_ids:
        if s3.size(item.bucket, item.key) is None:
            raise ApiError(
                "Nothing was uploaded: add parts (POST /v1/uploads/{id}/parts) or PUT the file's bytes "
                "to upload_url first.",
                code="upload_incomplete",
            )
        return [item.key]
    if len(set(part_ids)) != len(part_ids):
        raise ApiError("part_ids: a part is named twice", code="duplicate_part", param="part_ids")
    known = uploads.parts(item.id)
    if unknown := [p for p in part_ids if p not in known]:
        raise ApiError(
            f"part_ids: {unknown[0]!r} is no part of upload {item.id}",
            code="upload_part_not_found",
            param="part_ids",
        )
    total = sum(known[p].bytes for p in part_ids)
    if total != item.bytes:
        raise ApiError(
            f"The parts hold {total} bytes, but {item.bytes} were announced.",
            code="upload_size_mismatch",
            param="part_ids",
        )
    return [known[p].key for p in part_ids]


@router.post(
    "/v1/uploads/<upload_id>/complete", responses=documented(None, 404, 409, links=links.COMPLETED_UPLOAD)
)
def complete_upload(
    upload_id: UploadId, request: Annotated[CompleteUploadRequest | None, Body()] = None
) -> Upload:
    """Turn the parts (or the PUT's bytes) into a File: exactly `bytes` bytes, and `md5` when given."""
    request = request or CompleteUploadRequest()
    item = owned_upload(upload_id)
    if item.status == "completed":
        return upload_view(item)
    if item.status != "pending" or item.expires_at <= now():
        raise _not_pending(item, "be completed")
    sources = _sources(item, request.part_ids)
    record = new_file_record(
        file_id=item.file_id,
        size=item.bytes,
        filename=item.filename,
        purpose=item.purpose,
        account_id=item.account_id,
    )
    try:
        md5 = s3.concatenate(
            item.bucket, sources, record.key, expected_bytes=item.bytes, content_type=item.mime_type
        )
    except s3.SizeMismatch as error:  # only the PUT's object can differ: parts were counted above
        raise ApiError(
            f"The upload has {error.actual}{'+' if error.actual > error.expected else ''} bytes, "
            f"but {item.bytes} were announced.",
            code="upload_size_mismatch",
            param="bytes",
        ) from None
    if request.md5 is not None and request.md5.lower() != md5:
        s3.delete(record.bucket, record.key)
        raise ApiError(
            f"md5: the uploaded bytes have MD5 {md5}, not {request.md5.lower()}",
            code="upload_md5_mismatch",
            param="md5",
        )
    if uploads.complete(item, record, file_object(record)):
        _drop_staging(item)
    current = owned_upload(upload_id)
    if current.status != "completed":  # expired or cancelled meanwhile: its copy is no file
        s3.delete(record.bucket, record.key)
    return upload_view(current)


def _drop_staging(item: UploadRecord) -> None:
    """Delete what was staged for an upload (the lifecycle rule deletes whatever this misses)."""
    for key in [item.key, *(part.key for part in uploads.parts(item.id).values())]:
        s3.delete(item.bucket, key)


@router.post("/v1/uploads/<upload_id>/cancel", responses=documented(None, 404, 409))
def cancel_upload(upload_id: UploadId) -> Upload:
    """Drop a pending upload."""
    item = owned_upload(upload_id)
    if item.status == "cancelled":
        return upload_view(item)
    if not uploads.cancel(item):
        raise _not_pending(owned_upload(upload_id), "be cancelled")
    _drop_staging(item)
    return upload_view(owned_upload(upload_id))
