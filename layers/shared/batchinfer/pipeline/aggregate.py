"""The aggregator: merge a batch's shard results into `output.jsonl` and `error.jsonl`, then end it.

Runs when the last shard is done (-> `completed`), when a cancel was asked (-> `cancelled`) or when the
sweeper found the batch past `expires_at` (-> `expired`). It first seals the header (`sealed`), so no
late shard commit can change the counts under it; requests that never ran become error lines with
`batch_cancelled` / `batch_expired`. Safe to run twice or to crash halfway: outputs go to fixed keys
(overwritten), file records are overwritten, and the final status write is conditional.
"""

from __future__ import annotations

from collections.abc import Iterator

from batchinfer.core import chaos, ids
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, files, s3, shards
from batchinfer.data.items import BatchChanges, BatchHeader, FileRecord, Shard
from batchinfer.data.table import now
from batchinfer.pipeline.worker import never_ran, parse_shard
from batchinfer.wire.status import BatchStatus, is_terminal

_NEVER_RAN = {
    BatchStatus.CANCELLED: ("batch_cancelled", "The batch was cancelled before this request ran."),
    BatchStatus.EXPIRED: ("batch_expired", "The batch expired before this request ran."),
}


def _seal(header: BatchHeader) -> BatchHeader | None:
    """Fix the batch's final status and stop shard commits; None if this message has nothing to do."""
    batch_id, status = header.id, header.status
    if status == BatchStatus.FINALIZING or (status == BatchStatus.CANCELLING and header.sealed):
        return header  # a repeated or resumed run
    if status == BatchStatus.CANCELLING:
        return batches.update(
            batch_id,
            BatchChanges(sealed=True, final_status=BatchStatus.CANCELLED),
            status=BatchStatus.CANCELLING,
        )
    if status == BatchStatus.IN_PROGRESS and header.shards_done >= header.shards_total:
        return batches.transition(
            batch_id,
            BatchStatus.FINALIZING,
            all_shards_done=True,
            changes=BatchChanges(sealed=True, final_status=BatchStatus.COMPLETED),
        )
    return None


def _result_parts(bucket: str, shards: list[Shard], errors: bool) -> Iterator[bytes]:
    # Each part holds its successes, then its failures; several parts are fetched at once.
    parts = (part for shard in shards for part in shard.parts)
    return s3.iter_ranges(
        bucket, ((p.key, p.output_bytes, p.bytes) if errors else (p.key, 0, p.output_bytes) for p in parts)
    )


def _never_ran(batch_id: str, bucket: str, shards: list[Shard], final: BatchStatus) -> Iterator[bytes]:
    code, message = _NEVER_RAN[final]
    for shard in shards:
        if shard.next_index < shard.size:
            requests = parse_shard(s3.get_bytes(bucket, shard.input_key))[shard.next_index :]
            yield never_ran(batch_id, requests, code, message)[0]


class _LineCounter:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.lines = chunks, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.lines += chunk.count(b"\n")
            yield chunk


def _write_file(header: BatchHeader, kind: str, chunks: Iterator[bytes]) -> tuple[str | None, int]:
    """Stream one result file and record it; (file id or None when it has no lines, line count)."""
    counter = _LineCounter(chunks)
    bucket, key = header.output_bucket, f"{header.output_prefix}{kind}.jsonl"
    where = header.output_where
    size = s3.upload_stream(bucket, key, iter(counter), where=where)
    if not counter.lines:
        return None, 0
    file_id = ids.result_file_id(header.id, kind)
    files.put(
        FileRecord(
            id=file_id,
            bytes=size,
            created_at=now(),
            filename=f"{header.id}_{kind}.jsonl",
            purpose="batch_output",
            status="processed",
            account_id=header.account_id,
            bucket=bucket,
            key=key,
            where=where,
        )
    )
    return file_id, counter.lines


def finalize_batch(batch_id: str) -> str:
    """Write the result files of a batch and move it to its final status. Returns that status or `skipped`."""
    settings = get_settings()
    header = batches.get(batch_id)
    if header is None or is_terminal(header.status):
        return "skipped"
    sealed = _seal(header)
    if sealed is None:
        logger.info("finalize: nothing to do yet", extra={"batch_id": batch_id, "status": header.status})
        return "skipped"
    final = BatchStatus(sealed.final_status)
    # A batch cancelled while validating never ran: shard items prepare may have written don't count.
    found = list(shards.query(batch_id)) if sealed.in_progress_at else []
    output_id, completed = _write_file(
        sealed, "output", _result_parts(settings.bucket_name, found, errors=False)
    )
    chaos.crash_point("crash_in_aggregator")  # dying halfway: the redelivered message rewrites both files

    def error_chunks() -> Iterator[bytes]:
        if final not in _NEVER_RAN:
            yield from _result_parts(settings.bucket_name, found, errors=True)
            return
        # Input order: each shard's failures, then its requests that never ran, shard by shard.
        for shard in found:
            yield from _result_parts(settings.bucket_name, [shard], errors=True)
            yield from _never_ran(batch_id, settings.bucket_name, [shard], final)

    error_id, failed = _write_file(sealed, "error", error_chunks())
    counts = {"total": completed + failed, "completed": completed, "failed": failed}
    if final == BatchStatus.COMPLETED and counts["total"] != sealed.request_counts.total:
        logger.error("result lines differ from the input's requests", extra={"batch_id": batch_id, **counts})
    done = batches.transition(
        batch_id,
        final,
        changes=BatchChanges(output_file_id=output_id, error_file_id=error_id, request_counts=counts),
    )
    return final.value if done else "skipped"
