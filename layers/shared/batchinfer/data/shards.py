"""Shards (`items.Shard`, keys in `keys`): written once by prepare, leased and committed by the workers.

A shard message may arrive twice, concurrently or after the shard is done: `claim` leases a shard
to one message at a time, its holder `renew`s the short lease while it works (a heartbeat), and
`commit` counts a run of its requests in one transaction with the batch header, guarded by the
shard's owner and `next_index`, so repeated work is never counted twice and a holder that lost its
lease counts nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from batchinfer.data import keys
from batchinfer.data.items import LiveProgress, ResultPart, Shard
from batchinfer.data.table import conditional, handle, items, now, retry_conflicts, transact

# A pending shard no live lease holds (a lease is live until the second `lease_until` has passed).
UNLEASED = "#state = :pending AND (attribute_not_exists(lease_until) OR lease_until < :now)"


def put(batch_id: str, shard: Shard) -> bool:
    """Create a shard item unless it exists: a repeated prepare must not reset a shard that has run.
    Returns False (writing nothing) when it existed."""
    return (
        conditional(
            handle().put_item,
            Item={**keys.shard(batch_id, shard.shard), **shard.stored()},
            ConditionExpression="attribute_not_exists(PK)",
        )
        is not None
    )


def get(batch_id: str, shard_no: int) -> Shard | None:
    """A shard (consistent read), or None."""
    item = handle().get_item(Key=keys.shard(batch_id, shard_no), ConsistentRead=True).get("Item")
    return Shard.model_validate(item) if item else None


def query(batch_id: str) -> Iterator[Shard]:
    """A batch's shards in shard order (consistent reads)."""
    for item in items(
        handle().query,
        KeyConditionExpression="PK = :pk AND begins_with(SK, :shard)",
        ConsistentRead=True,
        ExpressionAttributeValues={":pk": keys.batch_partition(batch_id), ":shard": keys.SHARD_PREFIX},
    ):
        yield Shard.model_validate(item)


def claim(batch_id: str, shard_no: int, *, owner: str, lease_seconds: int) -> Shard | None:
    """Lease a pending shard to `owner` for `lease_seconds` (so one message runs it at a time), counting
    the attempt; the message waiting for it has arrived (`queued_at` removed).

    Returns the shard as leased, or None when it is done or leased by a live owner (a lease is live
    until the second `lease_until` has passed; its holder renews it, `renew`).
    """
    at = now()
    result = conditional(
        handle().update_item,
        Key=keys.shard(batch_id, shard_no),
        UpdateExpression="SET lease_owner = :owner, lease_until = :until, attempts = attempts + :one "
        "REMOVE queued_at",
        ConditionExpression=UNLEASED,
        ExpressionAttributeNames={"#state": "state"},
        ExpressionAttributeValues={
            ":owner": owner,
            ":until": at + lease_seconds,
            ":one": 1,
            ":pending": "pending",
            ":now": at,
        },
        ReturnValues="ALL_NEW",
    )
    return None if result is None else Shard.model_validate(result["Attributes"])


def mark_waiting(batch_id: str, shard_no: int, *, at: int) -> bool:
    """Record that a message for a pending shard that nobody holds waits in the queue again since `at`
    (Unix seconds: `queued_at`, see `Shard.waiting`), counting nothing (no attempt, no re-drive): its
    worker found no free slot of the account's share (`pipeline.shard.worker`). False when the shard is done
    or a live lease holds it (the message is a duplicate: nothing changed)."""
    return (
        conditional(
            handle().update_item,
            Key=keys.shard(batch_id, shard_no),
            UpdateExpression="SET queued_at = :now",
            ConditionExpression=UNLEASED,
            ExpressionAttributeNames={"#state": "state"},
            ExpressionAttributeValues={":now": at, ":pending": "pending"},
        )
        is not None
    )


def renew(batch_id: str, shard_no: int, *, owner: str, lease_seconds: int) -> bool:
    """Extend `owner`'s lease of a pending shard to `lease_seconds` from now (one heartbeat: a
    conditional UpdateItem, 1 WRU). Returns False when `owner` no longer holds it (another message
    claimed it, or `owner` released it or committed its end: a lease given up is never revived).
    Other errors (throttling, 5xx) are raised: the caller tries again at its next beat.
    """
    return (
        conditional(
            handle().update_item,
            Key=keys.shard(batch_id, shard_no),
            UpdateExpression="SET lease_until = :until",
            ConditionExpression="#state = :pending AND lease_owner = :owner "
            "AND attribute_exists(lease_until)",
            ExpressionAttributeNames={"#state": "state"},
            ExpressionAttributeValues={
                ":until": now() + lease_seconds,
                ":pending": "pending",
                ":owner": owner,
            },
        )
        is not None
    )


def release(batch_id: str, shard_no: int, *, owner: str, continuation: bool = False) -> bool:
    """Give up `owner`'s lease early, so the next message can claim the shard at once. A `continuation`
    (the invocation ran short of time, committed what it finished and sends the shard's message
    again) hands its attempt back too and marks that message queued (`queued_at`): only claims whose
    holder died count toward `max_shard_attempts`, so a healthy shard that needs many
    invocations keeps going. Returns False when `owner` does not hold it (nothing changed).
    """
    values: dict[str, Any] = {":owner": owner}
    handed_back = ""
    if continuation:
        handed_back = " SET attempts = attempts - :one, queued_at = :now"
        values |= {":one": 1, ":now": now()}
    return (
        conditional(
            handle().update_item,
            Key=keys.shard(batch_id, shard_no),
            UpdateExpression=f"REMOVE lease_until{handed_back}",
            ConditionExpression="lease_owner = :owner",
            ExpressionAttributeValues=values,
        )
        is not None
    )


def bump_redrives(batch_id: str, shard_no: int, *, at: int) -> int:
    """Count one more re-drive of a stuck shard by the sweeper, whose message is queued at `at` (Unix
    seconds: the sweeper's clock); returns the new count."""
    result = handle().update_item(
        Key=keys.shard(batch_id, shard_no),
        UpdateExpression="ADD redrives :one SET queued_at = :at",
        ExpressionAttributeValues={":one": 1, ":at": at},
        ReturnValues="UPDATED_NEW",
    )
    return int(result["Attributes"]["redrives"])


@retry_conflicts
def commit(
    batch_id: str,
    shard_no: int,
    part: ResultPart,
    *,
    owner: str,
    size: int,
    completed: int,
    failed: int,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int = 0,
    keep_lease: bool = False,
    live_rest: LiveProgress | None = None,
) -> bool:
    """Record requests `[part.start, part.end)` of a shard of `size` requests as done, with their counts
    in the batch header, in one transaction.

    The shard's condition (`state = pending AND lease_owner = owner AND next_index = part.start`) makes
    a repeated commit of the same work fail, so a redelivered message never counts twice, and refuses
    a holder whose lease another message took over (its results are the new holder's to count); the
    header's condition (not sealed)
    keeps a batch that is being finalized from changing under the aggregator. `keep_lease` keeps the
    caller's lease (a checkpoint: it goes on with the shard). Returns False when a condition failed
    (nothing was written: the work is counted already, the lease is another's, or the batch is
    sealed). The same transaction
    moves the shard's live progress into the committed counts: it removes the header's
    `live.<shard_no>`, or sets it to `live_rest` (what the worker had published beyond these counts,
    still shown until its redo is committed). A transaction
    conflict is retried (`table.retry_conflicts`) and raised if it persists, never taken for False.
    """
    done = part.end >= size
    at = now()
    shard_update = _commit_shard_update(
        batch_id,
        shard_no,
        part,
        owner=owner,
        done=done,
        keep_lease=keep_lease,
        at=at,
        completed=completed,
        failed=failed,
    )
    header_update = _commit_header_update(
        batch_id,
        shard_no,
        done=done,
        at=at,
        counts=(completed, failed, input_tokens, output_tokens, cached_tokens),
        live_rest=None if done else live_rest,
    )
    return not transact([{"Update": shard_update}, {"Update": header_update}])


def _commit_shard_update(
    batch_id: str,
    shard_no: int,
    part: ResultPart,
    *,
    owner: str,
    done: bool,
    keep_lease: bool,
    at: int,
    completed: int,
    failed: int,
) -> dict[str, Any]:
    """`commit`'s update of the shard: the part appended, `next_index` moved, guarded by its owner."""
    return {
        "Key": keys.shard(batch_id, shard_no),
        "UpdateExpression": (
            "SET next_index = :end, parts = list_append(parts, :part), #state = :state, "
            "completed = completed + :c, failed = failed + :f, updated_at = :now"
            + ("" if keep_lease else " REMOVE lease_until")
        ),
        "ConditionExpression": "#state = :pending AND lease_owner = :owner AND next_index = :start",
        "ExpressionAttributeNames": {"#state": "state"},
        "ExpressionAttributeValues": {
            ":end": part.end,
            ":part": [part.model_dump(mode="json")],
            ":state": "done" if done else "pending",
            ":c": completed,
            ":f": failed,
            ":now": at,
            ":pending": "pending",
            ":start": part.start,
            ":owner": owner,
        },
    }


def _commit_header_update(
    batch_id: str,
    shard_no: int,
    *,
    done: bool,
    at: int,
    counts: tuple[int, int, int, int, int],
    live_rest: LiveProgress | None,
) -> dict[str, Any]:
    """`commit`'s update of the batch header: `counts` (completed, failed, input, output and cached
    tokens) added, the shard's live progress replaced by `live_rest` (or removed), unless sealed."""
    completed, failed, input_tokens, output_tokens, cached_tokens = counts
    return {
        "Key": keys.batch(batch_id),
        "UpdateExpression": (
            "SET request_counts.completed = request_counts.completed + :c, "
            "request_counts.failed = request_counts.failed + :f, "
            "#usage.input_tokens = #usage.input_tokens + :in, "
            "#usage.output_tokens = #usage.output_tokens + :out, "
            "#usage.total_tokens = #usage.total_tokens + :tot, "
            # A header made before cached tokens were counted has none yet.
            "#usage.cached_tokens = if_not_exists(#usage.cached_tokens, :zero) + :ca, "
            "shards_done = shards_done + :d, progress_at = :now"
            + (", live.#shard = :rest" if live_rest is not None else " REMOVE live.#shard")
        ),
        "ConditionExpression": "attribute_not_exists(sealed)",
        "ExpressionAttributeNames": {"#usage": "usage", "#shard": str(shard_no)},
        "ExpressionAttributeValues": {
            ":c": completed,
            ":f": failed,
            ":in": input_tokens,
            ":out": output_tokens,
            ":tot": input_tokens + output_tokens,
            ":ca": cached_tokens,
            ":zero": 0,
            ":d": 1 if done else 0,
            ":now": at,
            **({":rest": live_rest.model_dump(mode="json")} if live_rest is not None else {}),
        },
    }
