"""The sweeper: expiry and recovery of lost steps, run on a schedule.

For every open batch: past `expires_at` -> begin its expiry (`batches.begin_expiry`) and ask the
aggregator to end it, or end a batch still `validating` `expired` at once (no request ran; a prepare
that keeps dying would otherwise be sent again forever, holding one of the account's active slots);
a lost prepare, shard or finalize message (no progress for `stuck_after` seconds) -> send it again.
A prepare is lost only when no prepare works on the batch (no live prepare lease: it renews the lease
while it streams the input, `prepare.prepare_batch`) and no prepare message waits in the queue
(`BatchHeader.prepare_waiting`: sent, not received since, younger than `prepare_wait_seconds`).
A shard is lost only when nobody works on it (no live lease: its worker renews the lease every
third of `shard_lease_seconds` while it works, so a lease is live only if renewed within one lease,
and a crashed worker's shard is free one lease after its last beat) and no message for it waits in the
queue (`Shard.waiting`: sent, not claimed since, younger than `shard_wait_seconds`): a backlog delays
a batch, it never fails one. Every re-sent message is safe to receive twice.

The open batches come from the sparse index `OpenBatches` (`batches.open_headers`): a sweep reads
the open batches and their shards, never a terminal batch nor the rest of the table, so its time
grows with the open batches, not with every batch ever run. Batches written before the index
existed (an upgraded deployment) are put into it by `batches.backfill_open_index`, a scan resumed
over the first sweeps after the upgrade (a bounded number of pages each) and never run again once
it ended; until then such a batch is swept from the sweep that reaches it.
"""

from __future__ import annotations

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, s3, shards, sqs
from batchinfer.data.items import BatchHeader, Shard, leased
from batchinfer.data.table import now
from batchinfer.pipeline import intake
from batchinfer.pipeline.shard.parts import discard, never_ran, write_part
from batchinfer.pipeline.shard.requests import parse_shard
from batchinfer.pipeline.shard.worker import count_commit, finalize_if_last
from batchinfer.wire.status import BatchStatus

# The lease owner of the sweeper's claims (`fail_shard`): not a worker.
SWEEPER_OWNER = "sweeper/"


def sweep() -> dict[str, int]:
    """One pass over the open batches. Returns counts of actions taken, by kind, and `past_window`: the
    open batches found past their `expires_at` (any status; BatchesPastWindowAlarm watches it)."""
    settings = get_settings()
    at = now()
    actions = {"expired": 0, "prepare": 0, "shards": 0, "failed_shards": 0, "finalize": 0, "past_window": 0}
    batches.backfill_open_index()
    for header in batches.open_headers():
        batch_id, status = header.id, header.status
        quiet = at - _last_activity(header) >= settings.stuck_after_seconds
        actions["past_window"] += at >= header.expires_at
        if status == BatchStatus.IN_PROGRESS and at >= header.expires_at:
            # The workers stop within one progress interval; the aggregator seals once they committed.
            if batches.begin_expiry(batch_id, at=at):
                _ask(settings.finalize_queue_url, header)
                actions["expired"] += 1
        elif status == BatchStatus.VALIDATING and at >= header.expires_at:
            actions["expired"] += batches.transition(batch_id, BatchStatus.EXPIRED, at=at) is not None
        elif status == BatchStatus.VALIDATING and quiet:
            # A prepare at work (a live lease) or a message waiting for one (a backlog) is not lost.
            if _prepare_lost(header, at) and intake.ask_prepare(header, at=at):
                actions["prepare"] += 1
        elif status == BatchStatus.IN_PROGRESS and quiet:
            _sweep_running(header, at, actions)
        elif status in (BatchStatus.FINALIZING, BatchStatus.CANCELLING) and quiet:
            _ask(settings.finalize_queue_url, header)
            actions["finalize"] += 1
    return actions


def _last_activity(header: BatchHeader) -> int:
    """Unix seconds of the batch's last step (created, started, progress, finalizing, cancelling)."""
    return max(
        t or 0
        for t in (
            header.created_at,
            header.in_progress_at,
            header.progress_at,
            header.finalizing_at,
            header.cancelling_at,
        )
    )


def _sweep_running(header: BatchHeader, at: int, actions: dict[str, int]) -> None:
    """A running batch quiet for `stuck_after_seconds`: ask for its aggregation once every shard is
    done, else send again what is lost (its prepare, or its shards' messages), counted in `actions`."""
    settings, batch_id = get_settings(), header.id
    if header.shards_done >= header.shards_total:
        _ask(settings.finalize_queue_url, header)
        actions["finalize"] += 1
        return
    if header.prepare_lease_until is not None and _prepare_lost(header, at):
        # Its prepare died before its shard messages were all sent (they look queued): the
        # prepare message sends every pending one again.
        actions["prepare"] += intake.ask_prepare(header, at=at)
        return
    found = list(shards.query(batch_id))
    if any(leased(s.lease_until, at) for s in found if s.state == "pending"):
        return  # a worker renewed its lease within one lease: slow, not stuck
    for shard in found:
        if shard.state != "pending" or shard.waiting(at, settings.shard_wait_seconds):
            continue  # done, or its message waits in the queue (a backlog is not a failure)
        # Its holder died, or its message is gone (e.g. into the DLQ): send it again, or after
        # `max_shard_attempts` re-drives give up on its rest.
        if shards.bump_redrives(batch_id, shard.shard, at=at) > settings.max_shard_attempts:
            fail_shard(
                batch_id,
                shard,
                f"The request was not processed after {settings.max_shard_attempts} re-drives.",
            )
            actions["failed_shards"] += 1
        else:
            message = sqs.ShardMessage(batch_id=batch_id, shard=shard.shard)
            sqs.send(settings.shards_queue_url, [message], group_id=header.account_id)
            actions["shards"] += 1


def _prepare_lost(header: BatchHeader, at: int) -> bool:
    """No prepare works on the batch (no live prepare lease) and no prepare message waits for one."""
    return not header.prepare_leased(at) and not header.prepare_waiting(
        at, get_settings().prepare_wait_seconds
    )


def _ask(queue_url: str, header: BatchHeader) -> None:
    """Send `{"batch_id": ...}` of `header`'s batch to a stage's queue, in its account's message group."""
    sqs.send(queue_url, [sqs.BatchMessage(batch_id=header.id)], group_id=header.account_id)


def fail_shard(batch_id: str, shard: Shard, reason: str) -> bool:
    """Record a shard's unfinished requests as `processing_failed` error lines (its messages keep dying).

    The shard is claimed first, as a worker would, so no worker runs it meanwhile, and its result key
    is its own (`write_part`: a worker paused past its lease can't overwrite it). Returns
    False when a live lease holds it or another attempt committed first (nothing written counts, its
    key is deleted; the sweeper looks again later).
    """
    settings = get_settings()
    owner = f"{SWEEPER_OWNER}{batch_id}/{ids.write_token()}"  # its own: an overlapping sweep's differs
    claimed = shards.claim(batch_id, shard.shard, owner=owner, lease_seconds=settings.shard_lease_seconds)
    if claimed is None:
        return False
    start, size = claimed.next_index, claimed.size
    shard = claimed
    requests = parse_shard(s3.get_bytes(settings.bucket_name, shard.input_key))[start:]
    data, counts = never_ran(batch_id, requests, "processing_failed", reason)
    part = write_part(batch_id, shard.shard, start, size, data, 0, counts)
    # The commit ends the lease (one PUT and one commit: well within it, no heartbeat).
    if not shards.commit(batch_id, shard.shard, part, owner=owner, size=size, **counts):
        shards.release(batch_id, shard.shard, owner=owner)
        discard(part.key)
        return False
    count_commit(counts)
    finalize_if_last(batch_id)
    return True
