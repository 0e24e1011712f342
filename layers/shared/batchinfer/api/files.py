"""`/v1/files`: the pieces of the OpenAI Files API a batch needs (upload, retrieve, list, content, delete).

https://platform.openai.com/docs/api-reference/files. A file larger than a request may carry
(API Gateway HTTP API: 10 MB; Lambda: 6 MB) goes through `/v1/uploads` (see `api/uploads.py`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import File, Form, Path, Query, UploadFile

from batchinfer.api import links
from batchinfer.api.auth import current_account, idempotency_key
from batchinfer.api.errors import ApiError, NotFound, documented, stored_despite
from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, files, s3, storage
from batchinfer.data.items import FileRecord
from batchinfer.data.table import now
from batchinfer.validation.file import jsonl_format_problem
from batchinfer.wire.openai import MAX_ID_LENGTH, FileDeleted, FileList, FileObject, check_filename

router = Router()
# Lambda responses are capped at 6 MB: larger contents are served by a presigned S3 URL (302).
INLINE_CONTENT_BYTES = 4 * 1024 * 1024
FileId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH)]


def file_object(item: FileRecord) -> FileObject:
    """The public File object of a file record."""
    return FileObject.model_validate(item.model_dump(include=set(FileObject.model_fields)))


def owned_file(file_id: str, account_id: str | None = None) -> FileRecord:
    """The file record of `file_id` if the account (default: the caller's) owns it; else `NotFound`
    (no existence leak)."""
    item = files.get(file_id) if len(file_id) <= MAX_ID_LENGTH else None
    if item is None or item.account_id != (account_id or current_account()):
        raise NotFound(f"No such File object: {file_id}", code="file_not_found", param="file_id")
    return item


def new_file_record(*, file_id: str, size: int, filename: str, purpose: str, account_id: str) -> FileRecord:
    """A file record for an object at `files/<file_id>` of the service bucket."""
    return FileRecord(
        id=file_id,
        bytes=size,
        created_at=now(),
        filename=filename,
        purpose=purpose,
        status="processed",
        account_id=account_id,
        bucket=get_settings().bucket_name,
        key=f"files/{file_id}",
    )


def account_storage(account_id: str) -> storage.StorageLimits:
    """The storage quotas of `account_id` (`data.storage`)."""
    return storage.storage_limits(accounts.get_account(account_id))


@router.post("/v1/files", responses=documented(None, 413, 429, links=links.FILE))
def upload_file(
    file: Annotated[UploadFile, File(description="the JSONL input")],
    purpose: Annotated[Literal["batch"], Form(description="what the file is for: 'batch'")],
) -> FileObject:
    """Upload a JSONL batch input (up to the 6 MB a request can carry; larger files: /v1/uploads)."""
    try:
        filename = check_filename((file.filename or "upload.jsonl")[:255])
    except ValueError as error:
        raise ApiError(f"file: {error}", code="invalid_filename", param="file") from None
    if problem := jsonl_format_problem(file.content):
        raise ApiError(
            f"Invalid file format for Batch API. Must be .jsonl: {problem}",
            code="invalid_file_format",
            param="file",
        )
    account_id = current_account()
    key = idempotency_key(dict(router.current_event.headers or {}))
    file_id = ids.new_file_id() if key is None else ids.idempotent_file_id(account_id, key)
    if key is not None and (first := files.get(file_id, consistent=True)) is not None:
        return file_object(first)  # a retry: the first attempt's file, whatever this one sent
    item = new_file_record(
        file_id=file_id, size=len(file.content), purpose=purpose, filename=filename, account_id=account_id
    )
    limits = account_storage(account_id)
    storage.check_size(item.bytes, limits)  # before its bytes are written
    s3.put_bytes(item.bucket, item.key, file.content)
    try:
        created = files.create(item, limits)
    except storage.QuotaExceeded:
        if files.get(file_id, consistent=True) is None:
            s3.delete(item.bucket, item.key)
        raise
    except Exception as error:  # AWS unavailable: a 503 unless the record was stored all the same
        return file_object(stored_despite(error, lambda: files.get(file_id, consistent=True)))
    if not created:  # an idempotent retry that raced its first attempt
        return file_object(files.get(file_id, consistent=True) or item)
    return file_object(item)


@router.get("/v1/files", responses=documented(None, links=links.FILE_PAGE))
def list_files(
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: Annotated[str | None, Query(max_length=MAX_ID_LENGTH)] = None,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> FileList:
    """The caller's files (inputs and batch results)."""
    items, has_more = files.page(
        current_account(), limit=limit, after=after, purpose=purpose, newest_first=order == "desc"
    )
    data = [file_object(i) for i in items]
    return FileList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.get("/v1/files/<file_id>", responses=documented(None, 404, links=links.FILE))
def retrieve_file(file_id: FileId) -> FileObject:
    """A file's metadata."""
    return file_object(owned_file(file_id))


@router.delete("/v1/files/<file_id>", responses=documented(None, 404))
def delete_file(file_id: FileId) -> FileDeleted:
    """Delete a file and its bytes (given back to the account's storage quota)."""
    item = owned_file(file_id)
    files.remove(item)
    s3.delete(item.bucket, item.key, where=item.where)
    return FileDeleted(id=file_id, deleted=True)


@router.get(
    "/v1/files/<file_id>/content",
    responses=documented(
        {"description": "the file's bytes", "content": {"application/octet-stream": {"schema": {}}}}, 404
    )
    | {302: {"description": "large files: a presigned S3 URL in Location"}},
)
def file_content(file_id: FileId):
    """A file's bytes (files over 4 MB: a 302 to a presigned S3 URL).

    The function never holds more than `INLINE_CONTENT_BYTES` of it: the object's own size decides
    (`s3.read_at_most`), not the one recorded, so an object larger than its record is redirected too.
    """
    item = owned_file(file_id)
    data = None
    if item.bytes <= INLINE_CONTENT_BYTES:
        data = s3.read_at_most(item.bucket, item.key, INLINE_CONTENT_BYTES, where=item.where)
    if data is None:
        url = s3.presigned_get(
            item.bucket,
            item.key,
            filename=item.filename,
            where=item.where,
            expires_in=get_settings().presign_seconds,
        )
        return Response(status_code=302, headers={"Location": url}, body="")
    return Response(status_code=200, content_type="application/octet-stream", body=data)
