"""DynamoDB mechanics every data module shares: the table handle, conditional writes, transactions
and their conflict retry, paging, and SET expressions.

Each is written once here, on boto3: its resource `Table` has no paginator (the client's paginators
yield DynamoDB-typed values), raises `ClientError` for a failed condition, and its retries leave a
cancelled transaction to the caller; tenacity does the retrying. An ORM (PynamoDB and the like)
would bring its own model classes and condition language instead of the pydantic items and the
few DynamoDB expressions the data modules spell out.

- A failed condition is an answer (a repeated or concurrent step), not an error: `conditional`
  turns it into `None`, `transact` into the positions of the items whose condition failed.
- A transaction cancelled by a concurrent one (`TransactionConflict`) is not an answer: `transact`
  raises `TransactionConflict`, and functions decorated with `retry_conflicts` run again with
  backoff, as DynamoDB advises
  (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html).
  Past `CONFLICT_ATTEMPTS` the conflict is raised: the caller fails (SQS redelivers), it never
  takes a conflict for an answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import Any, TypeVar

from botocore.exceptions import ClientError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from batchinfer.core import aws

Table = Any  # boto3's `dynamodb.Table` resource (no static type ships with boto3)
F = TypeVar("F", bound=Callable[..., Any])

CONFLICT_ATTEMPTS = 10


def handle(table: Table | None = None) -> Table:
    """`table`, or by default the deployment's batch table (`core.aws.table`)."""
    return table if table is not None else aws.table()


def now() -> int:
    """Current Unix time in seconds."""
    return int(time.time())


class TransactionConflict(Exception):
    """A transaction cancelled by a concurrent one on the same items: nothing was written, try again."""


# The one retry policy of transactions. Retrying.wraps copies the policy on every call, so a test
# may change its `wait` or `sleep`.
CONFLICT_RETRY = Retrying(
    retry=retry_if_exception_type(TransactionConflict),
    stop=stop_after_attempt(CONFLICT_ATTEMPTS),
    wait=wait_random_exponential(multiplier=0.02, max=1.0),
    reraise=True,
)


def retry_conflicts(function: F) -> F:
    """Run `function` again (with jittered exponential backoff, up to `CONFLICT_ATTEMPTS` runs) while it
    raises `TransactionConflict`; then re-raise it. `function` must write nothing before its transaction."""
    return CONFLICT_RETRY.wraps(function)  # type: ignore[return-value]


def conditional(operation: Callable[..., dict[str, Any]], **params: Any) -> dict[str, Any] | None:
    """Call a conditional write (`table.put_item`, `update_item`, ...) with `params`: its response, or
    None when its `ConditionExpression` failed (nothing was written). Other errors are raised."""
    try:
        return operation(**params)
    except ClientError as error:
        if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return None
        raise


def cancellation_reasons(error: ClientError) -> list[str]:
    """The per-item codes of a cancelled transaction (`None` for items that were fine)."""
    return [reason.get("Code") or "None" for reason in error.response.get("CancellationReasons") or []]


def transact(actions: list[dict[str, Any]], *, table: Table | None = None) -> set[int]:
    """Write `actions` (TransactWriteItems entries without `TableName`, e.g. `{"Update": {...}}`) in one
    transaction on `table`.

    Returns the positions of the actions whose condition failed: empty when everything was written,
    else nothing was. Raises `TransactionConflict` when it was cancelled by concurrent transactions
    and no condition failed; other errors (and cancellations for other reasons) are raised.
    """
    table = handle(table)
    items = [
        {kind: {"TableName": table.name, **params}} for action in actions for kind, params in action.items()
    ]
    try:
        table.meta.client.transact_write_items(TransactItems=items)
    except ClientError as error:
        if error.response["Error"]["Code"] != "TransactionCanceledException":
            raise
        reasons = cancellation_reasons(error)
        failed = {i for i, code in enumerate(reasons) if code == "ConditionalCheckFailed"}
        if failed:
            return failed
        if "TransactionConflict" in reasons:
            raise TransactionConflict(f"transaction cancelled by a concurrent one: {reasons}") from error
        raise
    return set()


def pages(
    operation: Callable[..., dict[str, Any]], **params: Any
) -> Iterator[tuple[list[dict[str, Any]], dict[str, Any] | None]]:
    """The pages of a `table.query` or `table.scan` with `params`, each as (its items, the
    `ExclusiveStartKey` of the next page or None after the last), reading a page only when the
    caller gets there. The one paging loop of the data layer (`items` and `read_page` use it)."""
    while True:
        page = operation(**params)
        position = page.get("LastEvaluatedKey")
        yield page["Items"], position
        if position is None:
            return
        params = {**params, "ExclusiveStartKey": position}


def items(operation: Callable[..., dict[str, Any]], **params: Any) -> Iterator[dict[str, Any]]:
    """Every item of a `table.query` or `table.scan` with `params`, reading the next page only when
    the caller gets there (`LastEvaluatedKey`)."""
    for found, _ in pages(operation, **params):
        yield from found


def read_page(
    operation: Callable[..., dict[str, Any]],
    *,
    limit: int,
    start: dict[str, Any] | None = None,
    keep: Callable[[dict[str, Any]], bool] = lambda item: True,
    **params: Any,
) -> tuple[list[dict[str, Any]], bool]:
    """Up to `limit` items of a query that `keep` accepts, from after `start` (an `ExclusiveStartKey`),
    and whether more follow: `(items, has_more)`. Reads one item past `limit` to know."""
    if start is not None:
        params["ExclusiveStartKey"] = start
    found = list(islice((item for item in items(operation, **params) if keep(item)), limit + 1))
    return found[:limit], len(found) > limit


def assignments(
    changes: Mapping[str, Any], *, prefix: str = "u"
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """`#u0 = :u0, #u1 = :u1, ...` (no `SET`) for `changes` (attribute name -> value), with its
    ExpressionAttributeNames and ExpressionAttributeValues; `prefix` keeps them apart from the caller's."""
    names = {f"#{prefix}{i}": name for i, name in enumerate(changes)}
    values = {f":{prefix}{i}": value for i, value in enumerate(changes.values())}
    return ", ".join(f"#{prefix}{i} = :{prefix}{i}" for i in range(len(changes))), names, values
