"""Identifiers in the OpenAI shapes (`batch_...`, `file-...`, `batch_req_...`).

Ids derived from a natural key (an S3 object, a batch's output) are deterministic, so a retried step
writes the same item instead of a second one.
"""

from __future__ import annotations

import hashlib
import secrets


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]


def new_batch_id() -> str:
    """A fresh batch id, e.g. `batch_6f1c...` (24 hex chars)."""
    return f"batch_{secrets.token_hex(12)}"


def new_file_id() -> str:
    """A fresh file id, e.g. `file-6f1c...`."""
    return f"file-{secrets.token_hex(12)}"


def write_token() -> str:
    """A fresh token for one write of a shard's results (`data.s3.result_key`) or one claim of a
    shard by the sweeper or the aggregator: 16 hex chars."""
    return secrets.token_hex(8)


def batch_id_for_object(bucket: str, key: str, version: str) -> str:
    """The batch id of an uploaded object: the same object event always names the same batch."""
    return f"batch_{_digest('s3', bucket, key, version)}"


def result_file_id(batch_id: str, kind: str) -> str:
    """The file id of a batch's `output` or `error` file (deterministic, so re-aggregation overwrites)."""
    return f"file-{_digest(batch_id, kind)}"


def request_id(batch_id: str, line: int) -> str:
    """The `id` of a result line (`batch_req_...`), stable for a (batch, input line)."""
    return f"batch_req_{_digest(batch_id, str(line))}"


def idempotent_batch_id(account_id: str, idempotency_key: str) -> str:
    """The batch id of a create carrying an `Idempotency-Key` header (scoped to the account)."""
    return f"batch_{_digest('idempotency', account_id, idempotency_key)}"


def idempotent_file_id(account_id: str, idempotency_key: str) -> str:
    """The file id of an upload carrying an `Idempotency-Key` header (scoped to the account)."""
    return f"file-{_digest('idempotency', 'file', account_id, idempotency_key)}"


def retry_batch_id(batch_id: str) -> str:
    """The id of the batch that retries `batch_id`'s failed lines: one retry per batch, so a repeated
    `POST /v1/batches/{id}/retry` names the batch the first call created."""
    return f"batch_{_digest('retry', batch_id)}"


def retry_file_id(batch_id: str) -> str:
    """The file id of the input of `batch_id`'s retry (its failed lines; deterministic, see
    `retry_batch_id`)."""
    return f"file-{_digest('retry', 'file', batch_id)}"
