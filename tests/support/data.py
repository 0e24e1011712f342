"""Helpers of the data layer's tests: batch headers to store, and DynamoDB transaction conflicts."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from batchinfer.core import aws, ids
from batchinfer.data import table
from batchinfer.data.items import BatchHeader


def batch_header(account: str = "acct", created_at: int = 1_800_000_000, **fields: Any) -> BatchHeader:
    """A new header as `pipeline.intake` writes it (a fresh id), with `fields` changed."""
    batch_id = fields.pop("id", None) or ids.new_batch_id()
    return BatchHeader(
        **{
            "id": batch_id,
            "account_id": account,
            "endpoint": "/v1/chat/completions",
            "input_file_id": "file-x",
            "completion_window": "24h",
            "created_at": created_at,
            "expires_at": created_at + 86_400,
            "input_bucket": "in-bucket",
            "input_key": "files/file-x",
            "output_bucket": "out-bucket",
            "output_prefix": f"batches/{batch_id}/",
            **fields,
        }
    )


def cancelled(reasons: list[str]) -> ClientError:
    """The `TransactionCanceledException` DynamoDB answers with these per-item reason codes."""
    return ClientError(
        {
            "Error": {
                "Code": "TransactionCanceledException",
                "Message": f"Transaction cancelled, please refer cancellation reasons for "
                f"specific reasons [{', '.join(reasons)}]",
            },
            "CancellationReasons": [{"Code": code} for code in reasons],
        },
        "TransactWriteItems",
    )


class Transactions:
    """Every `TransactWriteItems` call (its items) and the conflict retry's waits (seconds)."""

    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.waits: list[float] = []


def intercept_transactions(monkeypatch: pytest.MonkeyPatch, *answers: str | list[str]) -> Transactions:
    """Answer the next transactions of the batch table with a cancellation, one per `answers`:
    `"conflict"` (the first item conflicts with a concurrent transaction) or a list of reason codes;
    later ones go to DynamoDB (moto). The conflict retry's waits are recorded instead of slept."""
    seen = Transactions()
    client = aws.table().meta.client
    real = client.transact_write_items

    def transact_write_items(**params: Any) -> Any:
        seen.calls.append(params["TransactItems"])
        if len(seen.calls) <= len(answers):
            answer = answers[len(seen.calls) - 1]
            size = len(params["TransactItems"])
            raise cancelled(
                ["TransactionConflict"] + ["None"] * (size - 1) if answer == "conflict" else answer
            )
        return real(**params)

    monkeypatch.setattr(client, "transact_write_items", transact_write_items)
    monkeypatch.setattr(table.CONFLICT_RETRY, "sleep", seen.waits.append)
    return seen


def small_pages(monkeypatch: pytest.MonkeyPatch, operation: str, limit: int = 1) -> list[dict[str, Any]]:
    """Make the batch table's `query` or `scan` read pages of `limit` items (DynamoDB's pages end at
    1 MB: tests have far less); returns the parameters of every call."""
    resource = aws.table()
    real = getattr(resource, operation)
    calls: list[dict[str, Any]] = []

    def paged(**params: Any) -> Any:
        calls.append(params)
        return real(**{**params, "Limit": min(limit, params.get("Limit", limit))})

    monkeypatch.setattr(resource, operation, paged)
    return calls


def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Record every read of the batch table (`get_item`, `query`, `scan`) as (operation, parameters,
    answer): what DynamoDB read is the answer's `ScannedCount` (query, scan) or its `Item` (get)."""
    resource = aws.table()
    seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for operation in ("get_item", "query", "scan"):
        real = getattr(resource, operation)

        def recorded(*, _operation: str = operation, _real: Any = real, **params: Any) -> Any:
            answer = _real(**params)
            seen.append((_operation, params, answer))
            return answer

        monkeypatch.setattr(resource, operation, recorded)
    return seen
