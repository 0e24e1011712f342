"""Accounts, their API keys and their counters (active batches, creations per minute); items and keys
in `keys`.

A key is a bearer secret (`Authorization: Bearer sk-...`, as OpenAI's API takes it); only its
SHA-256 is stored, so a table dump reveals no usable key. SHA-256 without salt or stretching is
enough for random 256-bit keys (nothing to brute-force); keys given by hand (a local dev key) are
stored the same way. The key and account functions take an optional boto3 `Table` (the CLI passes
its own); the default is the deployment's table.

The counters are written inside the transactions of `batches` (`count_active`, `count_creation`,
`uncount_active` give their actions), so they stay exact under concurrent creates and transitions.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import Any
from urllib.parse import urlsplit

from boto3.dynamodb.conditions import Key
from pydantic import BaseModel, Field

from batchinfer.core.netguard import check_url, safe_url
from batchinfer.core.settings import get_settings
from batchinfer.data import keys
from batchinfer.data.items import Account, ApiKey, KeyPointer
from batchinfer.data.storage import QUOTA_FIELDS
from batchinfer.data.table import (
    Table,
    assignments,
    conditional,
    handle,
    items,
    now,
    retry_conflicts,
    transact,
)
from batchinfer.wire.bearer import well_formed

KEY_PREFIX = "sk-bi-"
# An active-batch limit frees up when some batch ends; there is no telling when, so suggest a poll.
ACTIVE_RETRY_AFTER_S = 30
# A minute's creation counter is kept an hour (DynamoDB TTL), long after its minute is over.
RATE_TTL_S = 3600
# How long a rotated-out webhook secret still signs deliveries (Svix, whose Standard Webhooks these
# are, keeps an old secret 24 hours): receivers have a day to switch to the new one.
WEBHOOK_GRACE_S = 86_400
# The longest grace: a typo must not keep a rotated-out (perhaps leaked) secret signing for years.
MAX_WEBHOOK_GRACE_S = 30 * 86_400


class LimitExceeded(Exception):
    """A batch creation over an account limit: `kind` is `active` (batches not yet terminal) or `rate`
    (creations in this calendar minute); `limit` the limit; `retry_after` seconds worth waiting.

    `code` is the OpenAI error code naming it (`rate_limit_exceeded`, OpenAI's own, or
    `active_batch_limit_exceeded`) and `reached` the sentence saying so, for the API's 429 and for
    the `errors.data` entry of a refused inbox upload alike."""

    def __init__(self, kind: str, limit: int, retry_after: int) -> None:
        super().__init__(f"{kind} limit {limit} reached")
        self.kind, self.limit, self.retry_after = kind, limit, retry_after

    @property
    def code(self) -> str:
        return "rate_limit_exceeded" if self.kind == "rate" else "active_batch_limit_exceeded"

    @property
    def reached(self) -> str:
        if self.kind == "rate":
            return f"Rate limit reached: {self.limit} batch creations per minute"
        return f"This account has {self.limit} batches that have not finished, the most it may have"


class BatchLimits(BaseModel):
    """The limits a batch creation of one account is held to (`batches.create_limited`)."""

    max_active: int = Field(description="batches counted and not yet terminal")
    max_per_minute: int = Field(description="creations in one calendar minute")


def batch_limits(account: Account) -> BatchLimits:
    """The account's batch limits: its own settings where it has them, else the deployment's
    (`Settings.max_active_batches`, `max_creates_per_minute`). The one rule for `POST /v1/batches`
    and inbox uploads alike."""
    settings = get_settings()
    return BatchLimits(
        max_active=account.max_active_batches or settings.max_active_batches,
        max_per_minute=account.max_creates_per_minute or settings.max_creates_per_minute,
    )


# ---- keys -----------------------------------------------------------------------------------------


def hash_key(secret: str) -> str:
    """The stored form of an API key: its SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    """A fresh API key: `sk-bi-` and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(
    account_id: str, *, name: str | None = None, secret: str | None = None, table: Table | None = None
) -> tuple[str, ApiKey]:
    """Create an API key for `account_id` (the account is created too if new).

    `secret` stores a given key (the local stack's dev key) instead of a random one; storing the
    same secret again returns the existing key. Returns (the secret, its record); the secret is not
    kept and cannot be shown again. Raises ValueError for an empty account id or secret.
    """
    if not account_id:
        raise ValueError("account id must not be empty")
    secret = new_secret() if secret is None else secret
    if not secret:
        raise ValueError("API key must not be empty")
    table = handle(table)
    record = _store_key(account_id, name, hash_key(secret), table)
    ensure_account(account_id, table=table)
    return secret, record


@retry_conflicts
def _store_key(account_id: str, name: str | None, digest: str, table: Table) -> ApiKey:
    """The key and its id pointer in one transaction; the stored key when that secret has one already."""
    record = ApiKey(key_id=f"key_{secrets.token_hex(8)}", account_id=account_id, name=name, created_at=now())
    item = {
        **keys.indexed(
            keys.api_key(digest),
            keys.account_keys(account_id),
            keys.key_order(record.created_at, record.key_id),
        ),
        **record.stored(),
    }
    pointer = {
        **keys.key_pointer(record.key_id),
        **KeyPointer(key_hash=digest, account_id=account_id).stored(),
    }
    if not transact(
        [
            {"Put": {"Item": item, "ConditionExpression": "attribute_not_exists(PK)"}},
            {"Put": {"Item": pointer}},
        ],
        table=table,
    ):
        return record
    existing = _key(table, digest)
    if existing is None:  # deleted between the two calls: nothing sensible to return
        raise RuntimeError("the API key's item exists and does not")
    return existing


def _key(table: Table, digest: str) -> ApiKey | None:
    item = table.get_item(Key=keys.api_key(digest), ConsistentRead=True).get("Item")
    return ApiKey.model_validate(item) if item else None


def revoke_key(key: str, *, table: Table | None = None) -> ApiKey | None:
    """Revoke a key given by its id (`key_...`) or by the secret itself.

    Takes effect on the next request (keys are not cached). Revoking twice keeps the first time.
    Returns the revoked key, or None when there is no such key.
    """
    table = handle(table)
    if key.startswith("key_"):
        item = table.get_item(Key=keys.key_pointer(key), ConsistentRead=True).get("Item")
        if item is None:
            return None
        digest = KeyPointer.model_validate(item).key_hash
    else:
        digest = hash_key(key)
    result = conditional(
        table.update_item,
        Key=keys.api_key(digest),
        UpdateExpression="SET revoked_at = if_not_exists(revoked_at, :now)",
        ConditionExpression="attribute_exists(PK)",
        ExpressionAttributeValues={":now": now()},
        ReturnValues="ALL_NEW",
    )
    return None if result is None else ApiKey.model_validate(result["Attributes"])


def list_keys(account_id: str, *, table: Table | None = None) -> list[ApiKey]:
    """An account's keys (revoked ones included), newest first."""
    table = handle(table)
    return [
        ApiKey.model_validate(item)
        for item in items(
            table.query,
            IndexName="GSI1",
            ScanIndexForward=False,
            KeyConditionExpression=Key("GSI1PK").eq(keys.account_keys(account_id)),
        )
    ]


def authenticate(secret: str | None, *, table: Table | None = None) -> ApiKey | None:
    """The live key whose secret is `secret`, or None (missing, malformed, unknown or revoked). A
    malformed token (not RFC 6750's b64token, or too long) is refused before any table read."""
    if not secret or not well_formed(secret):
        return None
    key = _key(handle(table), hash_key(secret))
    if key is None or key.revoked_at is not None:
        return None
    return key


# ---- account settings -----------------------------------------------------------------------------


def ensure_account(account_id: str, *, table: Table | None = None) -> bool:
    """Create the account's settings item with defaults unless it exists; True when it was created."""
    item = {**keys.account(account_id), **Account(account_id=account_id, created_at=now()).stored()}
    return (
        conditional(handle(table).put_item, Item=item, ConditionExpression="attribute_not_exists(PK)")
        is not None
    )


def get_account(account_id: str, *, table: Table | None = None) -> Account:
    """The account's settings (defaults when it has no settings item)."""
    item = handle(table).get_item(Key=keys.account(account_id)).get("Item")
    return Account.model_validate(item) if item else Account(account_id=account_id)


def _allowlist_entry(ref: str) -> str:
    """`ref` as stored on an allowlist: `scheme://name`, or `scheme://name/prefix/`."""
    scheme, sep, path = ref.partition("://")
    name, _, prefix = path.partition("/")
    segments = prefix.rstrip("/").split("/") if prefix else []
    if scheme not in ("s3", "cos") or not sep or not name or "*" in ref or {"", ".", ".."} & set(segments):
        raise ValueError(
            f"bucket must be 's3://name', 'cos://name' or 's3://name/prefix' (no '*'), got {ref!r}"
        )
    return f"{scheme}://{name}/{'/'.join(segments)}/" if segments else f"{scheme}://{name}"


def configure_account(
    account_id: str,
    *,
    allowed_buckets: list[str] | None = None,
    max_active_batches: int | None = None,
    max_creates_per_minute: int | None = None,
    max_infer_in_flight: int | None = None,
    storage: dict[str, int] | None = None,
    table: Table | None = None,
) -> Account:
    """Set an account's bucket allowlist and/or limit overrides (arguments left None are unchanged);
    `storage` holds storage quota overrides by field (`max_storage_bytes`, `max_stored_files`,
    `max_pending_uploads`, `max_upload_parts`: `data.storage`).

    Buckets are `s3://name` or `cos://name` (the scheme keeps the two namespaces apart), or
    `s3://name/prefix` for only the keys under `prefix/` (stored with its trailing `/`), so that
    accounts sharing a bucket each keep to their own prefix.
    Raises ValueError for a malformed bucket reference (a `*` included: no wildcards), a limit below 1
    or an unknown storage quota.
    """
    if unknown := set(storage or {}) - set(QUOTA_FIELDS):
        raise ValueError(f"no such storage quota: {sorted(unknown)}")
    sets: dict[str, Any] = {}
    if allowed_buckets is not None:
        sets["allowed_buckets"] = sorted({_allowlist_entry(ref) for ref in allowed_buckets})
    for field, value in (
        ("max_active_batches", max_active_batches),
        ("max_creates_per_minute", max_creates_per_minute),
        ("max_infer_in_flight", max_infer_in_flight),
        *(storage or {}).items(),
    ):
        if value is not None:
            if value < 1:
                raise ValueError(f"{field} must be at least 1, got {value}")
            sets[field] = value
    ensure_account(account_id, table=table)
    if sets:
        expression, names, values = assignments(sets)
        handle(table).update_item(
            Key=keys.account(account_id),
            UpdateExpression=f"SET {expression}",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
    return get_account(account_id, table=table)


def set_webhook(
    account_id: str, url: str | None, *, table: Table | None = None, allow_loopback: bool | None = None
) -> str | None:
    """Register `url` as the account's webhook endpoint with a new signing secret, and return the
    secret (shown once: `batchinfer accounts set --webhook-url`); `url` None removes both (returns None).

    The secret is Standard Webhooks' `whsec_` + base64 of 32 random bytes
    (https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md). It is
    stored in the account's settings item, unlike API keys: signing needs the secret itself, not a
    hash; the table is encrypted at rest and only WebhookFunction reads it (Secrets Manager would cost
    a secret per account and a call per delivery for no stronger isolation than the table's).
    Raises ValueError unless `url` is an absolute http(s) URL with a host that is not an address only
    the deployment should reach (`core.netguard.check_url`; delivery checks resolved names again);
    loopback addresses only with `allow_loopback` (default: the functions' `webhook_allow_loopback`).
    """
    ensure_account(account_id, table=table)
    if url is None:
        handle(table).update_item(
            Key=keys.account(account_id),
            UpdateExpression="REMOVE webhook_url, webhook_secret, webhook_previous_secret, "
            "webhook_previous_until",
        )
        return None
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"webhook URL must be an absolute http(s) URL, got {safe_url(url)!r}")
    if allow_loopback is None:
        allow_loopback = get_settings().webhook_allow_loopback
    check_url(url, allow_loopback=allow_loopback)
    secret = _webhook_secret()
    expression, names, values = assignments({"webhook_url": url, "webhook_secret": secret})
    handle(table).update_item(
        Key=keys.account(account_id),
        UpdateExpression=f"SET {expression} REMOVE webhook_previous_secret, webhook_previous_until",
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
    )
    return secret


def _webhook_secret() -> str:
    """A new Standard Webhooks signing secret: `whsec_` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def rotate_webhook_secret(
    account_id: str, *, grace_seconds: int = WEBHOOK_GRACE_S, table: Table | None = None
) -> str:
    """Give the account's webhook a new signing secret and return it (shown once: `batchinfer accounts
    set --rotate-webhook-secret`). The secret it replaces still signs deliveries for `grace_seconds`
    (each then carries both signatures, as Standard Webhooks allows), so a receiver verifying with
    either passes until it has switched; after that only the new one signs. A rotation within the
    grace of another replaces the older secret at once (one previous secret is kept).
    Raises ValueError when the account has no webhook, or for a grace outside 0..`MAX_WEBHOOK_GRACE_S`.
    """
    if not 0 <= grace_seconds <= MAX_WEBHOOK_GRACE_S:
        raise ValueError(
            f"grace must be from 0 to {MAX_WEBHOOK_GRACE_S} seconds (30 days), got {grace_seconds}"
        )
    secret = _webhook_secret()
    done = conditional(
        handle(table).update_item,
        Key=keys.account(account_id),
        UpdateExpression="SET webhook_previous_secret = webhook_secret, webhook_previous_until = :until, "
        "webhook_secret = :secret",
        ConditionExpression="attribute_exists(webhook_secret)",
        ExpressionAttributeValues={":until": now() + grace_seconds, ":secret": secret},
    )
    if done is None:
        raise ValueError(f"account {account_id!r} has no webhook: set one with --webhook-url first")
    return secret


# ---- counters -------------------------------------------------------------------------------------


def active_batches(account_id: str, *, table: Table | None = None) -> int:
    """The account's counter of non-terminal batches (consistent read)."""
    item = handle(table).get_item(Key=keys.active_counter(account_id), ConsistentRead=True).get("Item")
    return int(item.get("active_batches", 0)) if item else 0


def count_active(account_id: str, max_active: int | None) -> dict[str, Any]:
    """The transaction action adding one to the account's active batches, refused (a failed condition)
    when `max_active` are counted already (None: never refused)."""
    update: dict[str, Any] = {
        "Key": keys.active_counter(account_id),
        "UpdateExpression": "ADD active_batches :one",
        "ExpressionAttributeValues": {":one": 1},
    }
    if max_active is not None:
        update["ConditionExpression"] = "attribute_not_exists(active_batches) OR active_batches < :max"
        update["ExpressionAttributeValues"][":max"] = max_active
    return {"Update": update}


def uncount_active(account_id: str) -> dict[str, Any]:
    """The transaction action taking one off the account's active batches (a counted batch ended)."""
    return {
        "Update": {
            "Key": keys.active_counter(account_id),
            "UpdateExpression": "ADD active_batches :minus",
            "ExpressionAttributeValues": {":minus": -1},
        }
    }


def count_creation(account_id: str, minute: int, max_per_minute: int) -> dict[str, Any]:
    """The transaction action adding one to the account's creations in the calendar minute starting at
    `minute` (Unix seconds), refused (a failed condition) when `max_per_minute` were made already."""
    return {
        "Update": {
            "Key": keys.rate_counter(account_id, minute),
            "UpdateExpression": "ADD creates :one SET #ttl = :ttl",
            "ExpressionAttributeNames": {"#ttl": "ttl"},
            "ConditionExpression": "attribute_not_exists(creates) OR creates < :max",
            "ExpressionAttributeValues": {":one": 1, ":max": max_per_minute, ":ttl": minute + RATE_TTL_S},
        }
    }
