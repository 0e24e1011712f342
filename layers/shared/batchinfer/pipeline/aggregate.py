"""The aggregator: merge a batch's shard results into `output.jsonl` and `error.jsonl`, then end it.

Runs when the last shard is done (-> `completed`), when a cancel was asked (-> `cancelled`) or when
the batch is past `expires_at` (-> `expired`). A cancelled or expiring batch is ended only once no
live lease holds a shard (its workers stop launching requests within one progress interval, let
those at the model finish within the grace and commit; `settle`; a lease is live while its worker
renews it, so a crashed worker's lease holds its shard at most `shard_lease_seconds` after its last
beat), or once `settle_deadline` passed: until then it stays `cancelling` (or `finalizing`) and the
aggregator looks again every `WAIT_SECONDS`. Then it seals the header (`sealed`), so no late shard
commit can change the counts under it; requests that never ran become error lines with
`batch_cancelled` / `batch_expired` (`shard.progress.ENDINGS`). Safe to run twice or to crash halfway:
outputs go to fixed keys (overwritten), file records are overwritten, and the final status write is
conditional.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from botocore.exceptions import BotoCoreError, ClientError

from batchinfer.core import chaos, ids
from batchinfer.core.observability import logger
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, files, s3, shards, sqs
from batchinfer.data.items import BatchChanges, BatchHeader, FileRecord, Shard
from batchinfer.data.locations import located
from batchinfer.data.table import now
from batchinfer.pipeline.shard.parts import discard, never_ran, recover_part
from batchinfer.pipeline.shard.progress import ENDINGS
from batchinfer.pipeline.shard.requests import parse_shard
from batchinfer.wire.status import BatchStatus, is_terminal

# The lease owner of the aggregator's own claims (`settle`): not a worker.
AGGREGATOR_OWNER = "aggregator/"
# How long an ending batch waits between looks at its shards' leases (SQS DelaySeconds).
WAIT_SECONDS = 2
# Beyond the grace and two progress intervals (the workers' delay in seeing the end): their commits.
SETTLE_MARGIN_SECONDS = 15
# The S3 calls that write a result file (s3transfer: one PUT, or a multipart upload).
WRITE_OPERATIONS = frozenset({"PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"})
# Storage errors that pass (S3's throttling and 5xx): never counted as a failed finalize.
TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "InternalError", "ServiceUnavailable", "RequestTimeout"}
)


def settle_deadline(header: BatchHeader) -> int:
    """Unix time after which an ending batch (`cancelling`, or `finalizing` toward `expired`) is sealed
    even if a live lease still holds a shard: from when the end was asked, the workers' grace
    (`cancel_grace_seconds`), two `progress_seconds` for them to see it and `SETTLE_MARGIN_SECONDS`."""
    settings = get_settings()
    began = header.cancelling_at if header.status == BatchStatus.CANCELLING else header.finalizing_at
    wait = settings.cancel_grace_seconds + 2 * settings.progress_seconds + SETTLE_MARGIN_SECONDS
    return (began or now()) + math.ceil(wait)


def settle(header: BatchHeader) -> set[int]:
    """For an ending batch: commit the part files that crashed workers wrote but did not commit (as a
    worker's retry would), and return the shards a live lease still holds (their workers are still
    finishing their requests in flight: nothing they answer is thrown away if the batch waits).

    Each pending shard is claimed first (`shards.claim`), so no worker runs it meanwhile; a claim that
    fails means a live lease (or the shard was just committed: it is looked at again next time).
    """
    leased: set[int] = set()
    owner = f"{AGGREGATOR_OWNER}{header.id}/{ids.write_token()}"  # its own: another run's differs
    for shard in shards.query(header.id):
        if shard.state != "pending":
            continue
        claimed = shards.claim(
            header.id, shard.shard, owner=owner, lease_seconds=get_settings().shard_lease_seconds
        )
        if claimed is None:
            leased.add(shard.shard)
            continue
        found = recover_part(header.id, shard.shard, claimed.next_index)
        if found and shards.commit(
            header.id, shard.shard, found.part, owner=owner, size=claimed.size, **found.counts
        ):
            discard(found.source)
            continue  # the commit removed the lease
        shards.release(header.id, shard.shard, owner=owner)
        if found:
            discard(found.part.key)
    return leased


def _seal(header: BatchHeader) -> BatchHeader | None:
    """Fix the batch's final status and stop shard commits; None if this message has nothing to do."""
    batch_id, status = header.id, header.status
    if header.sealed and status in (BatchStatus.FINALIZING, BatchStatus.CANCELLING):
        return header  # a repeated or resumed run
    if status in (BatchStatus.CANCELLING, BatchStatus.FINALIZING):  # cancelled, or expiring
        final = BatchStatus.CANCELLED if status == BatchStatus.CANCELLING else header.final_status
        return batches.update(batch_id, BatchChanges(sealed=True, final_status=final), status=status)
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
    """Error lines for the requests no commit covers: the ending's `never_ran` line, or its `cut` line
    for a shard a live lease still held when the batch was sealed (its worker was past the grace)."""
    ending, at = ENDINGS[final], now()
    for shard in shards:
        if shard.next_index < shard.size:
            # A worker's lease still live (not another aggregator run's claim): it was past the grace.
            owner = shard.lease_owner or ""
            held = (shard.lease_until or 0) >= at and not owner.startswith(AGGREGATOR_OWNER)
            code, message = (ending.cut_code, ending.cut_message) if held else (ending.code, ending.message)
            requests = parse_shard(s3.get_bytes(bucket, shard.input_key))[shard.next_index :]
            yield never_ran(batch_id, requests, code, message)[0]


class SourceUnreadable(RuntimeError):
    """A network-level failure reading the batch's own parts (not writing its results): never counted
    toward `max_finalize_attempts`; the run fails and is tried again."""


def _read(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """`chunks`, a network-level failure of their reads raised as SourceUnreadable."""
    try:
        yield from chunks
    except BotoCoreError as error:
        raise SourceUnreadable(f"the batch's parts could not be read: {type(error).__name__}") from error


class _LineCounter:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.lines = chunks, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.lines += chunk.count(b"\n")
            yield chunk


def _write_file(header: BatchHeader, kind: str, chunks: Iterator[bytes]) -> tuple[str | None, int]:
    """Stream one result file and record it; (file id, line count), or (None, 0) when it would have no
    lines: then no object is written (OpenAI leaves `error_file_id` null, and writes no error file,
    when no request failed)."""
    chunks = _read(iter(chunks))
    first = next((chunk for chunk in chunks if chunk), b"")
    if not first:
        return None, 0
    counter = _LineCounter(itertools.chain([first], chunks))
    bucket, key = header.output_bucket, f"{header.output_prefix}{kind}.jsonl"
    where = header.output_where
    size = s3.upload_stream(bucket, key, iter(counter), where=where)
    file_id = ids.result_file_id(header.id, kind)
    record = FileRecord(
        id=file_id,
        bytes=size,
        created_at=now(),
        filename=f"{header.id}_{kind}.jsonl",
        purpose="batch_output",
        status="processed",
        expires_at=header.output_expires_at,
        account_id=header.account_id,
        bucket=bucket,
        key=key,
        where=where,
    )
    if record.expires_at is not None:
        files.schedule_expiry(record)  # before the record: a file that can expire is never left unscheduled
    files.put(record)
    return file_id, counter.lines


def _unwritable(header: BatchHeader, error: ClientError | BotoCoreError) -> str | None:
    """After the result files could not be written: count it (`finalize_failures`) when the output
    location refused the write (not our own bucket's reads, not throttling or a 5xx) or could not be
    reached at all (a `BotoCoreError`: endpoint, DNS, TLS, e.g. a COS endpoint that is gone); at the
    `max_finalize_attempts`-th, end the batch (`failed`, or `cancelled` for a cancel: the status machine
    allows no other) with an `output_write_failed` entry in `errors.data` and return that status.
    None: let the run fail, to be tried again (else `finalizing` would have no way out)."""
    if isinstance(error, BotoCoreError):
        code = type(error).__name__
    else:
        code = error.response.get("Error", {}).get("Code", "")
        if error.operation_name not in WRITE_OPERATIONS or code in TRANSIENT_CODES:
            return None
    attempts = batches.bump_finalize_failures(header.id)
    logger.warning(
        "finalize: the result files could not be written",
        extra={"batch_id": header.id, "code": code, "attempts": attempts},
    )
    limit = get_settings().max_finalize_attempts
    if attempts < limit:
        return None
    where = located(header.output_where, header.output_bucket, header.output_prefix).uri()
    entry = {
        "code": "output_write_failed",
        "message": f"The batch's results could not be written to {where} in {limit} attempts ({code}): "
        "check that the location exists and that batchinfer may write to it.",
        "param": None,
        "line": None,
    }
    final = BatchStatus.CANCELLED if header.status == BatchStatus.CANCELLING else BatchStatus.FAILED
    done = batches.transition(
        header.id, final, changes=BatchChanges(errors={"object": "list", "data": [entry]})
    )
    return final.value if done else "skipped"


def finalize_batch(batch_id: str) -> str:
    """Write the result files of a batch and move it to its final status. Returns that status,
    `waiting` (an ending batch whose workers still hold leases: asked again in `WAIT_SECONDS`, until
    `settle_deadline`) or `skipped`."""
    settings = get_settings()
    header = batches.get(batch_id)
    if header is None or is_terminal(header.status):
        return "skipped"
    ending = header.status in (BatchStatus.CANCELLING, BatchStatus.FINALIZING) and not header.sealed
    if ending and header.in_progress_at and settle(header) and now() < settle_deadline(header):
        # Workers still finish their requests in flight: look again shortly (`cancelling` lasts).
        sqs.send(
            settings.finalize_queue_url,
            [sqs.BatchMessage(batch_id=batch_id)],
            group_id=header.account_id,
            delay_seconds=WAIT_SECONDS,
        )
        return "waiting"
    sealed = _seal(header)
    if sealed is None:
        logger.info("finalize: nothing to do yet", extra={"batch_id": batch_id, "status": header.status})
        return "skipped"
    final = BatchStatus(sealed.final_status)
    # A batch cancelled while validating never ran: shard items prepare may have written don't count.
    found = list(shards.query(batch_id)) if sealed.in_progress_at else []

    def error_chunks() -> Iterator[bytes]:
        if final not in ENDINGS:
            yield from _result_parts(settings.bucket_name, found, errors=True)
            return
        # Input order: each shard's failures, then its requests that never ran, shard by shard.
        for shard in found:
            yield from _result_parts(settings.bucket_name, [shard], errors=True)
            yield from _never_ran(batch_id, settings.bucket_name, [shard], final)

    try:
        output_id, completed = _write_file(
            sealed, "output", _result_parts(settings.bucket_name, found, errors=False)
        )
        chaos.crash_point("crash_in_aggregator")  # dying halfway: the redelivered message rewrites both files
        error_id, failed = _write_file(sealed, "error", error_chunks())
    except (ClientError, BotoCoreError) as error:
        ended = _unwritable(sealed, error)
        if ended is None:
            raise  # SQS redelivers; the sweeper re-sends a lost finalize
        return ended
    counts = {"total": completed + failed, "completed": completed, "failed": failed}
    if final == BatchStatus.COMPLETED and counts["total"] != sealed.request_counts.total:
        logger.error("result lines differ from the input's requests", extra={"batch_id": batch_id, **counts})
    done = batches.transition(
        batch_id,
        final,
        changes=BatchChanges(output_file_id=output_id, error_file_id=error_id, request_counts=counts),
    )
    return final.value if done else "skipped"
