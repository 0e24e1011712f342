"""Prepare: stream a batch's input from S3, validate every line, write shards, start the batch.

Memory stays flat whatever the file size: lines are read as they stream in and each shard is
written as soon as it is full. Idempotent: shard files and items have deterministic keys, the
`validating -> in_progress` write is conditional, and a repeated message for a running batch only
re-sends the messages of pending shards that nobody works on and whose message does not wait
(duplicates are harmless to the worker). One prepare at a time works on a batch: it holds the batch's
prepare lease (`prepare_batch`), and a message that finds it held is `busy`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from botocore.exceptions import ClientError

from batchinfer.backends import load_registry
from batchinfer.core import ids
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, s3, shards, sqs
from batchinfer.data.items import BatchChanges, BatchHeader, Shard, leased
from batchinfer.data.table import now
from batchinfer.pipeline.lease import LeaseHeartbeat
from batchinfer.validation.file import FileValidator
from batchinfer.validation.jsonl import PhysicalLineReader, iter_physical_lines
from batchinfer.wire.status import BatchStatus

# A shard also ends once its requests reach this many bytes (one line over at most), so a shard
# worker's memory stays bounded whatever the lines' size (5,000 lines of up to 1 MB would not fit a
# 3,008 MB worker; a full shard parses in about 560 MB).
MAX_SHARD_BYTES = 128 * 1024 * 1024


def _fail(batch_id: str, errors: list[dict], owner: str) -> str:
    batches.transition(
        batch_id,
        BatchStatus.FAILED,
        changes=BatchChanges(errors={"object": "list", "data": errors}),
        prepare_owner=owner,
    )
    return "failed"


def shard_lines(
    lines: PhysicalLineReader,
    validator: FileValidator,
    shard_size: Callable[[str | None], int],
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Iterator[tuple[int, int, bytes]]:
    """Validate every line and group the valid requests into shard files as the lines stream by.

    Yields `(first line, requests, shard bytes)` for each shard of `shard_size(model)` requests (the
    file's model, `validator.model`, asked at its first valid request), or fewer once its request bytes
    reach `max_shard_bytes` (the last one may be smaller). A shard's lines are `<line>\\t<request
    JSON>\\n`, the request's bytes as read (the worker parses them once). Calls `validator.finish` at
    the end. Once the file has failed, only its errors are collected and no shard is yielded any more:
    the caller checks `validator.error_count` after the iteration and discards what it wrote.
    """
    feed = validator.feed
    buffer: list[bytes] = []
    first_line = size = held = 0
    for line in lines:
        request = feed(line)
        if request is None or validator.error_count:
            continue  # once the file has failed, only collect its errors
        if not size:
            size = shard_size(validator.model)
        if not buffer:
            first_line = request.line
        buffer.append(b"%d\t%s\n" % (request.line, line.data))
        held += len(buffer[-1])
        if len(buffer) == size or held >= max_shard_bytes:
            data = b"".join(buffer)
            yield first_line, len(buffer), data
            buffer.clear()
            held = 0
    validator.finish(lines.bytes_read)
    if buffer and not validator.error_count:
        yield first_line, len(buffer), b"".join(buffer)


def prepare_batch(batch_id: str) -> str:
    """Validate and shard one batch, holding its prepare lease (one prepare at a time: a long input
    is never prepared twice at once). Returns what happened:
    `in_progress` (started), `failed` (the input is bad or unreadable), `resent` (the batch was
    running already: the shard messages that are lost were sent again), `busy` (another prepare holds
    a live lease of the batch: it is alive and does the work, so this message is done), `lost` (the
    lease was taken over while this prepare streamed: it stopped and wrote no status) or `skipped` (no
    such batch, or past `in_progress`).

    The lease (`batches.claim_prepare`) lasts `prepare_lease_seconds` and is renewed every third of it
    while prepare works (`LeaseHeartbeat`), so a 20,000-line input streamed for minutes is never
    prepared twice at once, and the sweeper sends no prepare message while it runs. It is released once
    the shard messages are sent; a prepare that fails lapses it at once, and one that dies leaves it
    to lapse: the next prepare then knows the shard messages may be unsent.
    """
    settings = get_settings()
    header = batches.get(batch_id)
    if header is None:
        logger.warning("prepare: no such batch", extra={"batch_id": batch_id})
        return "skipped"
    if header.status not in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
        return "skipped"
    owner, lease_seconds = ids.write_token(), settings.prepare_lease_seconds
    before = batches.claim_prepare(batch_id, owner=owner, lease_seconds=lease_seconds)
    if before is None:
        # A live prepare holds it (its message was received: none waits any more), or it moved on.
        return "busy" if batches.unqueue_prepare(batch_id) else "skipped"
    renew = functools.partial(batches.renew_prepare, batch_id, owner=owner, lease_seconds=lease_seconds)
    finished = False
    try:
        with LeaseHeartbeat(renew, lease_seconds, batch_id=batch_id, stage="prepare") as lease:
            if before.status == BatchStatus.IN_PROGRESS:
                # The last prepare's lease still present: it died before its shard messages were all sent.
                outcome = _resend(before, every_pending=before.prepare_lease_until is not None)
            else:
                outcome = _prepare(before, owner, lease)
        finished = True
        return outcome
    finally:
        batches.release_prepare(batch_id, owner=owner, finished=finished)


def _resend(header: BatchHeader, *, every_pending: bool) -> str:
    """Send again the messages of a running batch's pending shards that no live lease holds and, unless
    `every_pending`, whose message does not wait in the queue (`Shard.waiting`): a shard waiting in a
    backlog is not lost. Each is marked waiting first (`shards.mark_waiting`)."""
    settings, at = get_settings(), now()
    lost = [
        sqs.ShardMessage(batch_id=header.id, shard=s.shard)
        for s in shards.query(header.id)
        if s.state == "pending"
        and not leased(s.lease_until, at)
        and (every_pending or not s.waiting(at, settings.shard_wait_seconds))
        and shards.mark_waiting(header.id, s.shard, at=at)
    ]
    sqs.send(settings.shards_queue_url, lost, group_id=header.account_id)
    return "resent"


def _prepare(header: BatchHeader, owner: str, lease: LeaseHeartbeat) -> str:
    """Stream, validate and shard a `validating` batch whose prepare lease `owner` holds; start it and
    send its shard messages, or fail it. `lost` when the lease was taken over meanwhile."""
    validator = file_validator(header.endpoint)
    try:
        written = _write_shards(header, validator, lease)
    except ClientError as error:
        return _fail(header.id, [_unreadable(error)], owner)
    if written is None or not lease.held():
        return "lost"  # another prepare streams it now
    if validator.error_count:
        return _fail(header.id, [e.model_dump() for e in validator.errors], owner)
    return _start(header, owner, validator, written)


def file_validator(endpoint: str) -> FileValidator:
    """A validator of an input file for `endpoint`, with the limits of the settings and the registry's
    models (a batch's prepare, and its dry run)."""
    settings = get_settings()
    registry = load_registry(settings.model_registry)
    return FileValidator(
        endpoint,
        registry.__contains__,
        max_requests=settings.max_requests_per_file,
        max_file_bytes=settings.max_file_bytes,
        max_line_bytes=settings.max_line_bytes,
        max_errors=settings.max_line_errors,
        model_names=registry.names(),
        max_error_bytes=settings.max_errors_bytes,
        serves=registry.serves,
    )


def _write_shards(header: BatchHeader, validator: FileValidator, lease: LeaseHeartbeat) -> list[Shard] | None:
    """Stream `header`'s input through `validator` and write its shard files as they fill up: the shards
    written (not stored yet), or None once the lease was lost. Raises `ClientError` when the input
    can't be read (gone, changed since its upload)."""
    settings, batch_id = get_settings(), header.id
    written: list[Shard] = []
    # Stops reading past max_file_bytes: the validator reports file_too_large from the byte count.
    source = input_chunks(header)
    lines = iter_physical_lines(source, settings.max_line_bytes, max_total_bytes=settings.max_file_bytes)
    registry = load_registry(settings.model_registry)

    def shard_size(model: str | None) -> int:  # a valid request's model is known
        return settings.shard_size_for(model is None or registry.in_process(model))

    for first_line, size, data in shard_lines(lines, validator, shard_size):
        if lease.lost:
            return None
        key = s3.shard_key(batch_id, len(written))
        s3.put_bytes(settings.bucket_name, key, data)
        written.append(Shard(shard=len(written), size=size, first_line=first_line, input_key=key))
    return written


def input_chunks(header: BatchHeader) -> Iterator[bytes]:
    """The bytes of `header`'s input file in chunks, the version its batch was created from (inbox
    uploads: `input_version_id` / `input_etag`). Raises `ClientError` when it can't be read."""
    return s3.iter_chunks(
        header.input_bucket,
        header.input_key,
        where=header.input_where,
        version_id=header.input_version_id,
        if_match=header.input_etag,
    )


def _unreadable(error: ClientError) -> dict:
    """The batch's error when its input file could not be read."""
    code = error.response["Error"]["Code"]
    message = (
        f"the input file changed after the upload that started this batch ({code}): "
        "its new upload starts a batch of its own"
        if code == "PreconditionFailed"
        else f"the input file could not be read ({code})"
    )
    return {"code": "input_file_unavailable", "line": None, "param": "input_file_id", "message": message}


def _start(header: BatchHeader, owner: str, validator: FileValidator, written: list[Shard]) -> str:
    """Store the shards, start the batch (`in_progress`) and send their messages; `skipped` when the
    batch was cancelled meanwhile, or another prepare took the lease over."""
    settings, batch_id = get_settings(), header.id
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
        prepare_owner=owner,
    )
    if started is None:
        return "skipped"  # cancelled meanwhile, or another prepare took the lease over
    messages = [sqs.ShardMessage(batch_id=batch_id, shard=s.shard) for s in written]
    sqs.send(settings.shards_queue_url, messages, group_id=header.account_id)
    return "in_progress"
