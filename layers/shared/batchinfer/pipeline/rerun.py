"""Retrying a batch's failed lines: a new batch from exactly the input lines that did not succeed.

The lines to run again are those whose result is in the ended batch's error file: lines that failed
at the model, and the lines a cancel or an expiry left unrun (the aggregator writes those as
`batch_cancelled` / `batch_expired` error lines). A batch cancelled before it started has no error
file: every input line is retried. The retry is created like any batch (`intake.create_batch`: the
account's limits, the prepare step's validation) with the same endpoint, completion window and
metadata, plus `metadata.retry_of` naming the original.

Idempotent: the retry's batch id and input file id derive from the original's (`ids.retry_batch_id`),
the input file's bytes are the same each time, and the header's creation is a conditional write: a
repeated or concurrent call returns the batch the first one created.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, files, s3
from batchinfer.data.items import BatchHeader, FileRecord
from batchinfer.data.table import now
from batchinfer.pipeline import intake
from batchinfer.pipeline.prepare import input_chunks
from batchinfer.validation.jsonl import iter_physical_lines
from batchinfer.wire.status import BatchStatus

# The metadata key that links a retry to the batch it retries.
RETRY_OF = "retry_of"
MAX_METADATA = 16  # OpenAI's limit of a batch's metadata pairs
# The statuses a batch can be retried from: it ended with results (a `failed` batch never ran: its
# input is invalid, and running it again fails the same way).
RETRYABLE = frozenset({BatchStatus.COMPLETED, BatchStatus.CANCELLED, BatchStatus.EXPIRED})


class NotRetryable(Exception):
    """The batch has nothing to retry (still running, failed validation, or no failed line); the
    message says which and what to do. `code` is the API error code."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _custom_ids(lines: Iterator[bytes]) -> set[str]:
    """The `custom_id`s of JSONL lines (lines without a string one are skipped)."""
    found = set()
    for line in lines:
        custom_id = orjson.loads(line).get("custom_id") if line else None
        if isinstance(custom_id, str):
            found.add(custom_id)
    return found


def failed_ids(header: BatchHeader) -> set[str] | None:
    """The `custom_id`s of the error file of the ended batch `header` (None: the batch never started,
    so every line is to run again; an empty set: no line failed)."""
    if header.in_progress_at is None:
        return None
    if header.error_file_id is None:
        return set()
    key, max_line = f"{header.output_prefix}error.jsonl", get_settings().max_line_bytes
    chunks = s3.iter_chunks(header.output_bucket, key, where=header.output_where)
    # An error line holds at most the error of one request: far below the input's line limit.
    return _custom_ids(line.data for line in iter_physical_lines(chunks, 4 * max_line))


def failed_lines(header: BatchHeader, wanted: set[str] | None) -> tuple[bytes, int]:
    """The input lines of `header` whose `custom_id` is in `wanted` (None: every non-blank line), as
    read (each ends with `\\n`), in input order, and how many."""
    kept, count = bytearray(), 0
    for line in iter_physical_lines(input_chunks(header), get_settings().max_line_bytes):
        if not line.data.strip():
            continue
        if wanted is None or orjson.loads(line.data).get("custom_id") in wanted:
            kept += line.data + b"\n"
            count += 1
    return bytes(kept), count


def _check(header: BatchHeader) -> None:
    metadata = header.metadata or {}
    if len(metadata) >= MAX_METADATA and RETRY_OF not in metadata:
        raise NotRetryable(
            f"Batch {header.id} has {MAX_METADATA} metadata pairs, the most a batch may have: its retry "
            f"could not name it in metadata.{RETRY_OF}.",
            code="metadata_full",
        )
    if header.status not in RETRYABLE:
        if header.status == BatchStatus.FAILED:
            raise NotRetryable(
                f"Batch {header.id} failed before it ran (see its errors): fix its input file and create "
                "a new batch.",
                code="batch_not_retryable",
            )
        raise NotRetryable(
            f"Batch {header.id} is {header.status.value}: its failed lines can be retried once it has ended.",
            code="batch_not_ended",
        )


def _input_file(header: BatchHeader, data: bytes) -> FileRecord:
    """Store the retry's input (the same bytes and id whichever call stores it)."""
    file_id = ids.retry_file_id(header.id)
    record = FileRecord(
        id=file_id,
        bytes=len(data),
        created_at=now(),
        filename=f"{header.id}_retry.jsonl",
        purpose="batch",
        account_id=header.account_id,
        bucket=get_settings().bucket_name,
        key=f"files/{file_id}",
    )
    s3.put_bytes(record.bucket, record.key, data)
    files.put(record)
    return record


def retry_batch(header: BatchHeader, *, max_active: int | None, max_per_minute: int | None) -> BatchHeader:
    """The retry of the ended batch `header`: created now from its failed lines, or the one an earlier
    call created. `max_active` / `max_per_minute` are the account's limits (`intake.NewBatch`).

    Raises `NotRetryable` (not ended, failed validation, no failed line) and what
    `intake.create_batch` raises (`accounts.LimitExceeded` over a limit).
    """
    retry_id = ids.retry_batch_id(header.id)
    if (existing := batches.get(retry_id)) is not None:
        return existing
    _check(header)
    data, count = failed_lines(header, failed_ids(header))
    if not count:
        raise NotRetryable(f"Batch {header.id} has no failed line to retry.", code="nothing_to_retry")
    record = _input_file(header, data)
    new = intake.NewBatch(
        batch_id=retry_id,
        account_id=header.account_id,
        input_file_id=record.id,
        input_bucket=record.bucket,
        input_key=record.key,
        endpoint=header.endpoint,
        completion_window=header.completion_window,
        metadata={**(header.metadata or {}), RETRY_OF: header.id},
        name=header.name,
        max_active=max_active,
        max_per_minute=max_per_minute,
    )
    return intake.create_batch(new)
