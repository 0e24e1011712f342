"""Prepare: stream a batch's input from S3, validate every line, write shards, start the batch.

Memory stays flat whatever the file size: lines are read as they stream in and each shard is
written as soon as it is full. Idempotent: shard files and items have deterministic keys, the
`validating -> in_progress` write is conditional, and a repeated message for a running batch only
re-sends the messages of shards that are still pending (duplicates are harmless to the worker).
"""

from __future__ import annotations

from collections.abc import Iterator

from botocore.exceptions import ClientError

from batchinfer.backends import load_registry
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, s3, shards, sqs
from batchinfer.data.items import BatchChanges, Shard
from batchinfer.data.table import now
from batchinfer.validation.file import FileValidator
from batchinfer.validation.jsonl import PhysicalLineReader, iter_physical_lines
from batchinfer.wire.status import BatchStatus


def _fail(batch_id: str, errors: list[dict]) -> str:
    batches.transition(
        batch_id, BatchStatus.FAILED, changes=BatchChanges(errors={"object": "list", "data": errors})
    )
    return "failed"


def shard_lines(
    lines: PhysicalLineReader, validator: FileValidator, shard_size: int
) -> Iterator[tuple[int, int, bytes]]:
    """Validate every line and group the valid requests into shard files as the lines stream by.

    Yields `(first line, requests, shard bytes)` for each shard of `shard_size` requests (the last
    one may be smaller); a shard's lines are `<line>\\t<request JSON>\\n`, the request's bytes as
    read (the worker parses them once). Calls `validator.finish` at the end. Once the file has
    failed, only its errors are collected and no shard is yielded any more: the caller checks
    `validator.error_count` after the iteration and discards what it wrote.
    """
    feed = validator.feed
    buffer: list[bytes] = []
    first_line = 0
    for line in lines:
        request = feed(line)
        if request is None or validator.error_count:
            continue  # once the file has failed, only collect its errors
        if not buffer:
            first_line = request.line
        buffer.append(b"%d\t%s\n" % (request.line, line.data))
        if len(buffer) == shard_size:
            data = b"".join(buffer)
            buffer.clear()
            yield first_line, shard_size, data
    validator.finish(lines.bytes_read)
    if buffer and not validator.error_count:
        yield first_line, len(buffer), b"".join(buffer)


def prepare_batch(batch_id: str) -> str:
    """Validate and shard one batch. Returns `in_progress`, `failed`, `resent` or `skipped`."""
    settings = get_settings()
    header = batches.get(batch_id)
    if header is None:
        logger.warning("prepare: no such batch", extra={"batch_id": batch_id})
        return "skipped"
    if header.status == BatchStatus.IN_PROGRESS:
        pending = [
            sqs.ShardMessage(batch_id=batch_id, shard=s.shard)
            for s in shards.query(batch_id)
            if s.state == "pending"
        ]
        sqs.send(settings.shards_queue_url, pending, group_id=header.account_id)
        return "resent"
    if header.status != BatchStatus.VALIDATING:
        return "skipped"

    registry = load_registry(settings.model_registry)
    validator = FileValidator(
        header.endpoint,
        registry.__contains__,
        max_requests=settings.max_requests_per_file,
        max_file_bytes=settings.max_file_bytes,
        max_line_bytes=settings.max_line_bytes,
        max_errors=settings.max_line_errors,
        model_names=registry.names(),
        max_error_bytes=settings.max_errors_bytes,
    )
    written: list[Shard] = []
    # Stops reading past max_file_bytes: the validator reports file_too_large from the byte count.
    source = s3.iter_chunks(
        header.input_bucket,
        header.input_key,
        where=header.input_where,
        version_id=header.input_version_id,
        if_match=header.input_etag,
    )
    lines = iter_physical_lines(source, settings.max_line_bytes, max_total_bytes=settings.max_file_bytes)
    try:
        for first_line, size, data in shard_lines(lines, validator, settings.shard_size):
            key = s3.shard_key(batch_id, len(written))
            s3.put_bytes(settings.bucket_name, key, data)
            written.append(Shard(shard=len(written), size=size, first_line=first_line, input_key=key))
    except ClientError as error:
        code = error.response["Error"]["Code"]
        message = (
            f"the input file changed after the upload that started this batch ({code}): "
            "its new upload starts a batch of its own"
            if code == "PreconditionFailed"
            else f"the input file could not be read ({code})"
        )
        return _fail(
            batch_id,
            [{"code": "input_file_unavailable", "line": None, "param": "input_file_id", "message": message}],
        )
    if validator.error_count:
        return _fail(batch_id, [e.model_dump() for e in validator.errors])
    queued_at = now()  # their messages are sent below: each waits in the queue until its claim
    for shard in written:
        shards.put(batch_id, shard.model_copy(update={"queued_at": queued_at}))
    started = batches.transition(
        batch_id,
        BatchStatus.IN_PROGRESS,
        changes=BatchChanges(
            shards_total=len(written),
            model=validator.model,
            request_counts={"total": validator.request_count, "completed": 0, "failed": 0},
        ),
    )
    if started is None:
        return "skipped"  # cancelled meanwhile, or another prepare got there first
    messages = [sqs.ShardMessage(batch_id=batch_id, shard=s.shard) for s in written]
    sqs.send(settings.shards_queue_url, messages, group_id=header.account_id)
    return "in_progress"
