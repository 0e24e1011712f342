"""Accounts and their keys (data/accounts.py) in moto's copy of the template's table, and the API
function's authentication, invoked in-process with HTTP API events. The counters are tested with the
transactions that write them (test_batches.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from batchinfer.core import aws
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, keys
from batchinfer.data.items import Account, ApiKey
from support.data import intercept_transactions, small_pages
from support.moto_env import Aws


def http_event(method: str, path: str, *, key: str | None = None, body: Any = None) -> dict[str, Any]:
    headers = {"content-type": "application/json", "host": "api.example.com"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "ANY /v1/{proxy+}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "api",
            "domainName": "api.example.com",
            "domainPrefix": "api",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "test",
            },
            "requestId": "r",
            "routeKey": "ANY /v1/{proxy+}",
            "stage": "$default",
            "time": "30/Nov/2026:00:00:00 +0000",
            "timeEpoch": 1_800_000_000_000,
        },
        "pathParameters": {"proxy": path.removeprefix("/v1/")},
        "isBase64Encoded": False,
    }
    if body is not None:
        event["body"] = json.dumps(body)
    return event


# ---- keys ------------------------------------------------------------------------------------------


def test_keys_authenticate_until_revoked_and_only_hashes_are_stored(moto_aws: Aws) -> None:
    secret, key = accounts.create_key("acct", name="ci")
    assert accounts.authenticate(secret) == key
    assert accounts.authenticate(secret + "x") is None and accounts.authenticate("") is None
    assert secret not in json.dumps(aws.table().scan()["Items"], default=str)
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


def test_what_a_key_stores(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounts, "now", lambda: 1_800_000_000)
    secret, key = accounts.create_key("acct", name="ci")
    digest = accounts.hash_key(secret)
    assert key == ApiKey(key_id=key.key_id, account_id="acct", name="ci", created_at=1_800_000_000)
    assert aws.table().get_item(Key=keys.api_key(digest))["Item"] == {
        "PK": f"KEY#{digest}",
        "SK": "META",
        "GSI1PK": "KEYS#acct",
        "GSI1SK": f"1800000000#{key.key_id}",
        "key_id": key.key_id,
        "account_id": "acct",
        "name": "ci",
        "created_at": 1_800_000_000,
    }
    assert aws.table().get_item(Key=keys.key_pointer(key.key_id))["Item"] == {
        "PK": f"KEYID#{key.key_id}",
        "SK": "META",
        "key_hash": digest,
        "account_id": "acct",
    }
    assert aws.table().get_item(Key=keys.account("acct"))["Item"] == {
        "PK": "ACCOUNT#acct",
        "SK": "META",
        "account_id": "acct",
        "allowed_buckets": [],
        "created_at": 1_800_000_000,
    }
    # Revoked: the time is added, nothing else changes (and no NULL revoked_at before).
    assert accounts.revoke_key(key.key_id) == key.model_copy(update={"revoked_at": 1_800_000_000})


def test_list_keys_newest_first_over_pages(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(1_800_000_000, 1_800_000_010))
    monkeypatch.setattr(accounts, "now", lambda: next(clock))
    made = [accounts.create_key("acct", name=f"k{n}")[1] for n in range(3)]
    accounts.create_key("other")
    calls = small_pages(monkeypatch, "query", limit=1)
    assert accounts.list_keys("acct") == list(reversed(made))
    assert len(calls) == 3
    assert accounts.list_keys("nobody") == []


def test_a_key_creation_conflict_is_retried(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = intercept_transactions(monkeypatch, "conflict")
    secret, key = accounts.create_key("acct", secret="sk-dev")
    assert len(seen.calls) == 2 and accounts.authenticate(secret) == key
    assert accounts.list_keys("acct") == [key]


def test_account_settings(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounts, "now", lambda: 1_800_000_000)
    assert accounts.get_account("new") == Account(account_id="new")
    configured = accounts.configure_account(
        "new", allowed_buckets=["s3://b-1", "cos://c-1", "s3://b-1"], max_active_batches=3
    )
    assert configured.model_dump() == {
        "account_id": "new",
        "allowed_buckets": ["cos://c-1", "s3://b-1"],
        "max_active_batches": 3,
        "max_creates_per_minute": None,
        "max_infer_in_flight": None,
        "max_storage_bytes": None,
        "max_stored_files": None,
        "max_pending_uploads": None,
        "max_upload_parts": None,
        "webhook_url": None,
        "webhook_secret": None,
        "webhook_previous_secret": None,
        "webhook_previous_until": None,
        "created_at": 1_800_000_000,
    }
    assert configured.allows("s3://b-1") and not configured.allows("s3://c-1")
    assert accounts.configure_account("new", max_creates_per_minute=9) == configured.model_copy(
        update={"max_creates_per_minute": 9}
    )
    assert accounts.ensure_account("new") is False
    with pytest.raises(ValueError, match=r"bucket must be 's3://name', 'cos://name' or .*, got 'b-1'"):
        accounts.configure_account("new", allowed_buckets=["b-1"])
    with pytest.raises(ValueError, match="max_creates_per_minute must be at least 1, got 0"):
        accounts.configure_account("new", max_creates_per_minute=0)


def test_an_allowlist_entry_may_be_a_bucket_s_prefix_never_a_wildcard(moto_aws: Aws) -> None:
    configured = accounts.configure_account("new", allowed_buckets=["s3://shared/team-a", "s3://own/"])
    assert configured.allowed_buckets == ["s3://own", "s3://shared/team-a/"]
    assert configured.allows_key("s3://shared", "team-a/in.jsonl")
    assert not configured.allows_key("s3://shared", "team-b/in.jsonl")
    assert not configured.allows_key("s3://shared", "team-ab/in.jsonl")
    assert not configured.allows_key("s3://shared", "")  # the bucket's root: not under the prefix
    assert configured.allows_key("s3://own", "any/key.jsonl")
    for wild in ("s3://*", "s3://batchinfer-user-*", "s3://shared/a/../b", "s3://shared//x"):
        with pytest.raises(ValueError, match="no '\\*'"):
            accounts.configure_account("new", allowed_buckets=[wild])


def test_batch_limits_are_the_accounts_own_else_the_deployments(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAX_ACTIVE_BATCHES", "7")
    monkeypatch.setenv("MAX_CREATES_PER_MINUTE", "30")
    get_settings.cache_clear()
    assert accounts.batch_limits(Account(account_id="a")) == accounts.BatchLimits(
        max_active=7, max_per_minute=30
    )
    own = Account(account_id="a", max_active_batches=2)
    assert accounts.batch_limits(own) == accounts.BatchLimits(max_active=2, max_per_minute=30)
    # and how each limit is named where a creation is refused (the API's 429, an inbox batch's errors)
    active, rate = accounts.LimitExceeded("active", 2, 30), accounts.LimitExceeded("rate", 30, 12)
    assert (active.code, active.reached) == (
        "active_batch_limit_exceeded",
        "This account has 2 batches that have not finished, the most it may have",
    )
    assert (rate.code, rate.reached) == (
        "rate_limit_exceeded",
        "Rate limit reached: 30 batch creations per minute",
    )


def test_active_batches_reads_the_counter(moto_aws: Aws) -> None:
    assert accounts.active_batches("acct") == 0
    aws.table().put_item(Item={**keys.active_counter("acct"), "active_batches": 3})
    assert accounts.active_batches("acct") == 3


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
        "no key": 401,
        "wrong key": 401,
        "good key, bad body": 400,
        "good key": 200,
        "document": 200,
    }
    assert json.loads(answers["wrong key"]["body"])["error"] == {
        "message": "Incorrect API key provided: sk-bi-...nope.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert json.loads(answers["good key, bad body"]["body"])["error"]["param"] == "input_file_id"


def test_a_webhook_url_gets_a_new_signing_secret_each_time_it_is_set(moto_aws: Aws) -> None:
    first = accounts.set_webhook("hooked", "https://example.com/hooks")
    assert first is not None and first.startswith("whsec_")
    assert len(base64.b64decode(first.removeprefix("whsec_"))) == 32
    stored = accounts.get_account("hooked")
    assert (stored.webhook_url, stored.webhook_secret) == ("https://example.com/hooks", first)
    assert "whsec_" not in repr(stored)  # never in a log line of the account
    second = accounts.set_webhook("hooked", "http://hooks.example.com:9/other")
    assert second != first and accounts.get_account("hooked").webhook_secret == second
    assert accounts.set_webhook("hooked", None) is None
    removed = accounts.get_account("hooked")
    assert (removed.webhook_url, removed.webhook_secret) == (None, None)


def test_a_rotation_keeps_the_old_secret_signing_for_its_grace_only(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an account with a webhook, and one without
    monkeypatch.setattr(accounts, "now", lambda: 1_800_000_000)
    first = accounts.set_webhook("hooked", "https://example.com/hooks")
    with pytest.raises(ValueError, match="account 'bare' has no webhook"):
        accounts.rotate_webhook_secret("bare")
    assert accounts.get_account("bare").webhook_secret is None
    # When its secret is rotated with the default grace (a day)
    second = accounts.rotate_webhook_secret("hooked")
    # Then both sign until the grace ends, the new one first; then only the new one
    rotated = accounts.get_account("hooked")
    assert (rotated.webhook_secret, rotated.webhook_previous_until) == (second, 1_800_000_000 + 86_400)
    assert rotated.webhook_secrets(1_800_000_000 + 86_399) == [second, first]
    assert rotated.webhook_secrets(1_800_000_000 + 86_400) == [second]
    assert first not in repr(rotated) and second not in repr(rotated)
    # And a rotation within the grace keeps only the secret it replaced
    third = accounts.rotate_webhook_secret("hooked", grace_seconds=60)
    assert accounts.get_account("hooked").webhook_secrets(1_800_000_000 + 59) == [third, second]
    # And setting the URL again starts over with one secret
    fourth = accounts.set_webhook("hooked", "https://example.com/other")
    assert accounts.get_account("hooked").webhook_secrets(1_800_000_000) == [fourth]
    for grace in (-1, 30 * 86_400 + 1):
        refused = rf"grace must be from 0 to 2592000 seconds \(30 days\), got {grace}"
        with pytest.raises(ValueError, match=refused):
            accounts.rotate_webhook_secret("hooked", grace_seconds=grace)
    assert accounts.get_account("hooked").webhook_secrets(1_800_000_000) == [fourth]


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest", "http://10.0.0.1/h", "http://localhost:9/h"]
)
def test_a_webhook_url_to_a_private_address_is_refused(moto_aws: Aws, url: str) -> None:
    with pytest.raises(ValueError, match=r"is not a public address|is loopback"):
        accounts.set_webhook("hooked", url)
    assert accounts.get_account("hooked").webhook_url is None


@pytest.mark.parametrize("url", ["example.com/hooks", "ftp://example.com/x", "https://", ""])
def test_a_webhook_url_must_be_absolute_http(moto_aws: Aws, url: str) -> None:
    with pytest.raises(ValueError, match="webhook URL must be an absolute http"):
        accounts.set_webhook("hooked", url)
