"""Make moto's DynamoDB as atomic under concurrent requests as DynamoDB itself.

DynamoDB applies each write, its condition included, atomically, and a transaction all-or-nothing
(https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html). moto 5.2's
threaded server does neither across threads: a condition is evaluated, then the item written, with
no lock between; and a cancelled `TransactWriteItems` rolls back by putting back a copy of the *whole
table* taken when it started (moto/dynamodb/models/__init__.py `transact_write_items`), erasing
every write other threads made meanwhile. The local stack runs the API, the pipeline functions and
the pollers in threads of one process, so both would show up as lost or double counts.

The whole-table copy costs too: every transaction deep-copies every item (and every record of the
table's stream) even when it succeeds, and a cancelled one replaces the table by the copy, so a
stream reader's iterators still point at the old table's stream and never see a later change, while
the new one keeps every record and is copied again at each transaction (a 6 GB pytest). So
`roll_back_items_only()` makes a transaction save only the items it names and, when cancelled, put
those back and drop the stream records it wrote: the table stays the same object, as in DynamoDB.

`serialize_item_operations()` wraps the backend's item operations in one process-wide re-entrant
lock (transactions call `put_item`/`update_item` inside), which gives each request the isolation
DynamoDB guarantees; and the HTTP handler's whole action too, since moto's `update_item` response
deep-copies the stored item outside the backend call (moto/dynamodb/responses.py) while another
thread's update changes it in place: "RuntimeError: dictionary changed size during iteration", an
HTTP 500 AWS never answers for that. Throughput is irrelevant locally.
"""

from __future__ import annotations

import copy
import functools
import threading
from typing import Any

import moto.dynamodb.models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import Item
from moto.dynamodb.models.table import Table
from moto.dynamodb.responses import DynamoHandler

# Held by every item operation (which may write the table's stream) and by the stream reads that trim
# it (`moto_compat.trim_read_stream_records`).
ITEM_LOCK = threading.RLock()
_OPERATIONS = (
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
    "transact_write_items",
    "transact_get_items",
    "batch_write_item",
    "batch_get_item",
    "execute_statement",
    "execute_transaction",
    "batch_execute_statement",
)


def serialize_item_operations() -> None:
    """Patch `DynamoDBBackend` and `DynamoHandler` so item operations and whole DynamoDB requests run one
    at a time, and transactions roll back item by item (`roll_back_items_only`); idempotent."""
    for owner, name in [(DynamoDBBackend, name) for name in _OPERATIONS] + [(DynamoHandler, "call_action")]:
        method = getattr(owner, name, None)
        if method is None or getattr(method, "_batchinfer_serialized", False):
            continue

        def locked(*args: Any, __method: Any = method, **kwargs: Any) -> Any:
            with ITEM_LOCK:
                return __method(*args, **kwargs)

        functools.update_wrapper(locked, method)
        locked._batchinfer_serialized = True  # type: ignore[attr-defined]
        setattr(owner, name, locked)
    roll_back_items_only()


class _CopyKeepingTables:
    """The `copy` module as moto's DynamoDB backend sees it once `roll_back_items_only()` ran: a deep copy
    of a `Table` is the table itself (the transaction's rollback is `_transact_write_items`'s)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


def roll_back_items_only() -> None:
    """Patch `DynamoDBBackend.transact_write_items` to save and restore only the items it names and
    its stream records, not a copy of each table (idempotent; see the module docstring)."""
    if getattr(DynamoDBBackend.transact_write_items, "_batchinfer_item_rollback", False):
        return
    original = DynamoDBBackend.transact_write_items
    dynamodb_models.copy = _CopyKeepingTables()  # type: ignore[assignment]

    def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
        with ITEM_LOCK:
            saved = [_save(self, entry) for entry in transact_items]
            streams = {
                id(table): (table, len(table.stream_shard.items))
                for table, *_ in saved
                if table and table.stream_shard
            }
            try:
                original(self, transact_items)
            except BaseException:
                for table, key, before in reversed(saved):
                    if table is not None:
                        _put_back(self, table, key, before)
                for table, length in streams.values():
                    del table.stream_shard.items[length:]
                raise

    functools.update_wrapper(transact_write_items, original)
    transact_write_items._batchinfer_item_rollback = True  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def _save(
    backend: DynamoDBBackend, entry: dict[str, Any]
) -> tuple[Table | None, dict[str, Any], Item | None]:
    """(table, key, a copy of its item or None) for one transaction entry; (None, {}, None) for an entry
    moto will reject anyway (unknown table, malformed key)."""
    try:
        op = next(iter(entry.values()))
        table = backend.get_table(op["TableName"])
        if "Item" in op:
            key = {name: op["Item"][name] for name in (table.hash_key_attr, table.range_key_attr) if name}
        else:
            key = op["Key"]
        before = backend.get_item(op["TableName"], key)
    except Exception:
        return None, {}, None
    return table, key, copy.deepcopy(before)


def _put_back(backend: DynamoDBBackend, table: Table, key: dict[str, Any], before: Item | None) -> None:
    now = backend.get_item(table.name, key)
    target = before or now
    if target is None:
        return  # absent before, absent now
    slot: dict[Any, Any] = table.items[target.hash_key] if table.range_key_attr else table.items
    name = target.range_key if table.range_key_attr else target.hash_key
    if before is None:
        slot.pop(name, None)
    else:
        slot[name] = before
