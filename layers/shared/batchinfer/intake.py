"""Creating a batch: the one path shared by `POST /v1/batches` and the S3 upload trigger."""

from __future__ import annotations

from typing import Any

from batchinfer import queues, store
from batchinfer.schemas import window_hours
from batchinfer.settings import get_settings
from batchinfer.status import BatchStatus


def create_batch(*, batch_id: str, account_id: str, input_file_id: str, input_bucket: str, input_key: str,
                 endpoint: str, completion_window: str, metadata: dict[str, str] | None = None,
                 name: str | None = None, output_bucket: str | None = None,
                 output_prefix: str | None = None) -> dict[str, Any]:
    """Store a batch in `validating` and hand it to prepare; idempotent on `batch_id`.

    Results go to `output_bucket`/`output_prefix` (default: the service bucket, `batches/<id>/`).
    Returns the stored header item (the existing one when `batch_id` was created before).
    Raises ValueError for a bad `completion_window`.
    """
    settings = get_settings()
    created_at = store.now()
    header = {
        "id": batch_id, "object": "batch", "account_id": account_id, "endpoint": endpoint,
        "input_file_id": input_file_id, "completion_window": completion_window,
        "status": BatchStatus.VALIDATING.value, "created_at": created_at,
        "expires_at": created_at + 3600 * window_hours(completion_window),
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        "metadata": metadata, "name": name, "shards_total": 0, "shards_done": 0,
        "input_bucket": input_bucket, "input_key": input_key,
        "output_bucket": output_bucket or settings.bucket_name,
        "output_prefix": output_prefix or f"batches/{batch_id}/",
    }
    stored = header if store.put_batch(header) else store.get_batch(batch_id)
    assert stored is not None
    if stored["status"] == BatchStatus.VALIDATING:
        # Also on a repeated create: the first attempt may have died before sending (prepare is idempotent).
        queues.send(settings.prepare_queue_url, [queues.BatchMessage(batch_id=batch_id)])
    return stored
