"""Accounts, keys and the account counters in DynamoDB (moto, the template's table), and the API
function's authentication, invoked in-process with HTTP API events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchinfer.core import ids
from batchinfer.data import accounts, store
from batchinfer.wire.status import BatchStatus
from support.moto_env import Aws


def header(account: str = "acct", created_at: int = 1_800_000_000) -> dict[str, Any]:
    return {"id": ids.new_batch_id(), "account_id": account, "created_at": created_at, "status": "validating",
            "endpoint": "/v1/chat/completions", "input_file_id": "file-x", "completion_window": "24h"}


def http_event(method: str, path: str, *, key: str | None = None, body: Any = None) -> dict[str, Any]:
    headers = {"content-type": "application/json", "host": "api.example.com"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    event: dict[str, Any] = {
        "version": "2.0", "routeKey": "ANY /v1/{proxy+}", "rawPath": path, "rawQueryString": "", "headers": headers,
        "requestContext": {"accountId": "123456789012", "apiId": "api", "domainName": "api.example.com",
                           "domainPrefix": "api", "http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                                                           "sourceIp": "127.0.0.1", "userAgent": "test"},
                           "requestId": "r", "routeKey": "ANY /v1/{proxy+}", "stage": "$default",
                           "time": "30/Nov/2026:00:00:00 +0000", "timeEpoch": 1_800_000_000_000},
        "pathParameters": {"proxy": path.removeprefix("/v1/")}, "isBase64Encoded": False}
    if body is not None:
        event["body"] = json.dumps(body)
    return event


# ---- keys ------------------------------------------------------------------------------------------

def test_keys_authenticate_until_revoked_and_only_hashes_are_stored(moto_aws: Aws) -> None:
    secret, key = accounts.create_key("acct", name="ci")
    assert accounts.authenticate(secret) == key
    assert accounts.authenticate(secret + "x") is None and accounts.authenticate("") is None
    assert secret not in json.dumps(store.table().scan()["Items"], default=str)
    assert [k.key_id for k in accounts.list_keys("acct")] == [key.key_id]

    revoked = accounts.revoke_key(key.key_id)
    again = accounts.revoke_key(secret)  # by the key itself; the first revocation time stays
    assert revoked is not None and again is not None and again.revoked_at == revoked.revoked_at
    assert accounts.authenticate(secret) is None
    assert accounts.revoke_key("key_doesnotexist") is None and accounts.revoke_key("sk-unknown") is None


def test_a_given_secret_is_stored_once(moto_aws: Aws) -> None:
    _, first = accounts.create_key("acct", secret="sk-dev")
    _, second = accounts.create_key("acct", secret="sk-dev")
    assert first == second
    with pytest.raises(ValueError, match="API key must not be empty"):
        accounts.create_key("acct", secret="")


def test_account_settings(moto_aws: Aws) -> None:
    assert accounts.get_account("new") == accounts.Account(account_id="new")
    configured = accounts.configure_account("new", allowed_buckets=["s3://b-1", "cos://c-1", "s3://b-1"],
                                            max_active_batches=3)
    assert configured.model_dump() == {"account_id": "new", "allowed_buckets": ["cos://c-1", "s3://b-1"],
                                       "max_active_batches": 3, "max_creates_per_minute": None}
    with pytest.raises(ValueError, match="bucket must be 's3://name' or 'cos://name', got 'b-1'"):
        accounts.configure_account("new", allowed_buckets=["b-1"])
    with pytest.raises(ValueError, match="max_creates_per_minute must be at least 1, got 0"):
        accounts.configure_account("new", max_creates_per_minute=0)


# ---- counters --------------------------------------------------------------------------------------

def test_creations_per_minute_are_counted_per_calendar_minute(moto_aws: Aws) -> None:
    minute = 1_800_000_000 - 1_800_000_000 % 60
    for second in (0, 10, 20):
        assert store.create_batch_limited(header(), max_active=None, max_per_minute=3, at=minute + second)
    with pytest.raises(store.LimitExceeded) as refused:
        store.create_batch_limited(header(), max_active=None, max_per_minute=3, at=minute + 45)
    assert (refused.value.kind, refused.value.limit, refused.value.retry_after) == ("rate", 3, 15)
    assert store.create_batch_limited(header(), max_active=None, max_per_minute=3, at=minute + 60)
    assert accounts.active_batches("acct") == 4  # the refused one was not counted


def test_active_limit_and_exactly_once_decrement(moto_aws: Aws) -> None:
    first, second, third = header(), header(), header()
    assert store.create_batch_limited(first, max_active=2, max_per_minute=None)
    assert store.create_batch_limited(second, max_active=2, max_per_minute=None)
    assert not store.create_batch_limited(first, max_active=None, max_per_minute=None)  # exists: not counted
    with pytest.raises(store.LimitExceeded) as refused:
        store.create_batch_limited(third, max_active=2, max_per_minute=None)
    assert (refused.value.kind, refused.value.retry_after) == ("active", 30)
    assert store.get_batch(third["id"]) is None

    # A terminal transition decrements once, however often it is attempted; non-terminal ones don't.
    assert store.transition(first["id"], BatchStatus.FAILED)["status"] == "failed"
    assert store.transition(first["id"], BatchStatus.FAILED) is None
    assert store.transition(second["id"], BatchStatus.CANCELLING)["status"] == "cancelling"
    assert accounts.active_batches("acct") == 1
    assert store.create_batch_limited(third, max_active=2, max_per_minute=None)
    assert accounts.active_batches("acct") == 2


def test_batches_written_without_counting_are_never_decremented(moto_aws: Aws) -> None:
    item = header()
    assert store.put_batch(item)
    assert store.transition(item["id"], BatchStatus.FAILED)["status"] == "failed"
    assert accounts.active_batches("acct") == 0


# ---- the API function ------------------------------------------------------------------------------

def test_api_function_authenticates_before_anything_else(moto_aws: Aws) -> None:
    secret, _ = accounts.create_key("acct")
    cases = {
        "no key": http_event("POST", "/v1/batches", body={"bad": 1}),
        "wrong key": http_event("GET", "/v1/batches", key="sk-bi-nope-nope-nope"),
        "good key, bad body": http_event("POST", "/v1/batches", key=secret, body={"bad": 1}),
        "good key": http_event("GET", "/v1/batches", key=secret),
        "document": http_event("GET", "/v1/openapi.json"),
    }
    answers = {name: moto_aws.invoke("ApiFunction", event) for name, event in cases.items()}
    assert {name: a["statusCode"] for name, a in answers.items()} == {
        "no key": 401, "wrong key": 401, "good key, bad body": 400, "good key": 200, "document": 200}
    assert json.loads(answers["wrong key"]["body"])["error"] == {
        "message": "Incorrect API key provided: sk-bi-...nope.", "type": "invalid_request_error", "param": None,
        "code": "invalid_api_key"}
    assert json.loads(answers["good key, bad body"]["body"])["error"]["param"] == "input_file_id"
