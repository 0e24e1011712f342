"""`/v1/batches`: create, retrieve, list and cancel (OpenAI Batch API)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from batchinfer import ids, intake, queues, store
from batchinfer.api.accounts import current_account
from batchinfer.api.errors import ApiError, Conflict, NotFound
from batchinfer.api.files import owned_file
from batchinfer.schemas import Batch, BatchList, CreateBatchRequest, window_hours
from batchinfer.settings import get_settings
from batchinfer.status import BatchStatus

router = Router()


def batch_view(item: dict) -> Batch:
    """The public Batch object of a header item (internal attributes dropped)."""
    return Batch.model_validate({k: item[k] for k in Batch.model_fields if k in item})


def owned_batch(batch_id: str) -> dict:
    """The header of `batch_id` if the caller's account owns it; else `NotFound` (no existence leak)."""
    item = store.get_batch(batch_id)
    if item is None or item.get("account_id") != current_account():
        raise NotFound(f"No such batch: {batch_id}", code="batch_not_found", param="batch_id")
    return item


@router.post("/v1/batches")
def create_batch(request: CreateBatchRequest) -> Batch:
    try:
        window_hours(request.completion_window)
    except ValueError as error:
        raise ApiError(str(error), code="invalid_completion_window", param="completion_window") from None
    input_file = owned_file(request.input_file_id)
    if input_file["purpose"] != "batch":
        raise ApiError(f"file {request.input_file_id} has purpose {input_file['purpose']!r}, not 'batch'",
                       code="invalid_file_purpose", param="input_file_id")
    item = intake.create_batch(
        batch_id=ids.new_batch_id(), account_id=current_account(), input_file_id=request.input_file_id,
        input_bucket=input_file["bucket"], input_key=input_file["key"], endpoint=request.endpoint,
        completion_window=request.completion_window, metadata=request.metadata, name=request.name)
    return batch_view(item)


@router.get("/v1/batches/<batch_id>")
def retrieve_batch(batch_id: str) -> Batch:
    return batch_view(owned_batch(batch_id))


@router.get("/v1/batches")
def list_batches(limit: Annotated[int, Query(ge=1, le=100)] = 20, after: str | None = None) -> BatchList:
    items, has_more = store.list_batches(current_account(), limit=limit, after=after)
    data = [batch_view(i) for i in items]
    return BatchList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                     has_more=has_more)


@router.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Batch:
    item = owned_batch(batch_id)
    status = BatchStatus(item["status"])
    if status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        return batch_view(item)
    cancelled = store.transition(batch_id, BatchStatus.CANCELLING)
    if cancelled is None:
        current = owned_batch(batch_id)
        if current["status"] in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return batch_view(current)
        raise Conflict(f"Batch {batch_id} is {current['status']} and can no longer be cancelled",
                       code="batch_not_cancellable")
    # The aggregator seals the batch, turns the unrun requests into `batch_cancelled` lines and ends it.
    queues.send(get_settings().finalize_queue_url, [queues.BatchMessage(batch_id=batch_id)])
    return batch_view(cancelled)
