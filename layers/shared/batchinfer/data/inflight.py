"""Bounds across every Lambda environment, as leased slots: an account's `/v2` requests in flight
(`keys.infer_slots`, infer.app) and an account's shard workers running at once, on any model
(`keys.shard_slots`, pipeline.shard.worker: `AccountShardShare`).

A set of slots (`keys.Slots`) bounded to N at once has N slot items (numbers 0..N-1; an item exists
once its slot was first taken). A request takes a slot with one conditional write that
succeeds only if the slot is free (no item) or its lease ended (`lease_until < now`), and gives it
back with a delete conditional on being its `owner`. So:

- the bound holds under any concurrency: two environments can't both win the same conditional write,
  and only N slot numbers exist;
- a crashed or timed-out environment leaks its slot only until its lease ends (the function's
  remaining time plus a margin), never forever: no counter to drift, no reset to run;
- a request whose lease ended is not cut short: its slot may be taken by another, and its release
  then deletes nothing (the owner differs).

Chosen over a counter (`ADD n :one` with a condition): a counter needs the same lease per request to
be repaired after a crash, so it would store the leases anyway. Cost: one consistent Query of the
set's slots (to find the free ones without trying each), one conditional PutItem, one conditional
DeleteItem per holder (a request, a shard invocation). DynamoDB's TTL (`ttl`) removes long-expired
slots, e.g. the numbers above a lowered bound. No library implements leases on DynamoDB's conditions for this
(Powertools' Idempotency locks one key per request, not N per account), hence this module.
The holder of a slot is a request or an invocation, so the lease is its function's remaining time
plus a margin: no renewal needed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

from boto3.dynamodb.conditions import Key

from batchinfer.data.items import Slot
from batchinfer.data.keys import Slots
from batchinfer.data.table import Table, conditional, handle, now

# A slot item is kept this long past its lease (DynamoDB TTL deletes within days anyway).
SLOT_TTL_S = 3600


class NoSlot(Exception):
    """Every one of the `limit` slots is leased: the caller must wait (`/v2`: HTTP 429; a shard: its
    message comes back later)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} slots leased")
        self.limit = limit


def _leased(slots: Slots, table: Table) -> set[int]:
    """The slot numbers whose lease has not ended (consistent read)."""
    at = now()
    found = table.query(
        KeyConditionExpression=Key("PK").eq(slots.partition) & Key("SK").begins_with(slots.prefix),
        ConsistentRead=True,
    )["Items"]
    numbers = {slots.number(item["SK"]): int(item.get("lease_until", 0)) for item in found}
    return {number for number, until in numbers.items() if number is not None and until >= at}


def acquire(slots: Slots, *, limit: int, owner: str, lease_s: int, table: Table | None = None) -> int:
    """Take one of the `limit` slots of `slots` for `lease_s` seconds; returns its number (0-based).

    `owner` identifies the holder (a request id, a shard invocation). Free slots are tried in random
    order, so concurrent holders rarely race for the same one; a lost race tries the next. Raises
    `NoSlot` when all `limit` are leased.
    """
    table = handle(table)
    leased = _leased(slots, table)  # one query, not one per slot number
    free = [slot for slot in range(limit) if slot not in leased]
    random.shuffle(free)
    for slot in free:
        at = now()
        item = Slot(owner=owner, lease_until=at + lease_s, ttl=at + lease_s + SLOT_TTL_S)
        if (
            conditional(
                table.put_item,
                Item={**slots.key(slot), **item.stored()},
                ConditionExpression="attribute_not_exists(PK) OR lease_until < :now",
                ExpressionAttributeValues={":now": at},
            )
            is not None
        ):
            return slot
    raise NoSlot(limit)


def release(slots: Slots, slot: int, *, owner: str, table: Table | None = None) -> bool:
    """Give back slot `slot` if `owner` still holds it; True when it was deleted (False: its lease
    ended and another holder took it, or it was released already)."""
    return (
        conditional(
            handle(table).delete_item,
            Key=slots.key(slot),
            ConditionExpression="#owner = :owner",
            ExpressionAttributeNames={"#owner": "owner"},
            ExpressionAttributeValues={":owner": owner},
        )
        is not None
    )


@contextmanager
def holding(slots: Slots, *, limit: int, owner: str, lease_s: int) -> Iterator[int]:
    """Hold a slot of `slots` (see `acquire`, which raises `NoSlot`) while the block runs; released
    after it, whatever the block raised."""
    slot = acquire(slots, limit=limit, owner=owner, lease_s=lease_s)
    try:
        yield slot
    finally:
        release(slots, slot, owner=owner)
