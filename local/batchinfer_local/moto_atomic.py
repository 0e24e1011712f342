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
DynamoDB guarantees; and the HTTP handler's whole action too, since moto's `update_item` response
deep-copies the stored item outside the backend call (moto/dynamodb/responses.py) while another
thread's update changes it in place: "RuntimeError: dictionary changed size during iteration", an
HTTP 500 AWS never answers for that. Throughput is irrelevant locally.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.responses import DynamoHandler

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
    """Patch `DynamoDBBackend` and `DynamoHandler` so item operations and whole DynamoDB requests run one
    at a time (idempotent)."""
    for owner, name in [(DynamoDBBackend, name) for name in _OPERATIONS] + [(DynamoHandler, "call_action")]:
        method = getattr(owner, name, None)
        if method is None or getattr(method, "_batchinfer_serialized", False):
            continue

        def locked(*args: Any, __method: Any = method, **kwargs: Any) -> Any:
            with _LOCK:
                return __method(*args, **kwargs)

        functools.update_wrapper(locked, method)
        locked._batchinfer_serialized = True  # type: ignore[attr-defined]
        setattr(owner, name, locked)
