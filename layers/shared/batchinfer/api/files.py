"""`/v1/files`: the pieces of the OpenAI Files API a batch needs (upload, retrieve, list, content, delete)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import File, Form, Query, UploadFile

from batchinfer import ids, storage, store
from batchinfer.api.accounts import current_account
from batchinfer.api.errors import ApiError, NotFound
from batchinfer.schemas import FileDeleted, FileList, FileObject
from batchinfer.settings import get_settings

router = Router()
# Lambda responses are capped at 6 MB: larger contents are served by a presigned S3 URL (302).
INLINE_CONTENT_BYTES = 4 * 1024 * 1024
PURPOSES = ("batch",)


def file_object(item: dict) -> FileObject:
    return FileObject.model_validate({k: item.get(k) for k in FileObject.model_fields if k in item})


def owned_file(file_id: str) -> dict:
    """The file record of `file_id` if the caller's account owns it; else `NotFound` (no existence leak)."""
    item = store.get_file(file_id)
    if item is None or item.get("account_id") != current_account():
        raise NotFound(f"No such file: {file_id}", code="file_not_found", param="file_id")
    return item


@router.post("/v1/files")
def upload_file(file: Annotated[UploadFile, File(description="the JSONL input")],
                purpose: Annotated[str, Form(description="must be 'batch'")]) -> FileObject:
    if purpose not in PURPOSES:
        raise ApiError(f"purpose must be one of {list(PURPOSES)}, got {purpose!r}", code="invalid_purpose",
                       param="purpose")
    settings = get_settings()
    file_id = ids.new_file_id()
    key = f"files/{file_id}"
    storage.put_bytes(settings.bucket_name, key, file.content)
    item = {"id": file_id, "object": "file", "bytes": len(file.content), "created_at": store.now(),
            "filename": file.filename or "upload.jsonl", "purpose": purpose, "status": "processed",
            "account_id": current_account(), "bucket": settings.bucket_name, "key": key}
    store.put_file(item)
    return file_object(item)


@router.get("/v1/files")
def list_files(limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000) -> FileList:
    data = [file_object(i) for i in store.list_files(current_account(), limit=limit)]
    return FileList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None)


@router.get("/v1/files/<file_id>")
def retrieve_file(file_id: str) -> FileObject:
    return file_object(owned_file(file_id))


@router.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> FileDeleted:
    item = owned_file(file_id)
    store.delete_file(file_id)
    storage.delete(item["bucket"], item["key"])
    return FileDeleted(id=file_id, deleted=True)


@router.get("/v1/files/<file_id>/content", responses={
    200: {"description": "the file's bytes", "content": {"application/octet-stream": {}}},
    302: {"description": "large files: a presigned S3 URL in Location"}})
def file_content(file_id: str):  # noqa: ANN201 - Powertools can't model a raw Response as a return type
    item = owned_file(file_id)
    if item["bytes"] > INLINE_CONTENT_BYTES:
        url = storage.presigned_get(item["bucket"], item["key"], filename=item["filename"])
        return Response(status_code=302, headers={"Location": url}, body="")
    data = storage.get_bytes(item["bucket"], item["key"])
    return Response(status_code=200, content_type="application/octet-stream", body=data)
