"""`/v1/messages/batches`: Anthropic's Message Batches API on the same pipeline as `/v1/batches`.

https://docs.anthropic.com/en/api/creating-message-batches. A create stores its inline requests as
the batch's input file (a `batch` file of the account, one line per request: `{"custom_id", "method":
"POST", "url": "/v1/messages", "body": {"model", "params"}}`, see `batchinfer.endpoints.messages`),
then the batch is created, prepared, sharded, run, counted, cancelled and expired as any other. Its
params are checked per request when it runs: a bad one is an `errored` result, the rest run.

Message Batches are batches of the `/v1/messages` endpoint: they are listed on `/v1/batches` too
(their result files in the OpenAI shape), while these routes only know batches of that endpoint (an
OpenAI batch is a 404 here). Errors are Anthropic's envelope (`error_response`) with a `request-id`
header; the key may come as `x-api-key` or `Authorization: Bearer` (`auth.takes_api_key`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from batchinfer.api import anthropic_view
from batchinfer.api.auth import current_account, idempotency_key
from batchinfer.api.batches import BatchId, cancel_batch, owned_batch
from batchinfer.api.errors import ApiError, NotFound, TooManyRequests, documented, stored_despite
from batchinfer.api.files import INLINE_CONTENT_BYTES, new_file_record
from batchinfer.backends import load_registry
from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, batches, files, s3
from batchinfer.data.items import BatchHeader
from batchinfer.pipeline import intake
from batchinfer.wire.anthropic import (
    MAX_BODY_BYTES,
    MAX_REQUESTS,
    MESSAGES_ENDPOINT,
    CreateMessageBatch,
    DeletedMessageBatch,
    ErrorObject,
    ErrorResponse,
    MessageBatch,
    MessageBatchList,
)
from batchinfer.wire.openai import MAX_ID_LENGTH
from batchinfer.wire.status import is_terminal

router = Router()
Cursor = Annotated[str | None, Query(max_length=MAX_ID_LENGTH)]
# Anthropic's error type of each HTTP status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class TooLarge(ApiError):
    status = 413


def _documented(*codes: int, success: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """OpenAPI `responses` of a route (`errors.documented`), its errors in Anthropic's envelope."""
    responses = documented(success, *(code for code in codes if code != 413))
    if 413 in codes:
        responses[413] = {"description": "Over the requests or bytes a batch may hold"}
    for response in responses.values():
        if "content" in response and response is not responses[200]:
            response["content"] = {"application/json": {"model": ErrorResponse}}
    return responses


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """Anthropic's error envelope `{"type": "error", "error": {type, message}, "request_id"}` with its
    `request-id` header; the type follows the status (`api_error` for the others)."""
    request_id = f"req_{ids.write_token()}"
    body = ErrorResponse(
        error=ErrorObject(type=_ERROR_TYPES.get(status, "api_error"), message=message), request_id=request_id
    )
    return Response(
        status_code=status,
        content_type="application/json",
        headers={**(headers or {}), "request-id": request_id},
        body=body.model_dump_json(),
    )


def owned_message_batch(batch_id: str) -> BatchHeader:
    """The header of the caller's Message Batch `batch_id`; else `NotFound` (another account's, or
    an OpenAI batch)."""
    item = owned_batch(batch_id)
    if item.endpoint != MESSAGES_ENDPOINT:
        raise NotFound(f"No message batch found with id '{batch_id}'.", code="not_found_error")
    return item


def _input_lines(request: CreateMessageBatch, model: str) -> bytes:
    lines = (
        {
            "custom_id": entry.custom_id,
            "method": "POST",
            "url": MESSAGES_ENDPOINT,
            "body": {"model": model, "params": entry.params},
        }
        for entry in request.requests
    )
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


def _check_size(request: CreateMessageBatch) -> None:
    """413 `request_too_large` past the limits of a batch (Anthropic's, or this deployment's lower ones)."""
    settings = get_settings()
    max_requests = min(MAX_REQUESTS, settings.max_requests_per_file)
    max_bytes = min(MAX_BODY_BYTES, settings.max_file_bytes)
    body = router.current_event.body or ""
    if len(request.requests) > max_requests or len(body) > max_bytes:
        raise TooLarge(
            f"A message batch holds at most {max_requests} requests and {max_bytes} bytes; this one has "
            f"{len(request.requests)} requests in {len(body)} bytes."
        )


def _batch_model(request: CreateMessageBatch) -> str:
    """The model the batch is scheduled on: the first request's that the registry serves (any of the
    registry's when none does: every request is then an `errored` result)."""
    registry = load_registry(get_settings().model_registry)
    named = (entry.params.get("model") for entry in request.requests)
    return next((m for m in named if isinstance(m, str) and m in registry), registry.names()[0])


@router.post("/v1/messages/batches", responses=_documented(413, 429))
def create_message_batch(request: CreateMessageBatch) -> MessageBatch:
    """Create a Message Batch from its inline requests (1 to 100,000, unique `custom_id`s)."""
    _check_size(request)
    account_id = current_account()
    key = idempotency_key(dict(router.current_event.headers or {}))
    batch_id = ids.new_batch_id() if key is None else ids.idempotent_batch_id(account_id, key)
    if key is not None and (first := batches.get(batch_id)) is not None and first.account_id == account_id:
        return anthropic_view.message_batch(first)
    data = _input_lines(request, _batch_model(request))
    record = new_file_record(
        file_id=ids.result_file_id(batch_id, "input"),
        size=len(data),
        filename=f"{batch_id}_requests.jsonl",
        purpose="batch",
        account_id=account_id,
    )
    s3.put_bytes(record.bucket, record.key, data)
    files.put(record)
    limits = accounts.batch_limits(accounts.get_account(account_id))
    new = intake.NewBatch(
        batch_id=batch_id,
        account_id=account_id,
        input_file_id=record.id,
        input_bucket=record.bucket,
        input_key=record.key,
        endpoint=MESSAGES_ENDPOINT,
        completion_window="24h",
        max_active=limits.max_active,
        max_per_minute=limits.max_per_minute,
        request_count=len(request.requests),
    )
    try:
        item = intake.create_batch(new)
    except accounts.LimitExceeded as error:
        raise TooManyRequests(error.reached + ".", code=error.code, retry_after=error.retry_after) from None
    except Exception as error:  # AWS unavailable: answered 503 unless the batch was in fact stored
        item = stored_despite(error, lambda: batches.get(batch_id))
    return anthropic_view.message_batch(item)


@router.get("/v1/messages/batches", responses=_documented())
def list_message_batches(
    limit: Annotated[int, Query(ge=1, le=1000)] = 20, after_id: Cursor = None, before_id: Cursor = None
) -> MessageBatchList:
    """The caller's Message Batches, newest first; `after_id` pages to older ones, `before_id` to newer."""
    if after_id and before_id:
        raise ApiError("give after_id or before_id, not both")
    items, has_more = batches.page(
        current_account(), limit=limit, after=after_id, before=before_id, endpoint=MESSAGES_ENDPOINT
    )
    data = [anthropic_view.message_batch(i) for i in items]
    return MessageBatchList(
        data=data,
        has_more=has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.get("/v1/messages/batches/<batch_id>", responses=_documented(404))
def retrieve_message_batch(batch_id: BatchId) -> MessageBatch:
    """A Message Batch, with live counts while it runs."""
    return anthropic_view.message_batch(owned_message_batch(batch_id))


@router.post("/v1/messages/batches/<batch_id>/cancel", responses=_documented(404, 409))
def cancel_message_batch(batch_id: BatchId) -> MessageBatch:
    """Cancel a Message Batch: `canceling`, then `ended` with what finished kept (an ended one as is)."""
    item = owned_message_batch(batch_id)
    if is_terminal(item.status):
        return anthropic_view.message_batch(item)
    cancel_batch(batch_id)
    return anthropic_view.message_batch(owned_message_batch(batch_id))


@router.delete("/v1/messages/batches/<batch_id>", responses=_documented(404))
def delete_message_batch(batch_id: BatchId) -> DeletedMessageBatch:
    """Delete an ended Message Batch with its input and result files; a running one is a 400 (cancel
    it first), not a status the SDKs retry."""
    item = owned_message_batch(batch_id)
    if not is_terminal(item.status):
        raise ApiError(
            f"Message batch {batch_id} is still processing; cancel it and wait for it to end first.",
            headers={"x-should-retry": "false"},
        )
    for file_id in (item.input_file_id, item.output_file_id, item.error_file_id):
        record = files.get(file_id) if file_id else None
        if record is not None:
            s3.delete(record.bucket, record.key, where=record.where)
            files.remove(record)
    s3.delete(get_settings().bucket_name, results_key(batch_id))
    batches.delete(batch_id)
    return DeletedMessageBatch(id=batch_id)


@router.get(
    "/v1/messages/batches/<batch_id>/results",
    responses=_documented(
        404, success={"description": "JSON Lines", "content": {"application/octet-stream": {"schema": {}}}}
    )
    | {302: {"description": "large results: a presigned S3 URL in Location"}},
)
def message_batch_results(batch_id: BatchId):
    """An ended batch's results as JSON Lines, one line per request in input order; over 4 MiB (a
    Lambda answer carries 6 MB) written to `files/<batch_id>-results.jsonl` and answered with a 302
    to a presigned URL of it (the SDK follows it)."""
    item = owned_message_batch(batch_id)
    if not is_terminal(item.status):
        raise ApiError(f"Message batch {batch_id} has not ended yet: its results are not ready.")
    custom_ids = anthropic_view.input_custom_ids(item.input_bucket, item.input_key, item.input_where)
    body = anthropic_view.results(item, custom_ids)
    if len(body) <= INLINE_CONTENT_BYTES:
        return Response(status_code=200, content_type="application/octet-stream", body=body)
    bucket, key = get_settings().bucket_name, results_key(batch_id)
    s3.put_bytes(bucket, key, body)
    url = s3.presigned_get(
        bucket, key, filename=f"{batch_id}_results.jsonl", expires_in=get_settings().presign_seconds
    )
    return Response(status_code=302, headers={"Location": url}, body="")


def results_key(batch_id: str) -> str:
    """Where the results of a Message Batch too large to answer inline are kept (deleted with it)."""
    return f"files/{batch_id}-results.jsonl"
