"""DynamoDB data access: batch headers, shards and files in one table (see DESIGN.md).

| item   | PK             | SK             |
|--------|----------------|----------------|
| batch  | `BATCH#<id>`   | `META`         |
| shard  | `BATCH#<id>`   | `SHARD#<00000>`|
| file   | `FILE#<id>`    | `META`         |
| upload | `UPLOAD#<id>`  | `META`         |
| account counters | `ACCOUNT#<id>` | `LIMITS` (active batches), `RATE#<minute>` (creations) |

GSI1 (`GSI1PK = ACCOUNT#<account>` / `FILES#<account>`, `GSI1SK = <created_at>#<nanoseconds>#<id>`) lists an
account's batches and files in creation order (the nanoseconds order what one second created).
Every status change is an `update_item` whose condition lists the allowed source statuses
(`status.allowed_sources`); a failed condition is reported as `None`/`False`, never raised.

Batches created through `create_batch_limited` are counted in their account's active-batch counter
(`active_counted` on the header); the one write that makes such a batch terminal decrements it in the
same transaction, so the counter is exact under concurrent creates and transitions.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from batchinfer.core.aws import table
from batchinfer.wire.status import TIMESTAMP_FIELD, BatchStatus, allowed_sources, is_terminal

META = "META"


def now() -> int:
    """Current Unix time in seconds."""
    return int(time.time())


def sort_key(created_at: int, item_id: str) -> str:
    """The GSI1 sort key of a batch or file: creation second, then the write time in nanoseconds (ties
    within a second sort in the order they were written, also across a second's rollover), then the id."""
    return f"{created_at:010d}#{time.time_ns():019d}#{item_id}"


def batch_pk(batch_id: str) -> str:
    return f"BATCH#{batch_id}"


def shard_sk(shard: int) -> str:
    return f"SHARD#{shard:05d}"


def plain(value: Any) -> Any:
    """DynamoDB values with `Decimal` turned back into `int`/`float` (recursively)."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _condition_failed(error: ClientError) -> bool:
    return error.response["Error"]["Code"] in ("ConditionalCheckFailedException", "TransactionCanceledException")


# ---- batches -------------------------------------------------------------------------------------

def put_batch(item: dict[str, Any]) -> bool:
    """Store a new batch header (`item` holds the Batch fields plus internal ones).

    Returns False when a batch with that id exists already (idempotent create).
    """
    record = {"PK": batch_pk(item["id"]), "SK": META, "GSI1PK": f"ACCOUNT#{item['account_id']}",
              "GSI1SK": sort_key(item["created_at"], item["id"]), **item}
    try:
        table().put_item(Item=record, ConditionExpression="attribute_not_exists(PK)")
    except ClientError as error:
        if _condition_failed(error):
            return False
        raise
    return True


def get_batch(batch_id: str, *, consistent: bool = True) -> dict[str, Any] | None:
    """The batch header item, or None."""
    item = table().get_item(Key={"PK": batch_pk(batch_id), "SK": META}, ConsistentRead=consistent).get("Item")
    return plain(item) if item else None


def transition(batch_id: str, target: BatchStatus, *, sets: dict[str, Any] | None = None,
               condition: str | None = None, values: dict[str, Any] | None = None,
               at: int | None = None) -> dict[str, Any] | None:
    """Move a batch to `target` if its status is an allowed source (and `condition` holds).

    `sets` are extra attributes to SET; `condition`/`values` an extra ConditionExpression and its
    `:placeholders`. Stamps the status's timestamp field (`in_progress_at`, ...). Returns the new item,
    or None when the condition failed (a concurrent or repeated step: a no-op, not an error).
    A terminal `target` of a counted batch also decrements its account's active-batch counter, in the
    same transaction (only one write can make a batch terminal, so it is decremented exactly once).
    """
    sets = dict(sets or {})
    sets[TIMESTAMP_FIELD[target]] = at if at is not None else now()
    names = {"#status": "status"}
    vals: dict[str, Any] = {":target": target.value}
    assignments = ["#status = :target"]
    for i, (name, value) in enumerate(sets.items()):
        names[f"#a{i}"] = name
        vals[f":a{i}"] = value
        assignments.append(f"#a{i} = :a{i}")
    sources = sorted(allowed_sources(target))
    for i, source in enumerate(sources):
        vals[f":s{i}"] = source.value
    cond = f"#status IN ({', '.join(f':s{i}' for i in range(len(sources)))})"
    if condition:
        cond = f"({cond}) AND ({condition})"
        vals.update(values or {})
    if is_terminal(target):
        header = get_batch(batch_id)
        if header is not None and header.get("active_counted"):
            update = {"TableName": table().name, "Key": {"PK": batch_pk(batch_id), "SK": META},
                      "UpdateExpression": "SET " + ", ".join(assignments), "ConditionExpression": cond,
                      "ExpressionAttributeNames": names, "ExpressionAttributeValues": vals}
            return _transition_counted(batch_id, header["account_id"], update)
    try:
        result = table().update_item(
            Key={"PK": batch_pk(batch_id), "SK": META}, UpdateExpression="SET " + ", ".join(assignments),
            ConditionExpression=cond, ExpressionAttributeNames=names, ExpressionAttributeValues=vals,
            ReturnValues="ALL_NEW")
    except ClientError as error:
        if _condition_failed(error):
            return None
        raise
    return plain(result["Attributes"])


class _Conflict(Exception):
    """A transaction cancelled by a concurrent one (`TransactionConflict`): safe to retry."""


def _reasons(error: ClientError) -> list[str]:
    return [r.get("Code") or "None" for r in error.response.get("CancellationReasons") or []]


# Transactions on a hot item (the account counters) can be cancelled by concurrent ones; DynamoDB
# advises retrying them with backoff:
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html
_retry_conflicts = retry(retry=retry_if_exception_type(_Conflict), stop=stop_after_attempt(10),
                         wait=wait_random_exponential(multiplier=0.02, max=1.0), reraise=True)


@_retry_conflicts
def _transition_counted(batch_id: str, account_id: str, update: dict[str, Any]) -> dict[str, Any] | None:
    decrement = {"TableName": update["TableName"], "Key": {"PK": account_pk(account_id), "SK": LIMITS_SK},
                 "UpdateExpression": "ADD active_batches :minus", "ExpressionAttributeValues": {":minus": -1}}
    try:
        table().meta.client.transact_write_items(TransactItems=[{"Update": update}, {"Update": decrement}])
    except ClientError as error:
        if error.response["Error"]["Code"] != "TransactionCanceledException":
            raise
        if "TransactionConflict" in _reasons(error):
            raise _Conflict() from error
        return None
    return get_batch(batch_id)


def account_pk(account_id: str) -> str:
    """The partition of an account's items (settings, counters)."""
    return f"ACCOUNT#{account_id}"


LIMITS_SK = "LIMITS"


class LimitExceeded(Exception):
    """A batch creation over an account limit: `kind` is `active` (batches not yet terminal) or `rate`
    (creations in this calendar minute); `limit` the limit; `retry_after` seconds worth waiting."""

    def __init__(self, kind: str, limit: int, retry_after: int) -> None:
        super().__init__(f"{kind} limit {limit} reached")
        self.kind, self.limit, self.retry_after = kind, limit, retry_after


# An active-batch limit frees up when some batch ends; there is no telling when, so suggest a poll.
ACTIVE_RETRY_AFTER_S = 30


@_retry_conflicts
def create_batch_limited(item: dict[str, Any], *, max_active: int | None, max_per_minute: int | None,
                         at: int | None = None) -> bool:
    """Store a new batch header and count it against its account, in one transaction.

    The header (with `active_counted`) is written only if the account has fewer than `max_active`
    counted batches that are not terminal and fewer than `max_per_minute` creations in the calendar
    minute of `at` (Unix seconds, default now); None skips that check (inbox uploads are counted but
    never refused). Returns False, writing nothing, when the batch exists already (idempotent create).
    Raises `LimitExceeded` when a limit is reached.
    """
    at = now() if at is None else at
    account = account_pk(item["account_id"])
    record = {"PK": batch_pk(item["id"]), "SK": META, "GSI1PK": account,
              "GSI1SK": sort_key(item["created_at"], item["id"]), **item, "active_counted": True}
    name = table().name
    active: dict[str, Any] = {"TableName": name, "Key": {"PK": account, "SK": LIMITS_SK},
                              "UpdateExpression": "ADD active_batches :one",
                              "ExpressionAttributeValues": {":one": 1}}
    if max_active is not None:
        active["ConditionExpression"] = "attribute_not_exists(active_batches) OR active_batches < :max"
        active["ExpressionAttributeValues"][":max"] = max_active
    items = [{"Put": {"TableName": name, "Item": record, "ConditionExpression": "attribute_not_exists(PK)"}},
             {"Update": active}]
    minute = at - at % 60
    if max_per_minute is not None:
        items.append({"Update": {
            "TableName": name, "Key": {"PK": account, "SK": f"RATE#{minute}"},
            "UpdateExpression": "ADD creates :one SET #ttl = :ttl",
            "ExpressionAttributeNames": {"#ttl": "ttl"},
            "ConditionExpression": "attribute_not_exists(creates) OR creates < :max",
            "ExpressionAttributeValues": {":one": 1, ":max": max_per_minute, ":ttl": minute + 3600}}})
    try:
        table().meta.client.transact_write_items(TransactItems=items)
    except ClientError as error:
        if error.response["Error"]["Code"] != "TransactionCanceledException":
            raise
        reasons = _reasons(error)
        if "TransactionConflict" in reasons:
            raise _Conflict() from error
        failed = [i for i, code in enumerate(reasons) if code == "ConditionalCheckFailed"]
        if 0 in failed:
            return False
        if 2 in failed and max_per_minute is not None:
            raise LimitExceeded("rate", max_per_minute, max(1, minute + 60 - at)) from None
        if 1 in failed and max_active is not None:
            raise LimitExceeded("active", max_active, ACTIVE_RETRY_AFTER_S) from None
        raise
    return True


def update_batch(batch_id: str, *, sets: dict[str, Any], condition: str,
                 values: dict[str, Any] | None = None, names: dict[str, str] | None = None) -> dict[str, Any] | None:
    """SET attributes of a batch header under `condition`; the new item, or None if it failed."""
    attr_names = dict(names or {})
    vals = dict(values or {})
    assignments = []
    for i, (name, value) in enumerate(sets.items()):
        attr_names[f"#u{i}"] = name
        vals[f":u{i}"] = value
        assignments.append(f"#u{i} = :u{i}")
    try:
        result = table().update_item(
            Key={"PK": batch_pk(batch_id), "SK": META}, UpdateExpression="SET " + ", ".join(assignments),
            ConditionExpression=condition, ExpressionAttributeNames=attr_names,
            ExpressionAttributeValues=vals, ReturnValues="ALL_NEW")
    except ClientError as error:
        if _condition_failed(error):
            return None
        raise
    return plain(result["Attributes"])


def list_batches(account_id: str, *, limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
    """An account's batches newest first: (`limit` items after batch `after`, has_more)."""
    kwargs: dict[str, Any] = {
        "IndexName": "GSI1", "KeyConditionExpression": "GSI1PK = :pk",
        "ExpressionAttributeValues": {":pk": f"ACCOUNT#{account_id}"},
        "ScanIndexForward": False, "Limit": limit + 1}
    if after:
        anchor = get_batch(after, consistent=False)
        if anchor is None or anchor.get("account_id") != account_id:
            return [], False
        kwargs["ExclusiveStartKey"] = {"PK": anchor["PK"], "SK": META, "GSI1PK": anchor["GSI1PK"],
                                       "GSI1SK": anchor["GSI1SK"]}
    items: list[dict[str, Any]] = []
    while True:
        page = table().query(**kwargs)
        items.extend(plain(i) for i in page["Items"] if i["PK"].startswith("BATCH#"))
        if len(items) > limit or "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return items[:limit], len(items) > limit


def scan_open_batches() -> Iterator[dict[str, Any]]:
    """Every non-terminal batch header (for the sweeper)."""
    open_statuses = [s.value for s in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS,
                                       BatchStatus.FINALIZING, BatchStatus.CANCELLING)]
    kwargs: dict[str, Any] = {
        "FilterExpression": "SK = :meta AND begins_with(PK, :batch) AND #status IN (:o0, :o1, :o2, :o3)",
        "ExpressionAttributeNames": {"#status": "status"},
        "ExpressionAttributeValues": {":meta": META, ":batch": "BATCH#",
                                      **{f":o{i}": s for i, s in enumerate(open_statuses)}}}
    while True:
        page = table().scan(**kwargs)
        yield from (plain(i) for i in page["Items"])
        if "LastEvaluatedKey" not in page:
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


# ---- shards --------------------------------------------------------------------------------------

def put_shard(batch_id: str, shard: dict[str, Any]) -> None:
    """Create a shard item unless it exists (a repeated prepare must not reset a finished shard)."""
    item = {"PK": batch_pk(batch_id), "SK": shard_sk(shard["shard"]), "state": "pending", "next_index": 0,
            "parts": [], "completed": 0, "failed": 0, "attempts": 0, **shard}
    try:
        table().put_item(Item=item, ConditionExpression="attribute_not_exists(PK)")
    except ClientError as error:
        if not _condition_failed(error):
            raise


def get_shard(batch_id: str, shard: int) -> dict[str, Any] | None:
    item = table().get_item(Key={"PK": batch_pk(batch_id), "SK": shard_sk(shard)}, ConsistentRead=True).get("Item")
    return plain(item) if item else None


def query_shards(batch_id: str) -> Iterator[dict[str, Any]]:
    """A batch's shard items in shard order (consistent reads)."""
    kwargs: dict[str, Any] = {
        "KeyConditionExpression": "PK = :pk AND begins_with(SK, :shard)", "ConsistentRead": True,
        "ExpressionAttributeValues": {":pk": batch_pk(batch_id), ":shard": "SHARD#"}}
    while True:
        page = table().query(**kwargs)
        yield from (plain(i) for i in page["Items"])
        if "LastEvaluatedKey" not in page:
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def claim_shard(batch_id: str, shard: int, *, owner: str, lease_seconds: int) -> dict[str, Any] | None:
    """Lease a pending shard to `owner` for `lease_seconds` (so one message runs it at a time).

    Returns the shard item, or None when it is done or leased by a live owner.
    """
    at = now()
    try:
        result = table().update_item(
            Key={"PK": batch_pk(batch_id), "SK": shard_sk(shard)},
            UpdateExpression="SET lease_owner = :owner, lease_until = :until, attempts = attempts + :one",
            ConditionExpression="#state = :pending AND (attribute_not_exists(lease_until) OR lease_until < :now)",
            ExpressionAttributeNames={"#state": "state"},
            ExpressionAttributeValues={":owner": owner, ":until": at + lease_seconds, ":one": 1,
                                       ":pending": "pending", ":now": at},
            ReturnValues="ALL_NEW")
    except ClientError as error:
        if _condition_failed(error):
            return None
        raise
    return plain(result["Attributes"])


def bump_redrives(batch_id: str, shard: int) -> int:
    """Count one more re-drive of a stuck shard by the sweeper; returns the new count."""
    result = table().update_item(
        Key={"PK": batch_pk(batch_id), "SK": shard_sk(shard)}, UpdateExpression="ADD redrives :one",
        ExpressionAttributeValues={":one": 1}, ReturnValues="UPDATED_NEW")
    return int(result["Attributes"]["redrives"])


def release_shard(batch_id: str, shard: int, *, owner: str) -> None:
    """Give up a lease early (continuations), so the next message can claim the shard at once."""
    try:
        table().update_item(
            Key={"PK": batch_pk(batch_id), "SK": shard_sk(shard)}, UpdateExpression="REMOVE lease_until",
            ConditionExpression="lease_owner = :owner", ExpressionAttributeValues={":owner": owner})
    except ClientError as error:
        if not _condition_failed(error):
            raise


def commit_shard(batch_id: str, shard: int, *, start: int, end: int, size: int, part: dict[str, Any],
                 completed: int, failed: int, input_tokens: int, output_tokens: int,
                 keep_lease: bool = False) -> bool:
    """Record requests `[start, end)` of a shard as done, with the batch counts, in one transaction.

    The shard's condition (`state = pending AND next_index = :start`) makes a repeated commit of the
    same work fail, so a redelivered message never counts twice; the header's condition (not sealed)
    keeps a batch that is being finalized from changing under the aggregator. `keep_lease` keeps the
    caller's lease (a checkpoint: it goes on with the shard). Returns False when a condition failed
    (nothing was written).
    """
    done = end >= size
    at = now()
    shard_update = {
        "Update": {
            "TableName": table().name,
            "Key": {"PK": batch_pk(batch_id), "SK": shard_sk(shard)},
            "UpdateExpression": ("SET next_index = :end, parts = list_append(parts, :part), #state = :state, "
                                 "completed = completed + :c, failed = failed + :f, updated_at = :now"
                                 + ("" if keep_lease else " REMOVE lease_until")),
            "ConditionExpression": "#state = :pending AND next_index = :start",
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": {":end": end, ":part": [part], ":state": "done" if done else "pending",
                                          ":c": completed, ":f": failed, ":now": at, ":pending": "pending",
                                          ":start": start},
        }
    }
    header_update = {
        "Update": {
            "TableName": table().name,
            "Key": {"PK": batch_pk(batch_id), "SK": META},
            "UpdateExpression": ("SET request_counts.completed = request_counts.completed + :c, "
                                 "request_counts.failed = request_counts.failed + :f, "
                                 "#usage.input_tokens = #usage.input_tokens + :in, "
                                 "#usage.output_tokens = #usage.output_tokens + :out, "
                                 "#usage.total_tokens = #usage.total_tokens + :tot, "
                                 "shards_done = shards_done + :d, progress_at = :now"),
            "ConditionExpression": "attribute_not_exists(sealed)",
            "ExpressionAttributeNames": {"#usage": "usage"},
            "ExpressionAttributeValues": {":c": completed, ":f": failed, ":in": input_tokens,
                                          ":out": output_tokens, ":tot": input_tokens + output_tokens,
                                          ":d": 1 if done else 0, ":now": at},
        }
    }
    for attempt in range(_CONFLICT_RETRIES):
        try:
            table().meta.client.transact_write_items(TransactItems=[shard_update, header_update])
            return True
        except ClientError as error:
            if not _condition_failed(error):
                raise
            # A TransactionConflict (another transaction on the header at the same time) is not an
            # answer: try again. Only a failed condition means this work is counted already.
            if _only_conflicts(error) and attempt + 1 < _CONFLICT_RETRIES:
                time.sleep(random.uniform(0.01, 0.05 * 2**attempt))
                continue
            return False
    return False


_CONFLICT_RETRIES = 5


def _only_conflicts(error: ClientError) -> bool:
    reasons = [r.get("Code") for r in error.response.get("CancellationReasons", [])]
    return bool(reasons) and "ConditionalCheckFailed" not in reasons and "TransactionConflict" in reasons


# ---- files ---------------------------------------------------------------------------------------

def put_file(item: dict[str, Any]) -> None:
    """Store (or overwrite) a file record; `item` holds the File fields plus `account_id`, `bucket`, `key`."""
    table().put_item(Item={"PK": f"FILE#{item['id']}", "SK": META, "GSI1PK": f"FILES#{item['account_id']}",
                           "GSI1SK": sort_key(item["created_at"], item["id"]), **item})


def list_files(account_id: str, *, limit: int) -> list[dict[str, Any]]:
    """An account's files, newest first (at most `limit`)."""
    page = table().query(IndexName="GSI1", KeyConditionExpression="GSI1PK = :pk", ScanIndexForward=False,
                         ExpressionAttributeValues={":pk": f"FILES#{account_id}"}, Limit=limit)
    return [plain(i) for i in page["Items"]]


def get_file(file_id: str) -> dict[str, Any] | None:
    item = table().get_item(Key={"PK": f"FILE#{file_id}", "SK": META}).get("Item")
    return plain(item) if item else None


def delete_file(file_id: str) -> None:
    table().delete_item(Key={"PK": f"FILE#{file_id}", "SK": META})


def page_files(account_id: str, *, limit: int, after: str | None = None, purpose: str | None = None,
               newest_first: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """An account's files in creation order: (`limit` items after file `after`, has_more).

    `purpose` keeps only files of that purpose. A file `after` that the account does not own gives
    an empty page.
    """
    kwargs: dict[str, Any] = {
        "IndexName": "GSI1", "KeyConditionExpression": "GSI1PK = :pk", "ScanIndexForward": not newest_first,
        "ExpressionAttributeValues": {":pk": f"FILES#{account_id}"}}
    if purpose is not None:
        kwargs["FilterExpression"] = "purpose = :purpose"
        kwargs["ExpressionAttributeValues"][":purpose"] = purpose
    if after:
        anchor = get_file(after)
        if anchor is None or anchor.get("account_id") != account_id:
            return [], False
        kwargs["ExclusiveStartKey"] = {"PK": f"FILE#{after}", "SK": META, "GSI1PK": f"FILES#{account_id}",
                                       "GSI1SK": anchor["GSI1SK"]}
    items: list[dict[str, Any]] = []
    while True:
        page = table().query(**kwargs)
        items.extend(plain(i) for i in page["Items"])
        if len(items) > limit or "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return items[:limit], len(items) > limit


# ---- uploads (presigned PUT of large files) ----------------------------------------------------------

def put_upload(item: dict[str, Any]) -> None:
    """Store a new upload record: the Upload fields plus `account_id`, `file_id`, `bucket`, `key`."""
    table().put_item(Item={"PK": f"UPLOAD#{item['id']}", "SK": META, **item})


def get_upload(upload_id: str) -> dict[str, Any] | None:
    """An upload record (consistent read), or None."""
    item = table().get_item(Key={"PK": f"UPLOAD#{upload_id}", "SK": META}, ConsistentRead=True).get("Item")
    return plain(item) if item else None


def finish_upload(upload_id: str, status: str, *,
                  sets: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Move a `pending` upload to `status` (`completed` / `cancelled`); None if it was not pending."""
    fields = {"status": status, **(sets or {})}
    names = {f"#f{i}": name for i, name in enumerate(fields)}
    values = {f":v{i}": value for i, value in enumerate(fields.values())}
    try:
        result = table().update_item(
            Key={"PK": f"UPLOAD#{upload_id}", "SK": META},
            UpdateExpression="SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields))),
            ConditionExpression="#f0 = :pending", ExpressionAttributeNames=names,
            ExpressionAttributeValues={**values, ":pending": "pending"}, ReturnValues="ALL_NEW")
    except ClientError as error:
        if _condition_failed(error):
            return None
        raise
    return plain(result["Attributes"])
