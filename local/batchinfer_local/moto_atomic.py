"""Make moto's DynamoDB as atomic under concurrent requests as DynamoDB itself.

DynamoDB applies each write, its condition included, atomically, and a transaction all-or-nothing
(https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html). moto 5.2's
threaded server does neither across threads: a condition is evaluated, then the item written, with
no lock between; and a cancelled `TransactWriteItems` rolls back by putting back a copy of the *whole
table* taken when it started (moto/dynamodb/models/__init__.py `transact_write_items`), erasing
every write other threads made meanwhile. The local stack runs the API, the pipeline functions and
the pollers in threads of one process, so both would show up as lost or double counts.

`serialize_item_operations()` wraps the backend's item operations in one process-wide re-entrant
lock (transactions call `put_item`/`update_item` inside), which gives each request the isolation
DynamoDB guarantees. Throughput is irrelevant locally.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from moto.dynamodb.models import DynamoDBBackend

_LOCK = threading.RLock()
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
    """Patch `DynamoDBBackend` so item operations run one at a time (idempotent)."""
    for name in _OPERATIONS:
        method = getattr(DynamoDBBackend, name, None)
        if method is None or getattr(method, "_batchinfer_serialized", False):
            continue

        def locked(*args: Any, __method: Any = method, **kwargs: Any) -> Any:
            with _LOCK:
                return __method(*args, **kwargs)

        functools.update_wrapper(locked, method)
        locked._batchinfer_serialized = True  # type: ignore[attr-defined]
        setattr(DynamoDBBackend, name, locked)
