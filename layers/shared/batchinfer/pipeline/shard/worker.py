"""The shard flow (`process_shard`): a slot of the account's share, the shard's lease, its windows
run and committed part by part, and then a continuation, the batch's end, or its aggregation."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from enum import StrEnum

from aws_lambda_powertools.metrics import MetricUnit

from batchinfer.backends import chaos as backend_chaos
from batchinfer.backends import load_registry
from batchinfer.backends.base import ChatBackend
from batchinfer.backends.http import closing
from batchinfer.core import chaos
from batchinfer.core.observability import logger, metrics
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, inflight, keys, s3, shards, sqs
from batchinfer.data.items import BatchHeader, ResultPart, Shard
from batchinfer.data.table import now
from batchinfer.endpoints.registry import endpoint_for
from batchinfer.pipeline.lease import LeaseHeartbeat
from batchinfer.pipeline.shard.limits import concurrency_for
from batchinfer.pipeline.shard.parts import Recovered, discard, never_ran, recover_part, render, write_part
from batchinfer.pipeline.shard.progress import Ending, ProgressLink, ending_of
from batchinfer.pipeline.shard.requests import parse_shard
from batchinfer.pipeline.shard.window import Window, WindowRun
from batchinfer.wire.status import BatchStatus

# One loop per process: backends may keep connection pools bound to it across invocations.
_LOOP = asyncio.new_event_loop()
# A shard slot's lease beyond the invocation's remaining time (a crashed worker's slot is free then).
SLOT_MARGIN_S = 60
# How long a shard whose account holds all its slots waits before its message is received again.
SLOT_WAIT_SECONDS = 5
# The metrics of a committed part: (metric name, count).
_COMMIT_METRICS = (
    ("RequestsCompleted", "completed"),
    ("RequestsFailed", "failed"),
    ("InputTokens", "input_tokens"),
    ("OutputTokens", "output_tokens"),
    ("CachedTokens", "cached_tokens"),
)


class ShardResult(StrEnum):
    """What `process_shard` did with a shard message (logged, and asserted by tests)."""

    DONE = "done"
    CONTINUED = "continued"
    DUPLICATE = "duplicate"
    STOPPED = "stopped"
    CONFLICT = "conflict"
    LOST = "lost"
    WAITING = "waiting"


def for_endpoint(backend: ChatBackend, endpoint: str) -> ChatBackend:
    """What answers the request bodies of a batch with `endpoint` on `backend`: its endpoint's server
    (`batchinfer.endpoints.base.Endpoint.server`; a chat backend is its own)."""
    return endpoint_for(endpoint).server(backend)


def process_shard(message: sqs.ShardMessage, *, owner: str, time_left_ms: Callable[[], int]) -> ShardResult:
    """Run (the rest of) one shard. Returns what happened, for logs and tests:

    `done` (shard finished), `continued` (time ran short: a continuation was enqueued), `duplicate`
    (done already or leased by another message), `stopped` (batch not running, or it was cancelled or
    expired while this shard ran: what finished is committed), `conflict` (the commit's condition
    failed: another attempt counted this work, or took the lease), `lost` (another message took the
    lease while this one worked, e.g. it was paused past it: it stopped launching requests, wrote and
    committed nothing more, and left the shard to its new holder), `waiting` (the account's shards
    hold every slot of its share of the model's workers: the message comes back in
    `SLOT_WAIT_SECONDS`, nothing counted, the backend not called).

    One account's shards run at most `settings.account_shard_slots` at once, on all models together
    (`AccountShardShare` of `MaxShardWorkers`; slots of `data.inflight`, taken before the claim and
    held for the invocation), so one account's backlog never holds every worker, however many models
    it uses.

    The lease lasts `shard_lease_seconds` and is renewed every third of it while the worker works
    (`LeaseHeartbeat`), so a live worker keeps its shard however long it runs, and a crashed one's
    shard can be claimed one lease after its last beat.

    While requests run, the worker publishes its uncommitted progress every `progress_seconds` and
    learns from the same write whether the batch is ending (`ProgressLink`, `WindowRun`): then it
    launches nothing more, gives the requests at the model `cancel_grace_seconds`, and commits.

    Progress is committed every `checkpoint_seconds`, so a crash re-sends to the model at most the
    requests since the last checkpoint; results written by an attempt that died before its commit
    are copied to its own key and committed, not run again. A shard claimed more than
    `max_shard_attempts` times (it keeps killing its worker; a continuation hands its claim back) has
    its remaining requests written as `processing_failed` errors.
    """
    settings = get_settings()
    batch_id = message.batch_id
    header = batches.get(batch_id)
    if header is None or header.status != BatchStatus.IN_PROGRESS or header.sealed:
        return ShardResult.STOPPED
    ending = ending_of(header, now())
    if ending is not None:  # past expires_at, before the sweeper saw it
        _end_early(header, ending)
        return ShardResult.STOPPED
    share = settings.account_shard_slots
    if share is None:
        return _run_shard(message, header, owner=owner, time_left_ms=time_left_ms)
    slots = keys.shard_slots(header.account_id)
    try:
        slot = inflight.acquire(
            slots, limit=share, owner=owner, lease_s=time_left_ms() // 1000 + SLOT_MARGIN_S
        )
    except inflight.NoSlot:
        return _wait_for_slot(message, header)
    try:
        return _run_shard(message, header, owner=owner, time_left_ms=time_left_ms)
    finally:
        inflight.release(slots, slot, owner=owner)


def _wait_for_slot(message: sqs.ShardMessage, header: BatchHeader) -> ShardResult:
    """The account's shards hold every slot of its share on the model: send the message again, received
    in `SLOT_WAIT_SECONDS`, and mark the shard waiting (`shards.mark_waiting`: no attempt, no re-drive,
    so the sweeper sees a queued message, not a stuck shard: a backlog delays a batch, it never
    fails one).

    A new message rather than the same one with a shorter visibility timeout: every receive counts
    toward the queue's maxReceiveCount (5), and a shard that waits its turn must never reach the DLQ.
    Returns `waiting`, or `duplicate` when the shard is done or a live lease holds it (nothing sent)."""
    if not shards.mark_waiting(message.batch_id, message.shard, at=now()):
        return ShardResult.DUPLICATE
    sqs.send(
        get_settings().shards_queue_url,
        [message],
        group_id=header.account_id,
        delay_seconds=SLOT_WAIT_SECONDS,
    )
    metrics.add_metric(name="ShardSlotWaits", unit=MetricUnit.Count, value=1)
    return ShardResult.WAITING


def _run_shard(
    message: sqs.ShardMessage, header: BatchHeader, *, owner: str, time_left_ms: Callable[[], int]
) -> ShardResult:
    """`process_shard` from the claim on (the account's slot, if bounded, is held)."""
    settings = get_settings()
    batch_id, shard_no = message.batch_id, message.shard
    lease_seconds = settings.shard_lease_seconds
    shard = shards.claim(batch_id, shard_no, owner=owner, lease_seconds=lease_seconds)
    if shard is None:
        return ShardResult.DUPLICATE
    link = ProgressLink(batch_id, shard_no, shard.next_index, header.live.get(str(shard_no)), header.live)
    renew = functools.partial(shards.renew, batch_id, shard_no, owner=owner, lease_seconds=lease_seconds)
    with LeaseHeartbeat(renew, lease_seconds, batch_id=batch_id, shard=shard_no) as lease:
        run = _ShardRun(message, header, shard, link, lease, owner=owner, time_left_ms=time_left_ms)
        if not run.commit_parts():
            return ShardResult.CONFLICT
    return run.finish()


class _ShardRun:
    """One claimed shard, its lease held (`lease`): its requests from `next_index` on, run and committed
    part by part (`commit_parts`), then what becomes of the message (`finish`)."""

    def __init__(
        self,
        message: sqs.ShardMessage,
        header: BatchHeader,
        shard: Shard,
        link: ProgressLink,
        lease: LeaseHeartbeat,
        *,
        owner: str,
        time_left_ms: Callable[[], int],
    ) -> None:
        self.settings = get_settings()
        self.message, self.header, self.shard, self.link, self.lease = message, header, shard, link, lease
        self.owner, self.time_left_ms = owner, time_left_ms
        self.batch_id, self.shard_no = message.batch_id, message.shard
        self.start, self.size = shard.next_index, shard.size
        self.requests = parse_shard(s3.get_bytes(self.settings.bucket_name, shard.input_key))
        self.endpoint = endpoint_for(header.endpoint)
        self.backend = backend_chaos.wrap(
            self.endpoint.server(load_registry(self.settings.model_registry).backend(header.model))
        )

    def commit_parts(self) -> bool:
        """Run and commit parts until the shard is done, the batch ends, time runs short or the lease is
        lost; a part an earlier attempt wrote and never committed is recovered first. False when a
        commit's condition failed (`conflict`: nothing more is done)."""
        recover = self.shard.attempts > 1
        while self.start < self.size:
            found = recover_part(self.batch_id, self.shard_no, self.start) if recover else None
            recover = False
            made = (found.part, found.counts) if found else self._new_part()
            if made is None:
                break
            if not self._commit(*made, found):
                return False
            if self.link.ending is not None or self.time_left_ms() < self.settings.time_reserve_ms:
                break
        return True

    def _new_part(self) -> tuple[ResultPart, dict[str, int]] | None:
        """The next part written (a window's answers, or the rest as `processing_failed` lines once the
        shard has had its attempts), or None: nothing to commit (no answer, or the lease lost)."""
        batch_id, shard_no, start, settings = self.batch_id, self.shard_no, self.start, self.settings
        if self.shard.attempts > settings.max_shard_attempts:
            data, counts = never_ran(
                batch_id,
                self.requests[start:],
                "processing_failed",
                f"The request could not be processed after {settings.max_shard_attempts} attempts.",
            )
            if not self.lease.held():
                return None
            return write_part(batch_id, shard_no, start, self.size, data, 0, counts), counts
        window = self._run_window()
        # An ending batch keeps every answer; what never reached the model is not run again.
        outcomes = window.ended() if window.ending else window.prefix()
        # The result key is the new holder's once the lease is lost: no PUT.
        if not outcomes or not self.lease.held():
            return None
        data, output_bytes, counts = render(batch_id, outcomes, self.endpoint)
        part = write_part(batch_id, shard_no, start, start + len(outcomes), data, output_bytes, counts)
        return part, counts

    def _run_window(self) -> Window:
        """One window of the requests from `start`, until the next checkpoint at most."""
        settings, time_left_ms = self.settings, self.time_left_ms
        checkpoint_at = time.monotonic() + settings.checkpoint_seconds

        def window_left() -> int:
            return min(
                time_left_ms(), int((checkpoint_at - time.monotonic()) * 1000) + settings.time_reserve_ms
            )

        run = WindowRun(
            self.backend,
            self.requests[self.start :],
            self.batch_id,
            endpoint=self.endpoint,
            concurrency=concurrency_for(self.backend, settings.worker_concurrency),
            time_left_ms=window_left,
            reserve_ms=settings.time_reserve_ms,
            link=self.link,
            progress_seconds=settings.progress_seconds,
            grace_seconds=settings.cancel_grace_seconds,
            deadline_ms=time_left_ms,
            lost=lambda: self.lease.lost,
        )
        return _LOOP.run_until_complete(closing(run.run()))

    def _commit(self, part: ResultPart, counts: dict[str, int], found: Recovered | None) -> bool:
        """Commit `part`; False (its key discarded, the lease given up) when the condition failed."""
        batch_id, shard_no, owner, size, link = self.batch_id, self.shard_no, self.owner, self.size, self.link
        chaos.crash_point("crash_before_commit")
        rest = link.rest_after(counts, part.end) if part.end < size else None
        # An ending batch: the commit gives the lease up, so the aggregator need not wait for it.
        keep = link.ending is None
        if not keep or part.end >= size:
            self.lease.stop()  # the commit ends the lease: no beat after it
        if not shards.commit(
            batch_id, shard_no, part, owner=owner, size=size, keep_lease=keep, live_rest=rest, **counts
        ):
            logger.info(
                "shard commit condition failed: counted by another attempt, or the lease was taken",
                extra={"batch_id": batch_id, "shard": shard_no},
            )
            self.lease.stop()
            shards.release(batch_id, shard_no, owner=owner)  # nobody need wait for this lease
            discard(part.key)  # no commit names it
            return False
        if found:
            discard(found.source)
        link.committed(counts, part.end)
        count_commit(counts)
        chaos.crash_point("crash_after_commit")
        self.start = part.end
        return True

    def finish(self) -> ShardResult:
        """After the parts (the lease no longer beating): what becomes of the shard's message."""
        batch_id, shard_no, owner = self.batch_id, self.shard_no, self.owner
        if self.lease.lost:
            logger.info(
                "shard lease lost: left to its new holder", extra={"batch_id": batch_id, "shard": shard_no}
            )
            return ShardResult.LOST
        if self.start < self.size and self.link.ending is not None:
            shards.release(batch_id, shard_no, owner=owner)
            _end_early(self.header, self.link.ending)
            return ShardResult.STOPPED
        if self.start < self.size:
            # Sent only while this message still held the shard: else its new holder has a message.
            if not shards.release(batch_id, shard_no, owner=owner, continuation=True):
                return ShardResult.LOST
            sqs.send(self.settings.shards_queue_url, [self.message], group_id=self.header.account_id)
            metrics.add_metric(name="Continuations", unit=MetricUnit.Count, value=1)
            return ShardResult.CONTINUED
        finalize_if_last(batch_id)
        return ShardResult.DONE


def count_commit(counts: dict[str, int]) -> None:
    """Metrics of one committed part (counted once: only the commit that won its condition)."""
    for name, key in _COMMIT_METRICS:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=counts.get(key, 0))


def _end_early(header: BatchHeader, ending: Ending) -> None:
    """After a worker stopped for `ending`: an expiry it found itself (`expires_at` passed) is begun
    here (`batches.begin_expiry`) and handed to the aggregator; a cancel was handed over by the API."""
    if ending.status == BatchStatus.EXPIRED and batches.begin_expiry(header.id):
        sqs.send(
            get_settings().finalize_queue_url,
            [sqs.BatchMessage(batch_id=header.id)],
            group_id=header.account_id,
        )


def finalize_if_last(batch_id: str) -> None:
    """After a shard is done: the commit that completed the last shard asks for aggregation."""
    after = batches.get(batch_id)
    if after and after.shards_done >= after.shards_total:
        sqs.send(
            get_settings().finalize_queue_url,
            [sqs.BatchMessage(batch_id=batch_id)],
            group_id=after.account_id,
        )
