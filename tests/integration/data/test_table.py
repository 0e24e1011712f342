"""The shared DynamoDB mechanics (data/table.py) against moto's copy of the template's table."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from batchinfer.core import aws
from batchinfer.data import table
from batchinfer.data.table import TransactionConflict
from support.data import intercept_transactions, small_pages
from support.moto_env import Aws


def put(pk: str, sk: str = "META", **attributes: object) -> None:
    aws.table().put_item(Item={"PK": pk, "SK": sk, **attributes})


def test_conditional_answers_none_for_a_failed_condition_and_raises_other_errors(moto_aws: Aws) -> None:
    tbl = aws.table()
    first = table.conditional(
        tbl.put_item, Item={"PK": "X", "SK": "META", "n": 1}, ConditionExpression="attribute_not_exists(PK)"
    )
    again = table.conditional(
        tbl.put_item, Item={"PK": "X", "SK": "META", "n": 2}, ConditionExpression="attribute_not_exists(PK)"
    )
    assert first is not None and first["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert again is None
    assert tbl.get_item(Key={"PK": "X", "SK": "META"})["Item"] == {"PK": "X", "SK": "META", "n": 1}
    with pytest.raises(ClientError, match="ValidationException"):
        table.conditional(tbl.update_item, Key={"PK": "X", "SK": "META"}, UpdateExpression="SET")


def test_transact_answers_the_positions_of_failed_conditions(moto_aws: Aws) -> None:
    put("A", n=1)
    new = {"Put": {"Item": {"PK": "B", "SK": "META"}, "ConditionExpression": "attribute_not_exists(PK)"}}
    exists = {
        "Put": {"Item": {"PK": "A", "SK": "META", "n": 9}, "ConditionExpression": "attribute_not_exists(PK)"}
    }
    assert table.transact([new, exists]) == {1}
    assert "Item" not in aws.table().get_item(Key={"PK": "B", "SK": "META"})  # all or nothing
    assert table.transact([new]) == set()
    assert table.transact([new, exists]) == {0, 1}
    assert aws.table().get_item(Key={"PK": "A", "SK": "META"})["Item"]["n"] == 1


def test_transact_raises_a_conflict_and_other_cancellations(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    action = {"Put": {"Item": {"PK": "A", "SK": "META"}}}
    seen = intercept_transactions(
        monkeypatch, "conflict", ["ThrottlingError"], ["TransactionConflict", "ConditionalCheckFailed"]
    )
    with pytest.raises(TransactionConflict):
        table.transact([action, action])
    with pytest.raises(ClientError, match="TransactionCanceledException"):
        table.transact([action])
    # A failed condition is an answer even when another item conflicted.
    assert table.transact([action, action]) == {1}
    assert len(seen.calls) == 3 and seen.calls[0][0] == {
        "Put": {"TableName": aws.table().name, **action["Put"]}
    }
    assert "Item" not in aws.table().get_item(Key={"PK": "A", "SK": "META"})


def test_retry_conflicts_runs_again_with_backoff_then_gives_up(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = intercept_transactions(monkeypatch)  # records the waits
    runs: list[int] = []

    @table.retry_conflicts
    def flaky(conflicts: int) -> str:
        runs.append(1)
        if len(runs) <= conflicts:
            raise TransactionConflict("busy")
        return "written"

    assert flaky(3) == "written"
    assert len(runs) == 4 and len(seen.waits) == 3
    assert all(0 <= wait <= 1.0 for wait in seen.waits)
    runs.clear()
    with pytest.raises(TransactionConflict, match="busy"):
        flaky(100)
    assert len(runs) == table.CONFLICT_ATTEMPTS == 10


def test_items_reads_every_page_lazily(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(5):
        put("P", f"S#{n}", n=n)
    put("Q", "S#0")
    calls = small_pages(monkeypatch, "query", limit=2)
    query = {"KeyConditionExpression": "PK = :pk", "ExpressionAttributeValues": {":pk": "P"}}
    assert [item["n"] for item in table.items(aws.table().query, **query)] == [0, 1, 2, 3, 4]
    assert len(calls) == 3 and "ExclusiveStartKey" not in calls[0]
    assert calls[1]["ExclusiveStartKey"] == {"PK": "P", "SK": "S#1"}
    calls.clear()
    assert next(table.items(aws.table().query, **query))["n"] == 0
    assert len(calls) == 1  # the next page is read only when needed
    scans = small_pages(monkeypatch, "scan", limit=1)
    assert sorted(item["SK"] for item in table.items(aws.table().scan)) == ["S#0"] * 2 + [
        f"S#{n}" for n in range(1, 5)
    ]
    assert len(scans) == 6  # pages of one item (moto leaves LastEvaluatedKey off the last)


def test_read_page_reads_one_past_the_limit(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(6):
        put("P", f"S#{n}", n=n)
    calls = small_pages(monkeypatch, "query", limit=2)
    query = {"KeyConditionExpression": "PK = :pk", "ExpressionAttributeValues": {":pk": "P"}}
    found, more = table.read_page(aws.table().query, limit=2, **query)
    assert ([i["n"] for i in found], more, len(calls)) == ([0, 1], True, 2)
    found, more = table.read_page(aws.table().query, limit=2, start={"PK": "P", "SK": "S#3"}, **query)
    assert ([i["n"] for i in found], more) == ([4, 5], False)
    found, more = table.read_page(aws.table().query, limit=2, keep=lambda item: item["n"] % 2 == 1, **query)
    assert ([i["n"] for i in found], more) == ([1, 3], True)
    assert table.read_page(aws.table().query, limit=10, keep=lambda item: False, **query) == ([], False)


def test_assignments() -> None:
    assert table.assignments({"status": "done", "file": {"id": "f"}}) == (
        "#u0 = :u0, #u1 = :u1",
        {"#u0": "status", "#u1": "file"},
        {":u0": "done", ":u1": {"id": "f"}},
    )
    assert table.assignments({"a": 1}, prefix="x") == ("#x0 = :x0", {"#x0": "a"}, {":x0": 1})
    assert table.assignments({}) == ("", {}, {})
