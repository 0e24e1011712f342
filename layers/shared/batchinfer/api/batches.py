"""`/v1/batches`: create, retrieve, list and cancel (OpenAI Batch API, plus the TokenHub dialect).

https://platform.openai.com/docs/api-reference/batch
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from batchinfer.api import links, tokenhub
from batchinfer.api.auth import current_account, idempotency_key
from batchinfer.api.errors import ApiError, Conflict, NotFound, TooManyRequests, documented, stored_despite
from batchinfer.core import ids
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, batches, locations, s3, sqs
from batchinfer.data.items import BatchHeader
from batchinfer.pipeline import dry_run, intake
from batchinfer.wire.dry_run import DryRun
from batchinfer.wire.openai import MAX_ID_LENGTH, Batch, BatchList, CreateBatchRequest, window_hours
from batchinfer.wire.status import BatchStatus

router = Router()
BatchId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH)]
After = Annotated[
    str | None, Query(max_length=MAX_ID_LENGTH, description="the last batch id of the previous page")
]


def batch_view(item: BatchHeader) -> Batch:
    """The public Batch object of a batch header (internal attributes dropped), with the live
    `request_counts` and `usage` of `BatchHeader.shown_counts`.

    For results in user storage (TokenHub `output_target`), `output_file_id` / `error_file_id` are the
    objects' paths and `output_file_url` / `error_file_url` fresh presigned download URLs.
    """
    counts, usage = item.shown_counts()  # committed plus the shards' live progress while the batch runs
    shown = item.model_copy(update={"request_counts": counts, "usage": usage})
    batch = Batch.model_validate(shown.model_dump(include=set(Batch.model_fields), exclude_none=True))
    if batch.output_target == "file":
        return batch
    settings, where = get_settings(), item.output_where
    changes: dict[str, str | None] = {}
    for kind, file_id in (("output", item.output_file_id), ("error", item.error_file_id)):
        if file_id:
            key = f"{item.output_prefix}{kind}.jsonl"
            changes[f"{kind}_file_id"] = locations.located(where, item.output_bucket, key).uri()
            try:
                changes[f"{kind}_file_url"] = s3.presigned_get(
                    item.output_bucket, key, where=where, expires_in=settings.presign_seconds
                )
            except locations.InvalidPath:  # COS was switched off since: the path is all we can give
                logger.warning("no presigned URL for a cos:// result", extra={"batch_id": item.id})
            except locations.Unavailable as error:  # the bucket is gone, or is another account's now
                logger.warning("no presigned URL", extra={"batch_id": item.id, "code": error.code})
    return batch.model_copy(update=changes)


def owned_batch(batch_id: str) -> BatchHeader:
    """The header of `batch_id` if the caller's account owns it; else `NotFound` (no existence leak)."""
    item = batches.get(batch_id)
    if item is None or item.account_id != current_account():
        raise NotFound(f"No batch found with id '{batch_id}'.", code="batch_not_found", param="batch_id")
    return item


def _batch_id(account_id: str) -> str:
    """A new batch id, or the one an `Idempotency-Key` header names: a retried create (same key, same
    account) returns the batch the first attempt created instead of starting a second one."""
    key = idempotency_key(dict(router.current_event.headers or {}))
    return ids.new_batch_id() if key is None else ids.idempotent_batch_id(account_id, key)


def _stored_despite(error: Exception, batch_id: str, account_id: str) -> BatchHeader:
    """The header of `batch_id` when its create took effect although an AWS call of it failed
    (`errors.stored_despite`: the header's transaction answered 5xx or timed out after committing, or
    the prepare message could not be sent; a `validating` batch without its prepare message is the
    sweeper's to re-send, `pipeline.sweep`). Raises `error` again otherwise."""

    def read() -> BatchHeader | None:
        stored = batches.get(batch_id)
        return stored if stored is not None and stored.account_id == account_id else None

    stored = stored_despite(error, read)
    logger.warning("batch stored although its create failed", extra={"batch_id": batch_id})
    return stored


def limit_refused(error: accounts.LimitExceeded) -> TooManyRequests:
    """The 429 of a create over one of the account's limits (`error`), saying what to do."""
    remedy = "." if error.kind == "rate" else "; wait for one to end or cancel one."
    return TooManyRequests(error.reached + remedy, code=error.code, retry_after=error.retry_after)


def _dry_run(request: CreateBatchRequest, plan: tokenhub.Plan) -> DryRun:
    """The dry run of a create: its input checked and estimated (`pipeline.dry_run`), nothing created."""
    source = locations.located(plan.input_where, plan.input_bucket, plan.input_key)
    window = request.completion_window
    return dry_run.dry_run(source, input_file_id=request.input_file_id, endpoint=plan.endpoint, window=window)


CREATE_RESPONSES = {
    **documented(None, 403, 404, 429, links=links.BATCH),
    202: {
        "description": "Accepted: a TokenHub-dialect create (s3:// or cos:// input or output)",
        "content": {"application/json": {"model": Batch}},
    },
}


@router.post("/v1/batches", responses=CREATE_RESPONSES)
def create_batch(request: CreateBatchRequest) -> Response[Batch | DryRun]:
    """Create a batch from an uploaded file (OpenAI: HTTP 200) or from s3:// / cos:// paths (TokenHub:
    HTTP 202, as the TokenHub document's create answers). The body is the Batch object either way;
    with `dry_run`, no batch is created: the body is the file's check and estimate (`DryRun`)."""
    try:
        window_hours(request.completion_window)
    except ValueError as error:
        raise ApiError(str(error), code="invalid_completion_window", param="completion_window") from None
    account_id = current_account()
    account = accounts.get_account(account_id)
    plan = tokenhub.plan(request, account, account_id)
    if request.output_expires_after is not None and plan.output_target not in (None, "file"):
        raise ApiError(
            "output_expires_after applies to result files the service stores; results written to your "
            f"own storage (output_target {plan.output_target!r}) follow that bucket's lifecycle rules.",
            code="invalid_request",
            param="output_expires_after",
        )
    if request.dry_run:
        return Response(status_code=200, content_type="application/json", body=_dry_run(request, plan))
    batch_id, limits = _batch_id(account_id), accounts.batch_limits(account)
    new = intake.NewBatch(
        batch_id=batch_id,
        account_id=account_id,
        input_file_id=request.input_file_id,
        input_bucket=plan.input_bucket,
        input_key=plan.input_key,
        input_where=plan.input_where,
        endpoint=plan.endpoint,
        completion_window=request.completion_window,
        metadata=request.metadata,
        name=request.name,
        output_bucket=plan.output.bucket if plan.output else None,
        output_prefix=plan.output_prefix(batch_id),
        output_where=plan.output.where if plan.output else "",
        input_source=request.input_source,
        output_target=plan.output_target,
        output_user_s3_path=request.output_user_s3_path,
        output_user_cos_path=request.output_user_cos_path,
        max_active=limits.max_active,
        max_per_minute=limits.max_per_minute,
        output_expires_after=request.output_expires_after.seconds if request.output_expires_after else None,
    )
    try:
        item = intake.create_batch(new)
    except accounts.LimitExceeded as error:
        raise limit_refused(error) from None
    except Exception as error:  # AWS unavailable: answered 503 unless the batch was in fact stored
        item = _stored_despite(error, batch_id, account_id)
    tokenhub_dialect = request.input_source != "file" or plan.output_target != "file"
    return Response(
        status_code=202 if tokenhub_dialect else 200, content_type="application/json", body=batch_view(item)
    )


@router.get("/v1/batches/<batch_id>", responses=documented(None, 404, links=links.BATCH_RESULTS))
def retrieve_batch(batch_id: BatchId) -> Batch:
    """The batch, with live request_counts while it runs."""
    return batch_view(owned_batch(batch_id))


@router.get("/v1/batches", responses=documented(None, links=links.BATCH_PAGE))
def list_batches(
    limit: Annotated[int, Query(ge=1, le=100, description="page size")] = 20, after: After = None
) -> BatchList:
    """The caller's batches, newest first."""
    items, has_more = batches.page(current_account(), limit=limit, after=after)
    data = [batch_view(i) for i in items]
    return BatchList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.post("/v1/batches/<batch_id>/cancel", responses=documented(None, 404, 409, links=links.BATCH_RESULTS))
def cancel_batch(batch_id: BatchId) -> Batch:
    """Cancel a batch that has not ended: `cancelling`, then `cancelled` with the finished results kept."""
    item = owned_batch(batch_id)
    if item.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        return batch_view(item)
    cancelled = batches.transition(batch_id, BatchStatus.CANCELLING)
    if cancelled is None:
        current = owned_batch(batch_id)
        if current.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return batch_view(current)
        raise Conflict(
            f"Batch {batch_id} is {current.status.value} and can no longer be cancelled.",
            code="batch_not_cancellable",
        )
    # The aggregator seals the batch, turns the unrun requests into `batch_cancelled` lines and ends it.
    sqs.send(
        get_settings().finalize_queue_url,
        [sqs.BatchMessage(batch_id=batch_id)],
        group_id=cancelled.account_id,
    )
    return batch_view(cancelled)
