"""Accounts and their API keys, in the batch table (DESIGN.md).

| item                    | PK                 | SK       | holds                                            |
|-------------------------|--------------------|----------|--------------------------------------------------|
| API key                 | `KEY#<sha256>`     | `META`   | key_id, account_id, name, created_at, revoked_at |
| key id -> key           | `KEYID#<key_id>`   | `META`   | key_hash, account_id                             |
| account settings        | `ACCOUNT#<id>`     | `META`   | allowed_buckets, limit overrides                 |
| active-batch counter    | `ACCOUNT#<id>`     | `LIMITS` | active_batches (`store.create_batch_limited`)    |
| creations in a minute   | `ACCOUNT#<id>`     | `RATE#<minute>` | creates, ttl                              |

A key is a bearer secret (`Authorization: Bearer sk-...`, as OpenAI's API takes it); only its
SHA-256 is stored, so a table dump reveals no usable key. SHA-256 without salt or stretching is
enough for random 256-bit keys (nothing to brute-force); keys given by hand (a local dev key) are
stored the same way. Every function takes an optional boto3 `Table` (the CLI passes its own);
the default is the deployment's table.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from boto3.dynamodb.conditions import Key
from botocore.exceptions import ClientError
from pydantic import BaseModel, Field

from batchinfer.core import aws
from batchinfer.data.store import LIMITS_SK, META, account_pk, now, plain

KEY_PREFIX = "sk-bi-"


class ApiKey(BaseModel):
    """A stored API key (never the secret itself)."""

    key_id: str
    account_id: str
    name: str | None = None
    created_at: int
    revoked_at: int | None = None


class Account(BaseModel):
    """An account's settings. `None` limits mean the deployment's defaults (Settings)."""

    account_id: str
    allowed_buckets: list[str] = Field(default_factory=list,
                                       description="`s3://bucket` / `cos://bucket` the account may use")
    max_active_batches: int | None = Field(None, ge=1)
    max_creates_per_minute: int | None = Field(None, ge=1)

    def allows(self, bucket_ref: str) -> bool:
        """True when `bucket_ref` (`s3://bucket` or `cos://bucket`) is on the allowlist."""
        return bucket_ref in self.allowed_buckets


def _table(table: Any | None) -> Any:
    return table if table is not None else aws.table()


def hash_key(secret: str) -> str:
    """The stored form of an API key: its SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    """A fresh API key: `sk-bi-` and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(account_id: str, *, name: str | None = None, secret: str | None = None,
               table: Any | None = None) -> tuple[str, ApiKey]:
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
    table = _table(table)
    digest, at = hash_key(secret), now()
    record = ApiKey(key_id=f"key_{secrets.token_hex(8)}", account_id=account_id, name=name, created_at=at)
    item = {"PK": f"KEY#{digest}", "SK": META, "GSI1PK": f"KEYS#{account_id}",
            "GSI1SK": f"{at:010d}#{record.key_id}", **record.model_dump(exclude_none=True)}
    try:
        table.meta.client.transact_write_items(TransactItems=[
            {"Put": {"TableName": table.name, "Item": item,
                     "ConditionExpression": "attribute_not_exists(PK)"}},
            {"Put": {"TableName": table.name,
                     "Item": {"PK": f"KEYID#{record.key_id}", "SK": META, "key_hash": digest,
                              "account_id": account_id}}},
        ])
    except ClientError as error:
        if error.response["Error"]["Code"] != "TransactionCanceledException":
            raise
        existing = _key_item(table, digest)
        if existing is None:
            raise
        return secret, ApiKey.model_validate(existing)
    ensure_account(account_id, table=table)
    return secret, record


def _key_item(table: Any, digest: str) -> dict[str, Any] | None:
    item = table.get_item(Key={"PK": f"KEY#{digest}", "SK": META}, ConsistentRead=True).get("Item")
    return plain(item) if item else None


def revoke_key(key: str, *, table: Any | None = None) -> ApiKey | None:
    """Revoke a key given by its id (`key_...`) or by the secret itself.

    Takes effect on the next request (keys are not cached). Revoking twice keeps the first time.
    Returns the revoked key, or None when there is no such key.
    """
    table = _table(table)
    if key.startswith("key_"):
        pointer = table.get_item(Key={"PK": f"KEYID#{key}", "SK": META}, ConsistentRead=True).get("Item")
        if pointer is None:
            return None
        digest = pointer["key_hash"]
    else:
        digest = hash_key(key)
    try:
        result = table.update_item(
            Key={"PK": f"KEY#{digest}", "SK": META},
            UpdateExpression="SET revoked_at = if_not_exists(revoked_at, :now)",
            ConditionExpression="attribute_exists(PK)", ExpressionAttributeValues={":now": now()},
            ReturnValues="ALL_NEW")
    except ClientError as error:
        if error.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return None
        raise
    return ApiKey.model_validate(plain(result["Attributes"]))


def list_keys(account_id: str, *, table: Any | None = None) -> list[ApiKey]:
    """An account's keys (revoked ones included), newest first."""
    table = _table(table)
    kwargs: dict[str, Any] = {"IndexName": "GSI1", "ScanIndexForward": False,
                              "KeyConditionExpression": Key("GSI1PK").eq(f"KEYS#{account_id}")}
    keys: list[ApiKey] = []
    while True:
        page = table.query(**kwargs)
        keys += [ApiKey.model_validate(plain(i)) for i in page["Items"]]
        if "LastEvaluatedKey" not in page:
            return keys
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def authenticate(secret: str | None, *, table: Any | None = None) -> ApiKey | None:
    """The live key whose secret is `secret`, or None (missing, unknown or revoked)."""
    if not secret:
        return None
    item = _key_item(_table(table), hash_key(secret))
    if item is None or item.get("revoked_at") is not None:
        return None
    return ApiKey.model_validate(item)


def ensure_account(account_id: str, *, table: Any | None = None) -> None:
    """Create the account's settings item with defaults unless it exists."""
    try:
        _table(table).put_item(Item={"PK": account_pk(account_id), "SK": META, "account_id": account_id,
                                     "allowed_buckets": [], "created_at": now()},
                               ConditionExpression="attribute_not_exists(PK)")
    except ClientError as error:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise


def get_account(account_id: str, *, table: Any | None = None) -> Account:
    """The account's settings (defaults when it has no settings item)."""
    item = _table(table).get_item(Key={"PK": account_pk(account_id), "SK": META}).get("Item")
    return Account.model_validate(plain(item)) if item else Account(account_id=account_id)


def configure_account(account_id: str, *, allowed_buckets: list[str] | None = None,
                      max_active_batches: int | None = None, max_creates_per_minute: int | None = None,
                      table: Any | None = None) -> Account:
    """Set an account's bucket allowlist and/or limit overrides (arguments left None are unchanged).

    Buckets are `s3://name` or `cos://name` (the scheme keeps the two namespaces apart).
    Raises ValueError for a malformed bucket reference or a limit below 1.
    """
    sets: dict[str, Any] = {}
    if allowed_buckets is not None:
        for ref in allowed_buckets:
            scheme, sep, name = ref.partition("://")
            if scheme not in ("s3", "cos") or not sep or not name or "/" in name:
                raise ValueError(f"bucket must be 's3://name' or 'cos://name', got {ref!r}")
        sets["allowed_buckets"] = sorted(set(allowed_buckets))
    for field, value in (("max_active_batches", max_active_batches),
                         ("max_creates_per_minute", max_creates_per_minute)):
        if value is not None:
            if value < 1:
                raise ValueError(f"{field} must be at least 1, got {value}")
            sets[field] = value
    ensure_account(account_id, table=table)
    if sets:
        names = {f"#f{i}": name for i, name in enumerate(sets)}
        values = {f":v{i}": value for i, value in enumerate(sets.values())}
        assignments = ", ".join(f"#f{i} = :v{i}" for i in range(len(sets)))
        _table(table).update_item(Key={"PK": account_pk(account_id), "SK": META},
                                  UpdateExpression=f"SET {assignments}", ExpressionAttributeNames=names,
                                  ExpressionAttributeValues=values)
    return get_account(account_id, table=table)


def active_batches(account_id: str, *, table: Any | None = None) -> int:
    """The account's counter of non-terminal batches (consistent read)."""
    item = _table(table).get_item(Key={"PK": account_pk(account_id), "SK": LIMITS_SK},
                                  ConsistentRead=True).get("Item")
    return int(item.get("active_batches", 0)) if item else 0
