"""The batch table: the one description of its items and the builders of every key (nothing else
writes a key string).

One DynamoDB table (`BatchTable` in template.yaml) holds every item, keyed by `PK` (partition) and
`SK` (sort); the global secondary index `GSI1` (`GSI1PK`, `GSI1SK`, all attributes projected) lists
an account's batches, files and API keys in creation order. The sparse index `OpenBatches`
(`OPENPK`, `OPENSK`, keys only) lists the batches that are not terminal: a batch header carries
`OPENPK`/`OPENSK` from its creation until the one write that makes it terminal removes them, so the
sweeper reads the open batches without reading the table (`batches.open_headers`).

| item             | PK                  | SK              | GSI1PK              | GSI1SK                |
|------------------|---------------------|-----------------|---------------------|-----------------------|
| batch header     | `BATCH#<batch_id>`  | `META`          | `ACCOUNT#<account>` | `<created>#<ns>#<id>` |
| shard            | `BATCH#<batch_id>`  | `SHARD#<00000>` |                     |                       |
| file             | `FILE#<file_id>`    | `META`          | `FILES#<account>`   | `<created>#<ns>#<id>` |
| upload           | `UPLOAD#<id>`       | `META`          |                     |                       |
| file expiry      | `EXPIRIES`          | `<at>#<file_id>`|                     |                       |
| API key          | `KEY#<sha256 hex>`  | `META`          | `KEYS#<account>`    | `<created>#<key_id>`  |
| key id -> key    | `KEYID#<key_id>`    | `META`          |                     |                       |
| account          | `ACCOUNT#<account>` | `META`          |                     |                       |
| active batches   | `ACCOUNT#<account>` | `LIMITS`        |                     |                       |
| storage counter  | `ACCOUNT#<account>` | `STORAGE`       |                     |                       |
| creations/minute | `ACCOUNT#<account>` | `RATE#<minute>` |                     |                       |
| `/v2` slot       | `ACCOUNT#<account>` | `INFER#<0000>`  |                     |                       |
| shard slot       | `ACCOUNT#<account>` | `WORKERS#<0000>`         |             |                       |
| upload part      | `UPLOAD#<id>`       | `PART#<part_id>`|                     |                       |
| upload expiry    | `UPLOAD_EXPIRIES`   | `<at>#<id>`     |                     |                       |
| open backfill    | `SWEEPER`           | `OPEN_BACKFILL` |                     |                       |

An open batch header also has `OPENPK` = `OPEN`, `OPENSK` = `<batch_id>` (index `OpenBatches`).

Models (`items`): batch header `BatchHeader`, shard `Shard`, file `FileRecord`, upload `UploadRecord`,
API key `ApiKey`, key id -> key `KeyPointer`, account settings `Account`, `/v2` and shard slot `Slot`,
upload part `UploadPart`, open backfill `OpenBackfill`.

An upload expiry marks a pending upload whose reservation (`data.storage`) the sweeper gives back once
it expired without being completed or cancelled (`uploads.release_expired`). A file expiry marks a
result file whose batch set `output_expires_after`: `<at>` (10 digits) is when it expires, so the
sweeper reads the due ones in one query of one partition (a marker is written once per result file or
upload, far below a partition's write limit).

`<created>` is the creation time in Unix seconds (10 digits), `<ns>` the write time in nanoseconds
(19 digits: items created in the same second sort in the order they were written), `<minute>` the
Unix second a calendar minute starts at. A batch's shards share its partition, so one query reads
them in shard order. The counters hold `active_batches` (batches counted by
`batches.create_limited` and not yet terminal), `bytes`, `files`, `uploads` (storage, `data.storage`)
and `creates` plus `ttl` (DynamoDB's time to live
removes a minute's counter an hour after it). A `/v2` slot is one request in flight of the account
(`data.inflight`), held until `lease_until`; `ttl` removes it later. A shard slot is one shard worker
of the account running on `<model>` (`pipeline.shard.worker`, `AccountShardShare`), the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Key = dict[str, str]

META = "META"
LIMITS = "LIMITS"
STORAGE = "STORAGE"
BATCH_PREFIX = "BATCH#"
SHARD_PREFIX = "SHARD#"
INFER_SLOT_PREFIX = "INFER#"
# Per account, whatever the model (earlier `SHARDS#<model>#` items were per model: their TTL ends them).
SHARD_SLOT_PREFIX = "WORKERS#"
PART_PREFIX = "PART#"
INDEX_ATTRIBUTES = ("PK", "SK", "GSI1PK", "GSI1SK")


def batch_partition(batch_id: str) -> str:
    """The partition of a batch: its header and its shards."""
    return f"{BATCH_PREFIX}{batch_id}"


def batch(batch_id: str) -> Key:
    """The key of a batch header."""
    return {"PK": batch_partition(batch_id), "SK": META}


def shard(batch_id: str, shard_no: int) -> Key:
    """The key of shard `shard_no` (0-based) of a batch."""
    return {"PK": batch_partition(batch_id), "SK": f"{SHARD_PREFIX}{shard_no:05d}"}


def file(file_id: str) -> Key:
    """The key of a file record."""
    return {"PK": f"FILE#{file_id}", "SK": META}


def upload(upload_id: str) -> Key:
    """The key of an upload record."""
    return {"PK": f"UPLOAD#{upload_id}", "SK": META}


EXPIRIES = "EXPIRIES"


def file_expiry(at: int, file_id: str) -> Key:
    """The key of the marker of a file that expires at `at` (Unix seconds)."""
    return {"PK": EXPIRIES, "SK": f"{at:010d}#{file_id}"}


UPLOAD_EXPIRIES = "UPLOAD_EXPIRIES"


def upload_expiry(at: int, upload_id: str) -> Key:
    """The key of the marker of a pending upload expiring at `at` (Unix seconds)."""
    return {"PK": UPLOAD_EXPIRIES, "SK": f"{at:010d}#{upload_id}"}


def api_key(key_hash: str) -> Key:
    """The key of an API key, by the SHA-256 (hex) of its secret."""
    return {"PK": f"KEY#{key_hash}", "SK": META}


def key_pointer(key_id: str) -> Key:
    """The key of the item that leads from a key id (`key_...`) to its key's hash."""
    return {"PK": f"KEYID#{key_id}", "SK": META}


def account_partition(account_id: str) -> str:
    """The partition of an account's items (settings, counters)."""
    return f"ACCOUNT#{account_id}"


def account(account_id: str) -> Key:
    """The key of an account's settings."""
    return {"PK": account_partition(account_id), "SK": META}


def active_counter(account_id: str) -> Key:
    """The key of an account's counter of active (counted, not terminal) batches."""
    return {"PK": account_partition(account_id), "SK": LIMITS}


def storage_counter(account_id: str) -> Key:
    """The key of an account's storage counter (`data.storage`)."""
    return {"PK": account_partition(account_id), "SK": STORAGE}


def rate_counter(account_id: str, minute: int) -> Key:
    """The key of an account's counter of batch creations in the calendar minute starting at `minute`."""
    return {"PK": account_partition(account_id), "SK": f"RATE#{minute}"}


@dataclass(frozen=True, slots=True)
class Slots:
    """A set of numbered slots (`data.inflight`): the items of `partition` whose sort key is `prefix`
    and a 4-digit slot number."""

    partition: str
    prefix: str

    def key(self, slot: int) -> Key:
        """The key of slot number `slot` (0-based)."""
        return {"PK": self.partition, "SK": f"{self.prefix}{slot:04d}"}

    def number(self, sort_key: str) -> int | None:
        """The slot number of a sort key under `prefix`, or None when it is another set's (a model
        whose name extends this one's past a `#`)."""
        rest = sort_key.removeprefix(self.prefix)
        return int(rest) if len(rest) == 4 and rest.isdigit() else None


def infer_slots(account_id: str) -> Slots:
    """An account's `/v2` in-flight slots."""
    return Slots(account_partition(account_id), INFER_SLOT_PREFIX)


def infer_slot(account_id: str, slot: int) -> Key:
    """The key of an account's `/v2` in-flight slot number `slot` (0-based)."""
    return infer_slots(account_id).key(slot)


def shard_slots(account_id: str) -> Slots:
    """An account's shard-worker slots, on every model together (one per shard running at once)."""
    return Slots(account_partition(account_id), SHARD_SLOT_PREFIX)


def upload_part(upload_id: str, part_id: str) -> Key:
    """The key of a part of an upload (in the upload's partition)."""
    return {"PK": f"UPLOAD#{upload_id}", "SK": f"{PART_PREFIX}{part_id}"}


def open_backfill() -> Key:
    """The key of the sweeper's progress in putting batches written before `OpenBatches` into it."""
    return {"PK": "SWEEPER", "SK": "OPEN_BACKFILL"}


# ---- OpenBatches (sparse) ---------------------------------------------------------------------------

OPEN_INDEX = "OpenBatches"
OPEN = "OPEN"
OPEN_ATTRIBUTES = ("OPENPK", "OPENSK")


def open_batch(batch_id: str) -> dict[str, str]:
    """The `OpenBatches` attributes of an open batch header. One partition (`OPEN`): it is written only
    when a batch is created or ends, far below a partition's 1,000 writes a second."""
    return {"OPENPK": OPEN, "OPENSK": batch_id}


def open_batch_id(entry: Mapping[str, Any]) -> str:
    """The batch id of an `OpenBatches` entry (a query answer's item: the index and table keys)."""
    return str(entry["OPENSK"])


# ---- GSI1 -------------------------------------------------------------------------------------------


def account_batches(account_id: str) -> str:
    """The GSI1 partition of an account's batch headers."""
    return account_partition(account_id)


def account_files(account_id: str) -> str:
    """The GSI1 partition of an account's files."""
    return f"FILES#{account_id}"


def account_keys(account_id: str) -> str:
    """The GSI1 partition of an account's API keys."""
    return f"KEYS#{account_id}"


def creation_order(created_at: int, item_id: str) -> str:
    """The GSI1 sort key of a batch or file: creation second, then the write time in nanoseconds (ties
    within a second sort in the order they were written, also across a second's rollover), then the id."""
    return f"{created_at:010d}#{time.time_ns():019d}#{item_id}"


def key_order(created_at: int, key_id: str) -> str:
    """The GSI1 sort key of an API key: creation second, then the key id."""
    return f"{created_at:010d}#{key_id}"


def indexed(key: Key, partition: str, order: str) -> dict[str, str]:
    """A table key with its GSI1 attributes, to store with the item."""
    return {**key, "GSI1PK": partition, "GSI1SK": order}


def index_position(item: Mapping[str, Any]) -> dict[str, Any]:
    """The `ExclusiveStartKey` of a GSI1 query that goes on after stored `item` (table and index keys)."""
    return {name: item[name] for name in INDEX_ATTRIBUTES}
