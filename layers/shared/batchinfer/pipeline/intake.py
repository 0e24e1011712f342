"""Creating a batch: the one path shared by `POST /v1/batches` and the S3 upload trigger."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, batches, sqs
from batchinfer.data.items import BatchHeader
from batchinfer.data.table import now
from batchinfer.wire.openai import (
    BatchErrors,
    InputSource,
    LineErrorOut,
    OutputTarget,
    RequestCounts,
    window_hours,
)
from batchinfer.wire.status import BatchStatus


class NewBatch(BaseModel):
    """What a batch is created from (`create_batch`), as `POST /v1/batches` or an inbox upload gives it.

    Results go to `output_bucket`/`output_prefix` (None: the service bucket, `batches/<id>/`);
    `input_where`/`output_where` say which storage holds those buckets (`batchinfer.data.locations`).
    `input_source` ... `output_user_cos_path` are the TokenHub fields of the request (None: not given,
    as for inbox uploads). `input_version_id` / `input_etag` pin the object prepare reads (the upload
    an S3 event named). `max_active` / `max_per_minute` are the account's limits (None: counted, never
    refused). `output_expires_after`: seconds after creation at which the result files expire (None:
    never). `request_count`: the requests, when known before prepare counts them (the Message Batches
    routes: `request_counts.total` from creation on). The other fields are stored on the `BatchHeader`
    as given.
    """

    model_config = ConfigDict(frozen=True)

    batch_id: str
    account_id: str
    input_file_id: str
    input_bucket: str
    input_key: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    name: str | None = None
    output_bucket: str | None = None
    output_prefix: str | None = None
    input_where: str = ""
    input_version_id: str | None = None
    input_etag: str | None = None
    output_where: str = ""
    input_source: InputSource | None = None
    output_target: OutputTarget | None = None
    output_user_s3_path: str | None = None
    output_user_cos_path: str | None = None
    max_active: int | None = None
    max_per_minute: int | None = None
    output_expires_after: int | None = None
    request_count: int | None = None


# The fields of `NewBatch` that `_header` derives the header's from, or that are not stored.
_DERIVED = frozenset(
    {
        "batch_id",
        "output_bucket",
        "output_prefix",
        "max_active",
        "max_per_minute",
        "output_expires_after",
        "request_count",
    }
)


def _header(new: NewBatch, created_at: int) -> BatchHeader:
    """The `validating` header of `new`, created at `created_at` (Unix seconds)."""
    settings = get_settings()
    return BatchHeader(
        **new.model_dump(exclude=_DERIVED),
        id=new.batch_id,
        status=BatchStatus.VALIDATING,
        created_at=created_at,
        expires_at=created_at + settings.window_hour_seconds * window_hours(new.completion_window),
        output_bucket=new.output_bucket or settings.bucket_name,
        output_prefix=new.output_prefix or f"batches/{new.batch_id}/",
        output_expires_at=None if new.output_expires_after is None else created_at + new.output_expires_after,
        prepare_queued_at=created_at,  # its prepare message is sent by `create_batch`
        **({} if new.request_count is None else {"request_counts": RequestCounts(total=new.request_count)}),
    )


def create_batch(
    new: NewBatch, *, refuse: Literal["raise", "fail"] = "raise", at: int | None = None
) -> BatchHeader:
    """Store the batch `new` in `validating`, count it against its account and hand it to prepare.

    Idempotent on `new.batch_id`. `refuse` says what a creation over a limit does: `raise`
    `accounts.LimitExceeded` (the API answers 429), or `fail`: store the batch `failed`, not counted
    and never prepared, with one `errors.data` entry naming the limit (inbox uploads: nobody waits
    for an answer; see `pipeline.inbox`). `at` is the creation time (Unix seconds, default now).
    Returns the stored header (the existing one when the batch was created before).
    Raises ValueError for a bad `completion_window`, `accounts.LimitExceeded` over a limit.
    """
    created_at = now() if at is None else at
    header = _header(new, created_at)
    try:
        created = batches.create_limited(
            header, max_active=new.max_active, max_per_minute=new.max_per_minute, at=created_at
        )
    except accounts.LimitExceeded as error:
        if refuse == "raise":
            raise
        batches.put(refused(header, error))  # or it exists already: a repeated event
        created = False
    stored = header.model_copy(update={"active_counted": True}) if created else batches.get(new.batch_id)
    assert stored is not None
    if created:
        ask_prepare(stored, at=created_at, queued=True)
    elif stored.status == BatchStatus.VALIDATING:
        # A repeated create: the first attempt may have died before sending (prepare is idempotent).
        ask_prepare(stored, at=created_at)
    return stored


def ask_prepare(header: BatchHeader, *, at: int, queued: bool = False) -> bool:
    """Send the prepare message of `header`'s batch (in its account's message group), recording first
    that it waits from `at` (Unix seconds: `batches.queue_prepare`; `queued`: the header was written
    with it), so the sweeper never takes a backlog of the prepare queue for a lost message.

    Returns False, sending nothing, when the batch is not `validating`/`in_progress` or a live prepare
    lease holds it (a prepare works on it). Raises what the send raises, the record undone first.
    """
    if not queued and not batches.queue_prepare(header.id, at=at):
        return False
    try:
        sqs.send(
            get_settings().prepare_queue_url,
            [sqs.BatchMessage(batch_id=header.id)],
            group_id=header.account_id,
        )
    except Exception:
        batches.unqueue_prepare(header.id, at=at)  # no message waits: the sweeper may send one
        raise
    return True


def refused(header: BatchHeader, error: accounts.LimitExceeded) -> BatchHeader:
    """`header` ended `failed` at its creation because of `error`: its `errors.data` entry has the
    limit's code (`rate_limit_exceeded` / `active_batch_limit_exceeded`) and says how to run it."""
    remedy = "in a minute" if error.kind == "rate" else "once one has ended or cancel one"
    entry = LineErrorOut(
        code=error.code,
        message=f"{error.reached}: this upload was not run; upload the file again {remedy}.",
    )
    return header.model_copy(
        update={
            "status": BatchStatus.FAILED,
            "failed_at": header.created_at,
            "errors": BatchErrors(data=[entry]),
        }
    )
