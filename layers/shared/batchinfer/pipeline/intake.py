"""Creating a batch: the one path shared by `POST /v1/batches` and the S3 upload trigger."""

from __future__ import annotations

from typing import Any

from batchinfer.data import sqs, store
from batchinfer.wire.openai import window_hours
from batchinfer.core.settings import get_settings
from batchinfer.wire.status import BatchStatus


def create_batch(*, batch_id: str, account_id: str, input_file_id: str, input_bucket: str, input_key: str,
                 endpoint: str, completion_window: str, metadata: dict[str, str] | None = None,
                 name: str | None = None, output_bucket: str | None = None,
                 output_prefix: str | None = None, input_where: str = "", output_where: str = "",
                 fields: dict[str, Any] | None = None, max_active: int | None = None,
                 max_per_minute: int | None = None, at: int | None = None) -> dict[str, Any]:
    """Store a batch in `validating`, count it against its account and hand it to prepare.

    Idempotent on `batch_id`. Results go to `output_bucket`/`output_prefix` (default: the service
    bucket, `batches/<id>/`); `input_where`/`output_where` say which storage holds those buckets
    (`batchinfer.data.locations`). `fields` are more public attributes for the header (TokenHub fields).
    `max_active` / `max_per_minute` are the account's limits (None: counted, never refused).
    `at` is the creation time (Unix seconds, default now).
    Returns the stored header item (the existing one when `batch_id` was created before).
    Raises ValueError for a bad `completion_window`, `store.LimitExceeded` over a limit.
    """
    settings = get_settings()
    created_at = store.now() if at is None else at
    header = {
        "id": batch_id, "object": "batch", "account_id": account_id, "endpoint": endpoint,
        "input_file_id": input_file_id, "completion_window": completion_window,
        "status": BatchStatus.VALIDATING.value, "created_at": created_at,
        "expires_at": created_at + 3600 * window_hours(completion_window),
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        "metadata": metadata, "name": name, "shards_total": 0, "shards_done": 0,
        "input_bucket": input_bucket, "input_key": input_key, "input_where": input_where,
        "output_bucket": output_bucket or settings.bucket_name,
        "output_prefix": output_prefix or f"batches/{batch_id}/", "output_where": output_where,
        **(fields or {}),
    }
    created = store.create_batch_limited(header, max_active=max_active, max_per_minute=max_per_minute,
                                         at=created_at)
    stored = header if created else store.get_batch(batch_id)
    assert stored is not None
    if stored["status"] == BatchStatus.VALIDATING:
        # Also on a repeated create: the first attempt may have died before sending (prepare is idempotent).
        sqs.send(settings.prepare_queue_url, [sqs.BatchMessage(batch_id=batch_id)])
    return stored
