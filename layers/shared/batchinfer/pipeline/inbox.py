"""Batches started by uploading a `.jsonl` under the inbox prefix of the service bucket.

Convention: `inbox/<path>.jsonl` becomes a `/v1/chat/completions` batch with a 24h window; its
results land in `outbox/<path>/output.jsonl` and `outbox/<path>/error.jsonl`. The batch id is derived
from the object event (bucket, key, and its version, or on an unversioned bucket its ETag and the
event's `sequencer`), so a repeated event never starts a second batch and every new upload starts one.

The account's limits (`accounts.batch_limits`, the same rule `POST /v1/batches` applies) hold for
inbox uploads too. An upload over a limit still becomes a batch, one that ends `failed` at once
with an `errors.data` entry naming the limit (`active_batch_limit_exceeded` or
`rate_limit_exceeded`), as OpenAI's Batch API does with a batch over its enqueued-token limit
(`failed`, `errors.data[0].code` `token_limit_exceeded`): an S3 upload has no caller to answer
429 to, and waiting would need a queue of its own that could itself be lost. Nothing is lost: the
input object stays in the inbox, the batch (listed with the account's batches) says why, and
uploading the file again, even unchanged, starts a new batch.
"""

from __future__ import annotations

from urllib.parse import unquote_plus

from aws_lambda_powertools.utilities.data_classes.s3_event import S3EventRecord

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts
from batchinfer.pipeline import intake
from batchinfer.wire.openai import CHAT_ENDPOINT


def outbox_prefix(key: str) -> str:
    """`inbox/a/b.jsonl` -> `outbox/a/b/`."""
    settings = get_settings()
    relative = key[len(settings.inbox_prefix) :] if key.startswith(settings.inbox_prefix) else key
    return f"{settings.outbox_prefix}{relative.removesuffix('.jsonl')}/"


def start_from_record(record: S3EventRecord) -> str | None:
    """Create the batch of one S3 `ObjectCreated` record; returns its id, or None for other keys.

    S3 event keys are URL-encoded (`+` for a space): decoded here exactly once with `unquote_plus`
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/notification-content-structure.html).
    Powertools' per-record `get_object.key` is the raw, still-encoded key.
    """
    settings = get_settings()
    bucket, obj = record.s3.bucket.name, record.s3.get_object
    key = unquote_plus(obj.key)
    if not (key.startswith(settings.inbox_prefix) and key.endswith(".jsonl")):
        return None
    # Each upload of an unversioned object has its own sequencer (a repeat of its event the same one).
    version = obj.version_id or ":".join(part for part in (obj.etag, obj.get("sequencer")) if part)
    batch_id = ids.batch_id_for_object(bucket, key, version)
    limits = accounts.batch_limits(accounts.get_account(settings.inbox_account_id))
    new = intake.NewBatch(
        batch_id=batch_id,
        account_id=settings.inbox_account_id,
        input_file_id=f"s3://{bucket}/{key}",
        input_bucket=bucket,
        input_key=key,
        # Prepare reads this upload, not a later overwrite: that version, or (unversioned) this ETag.
        input_version_id=obj.version_id or None,
        input_etag=None if obj.version_id else (obj.etag or None),
        endpoint=CHAT_ENDPOINT,
        completion_window="24h",
        output_bucket=bucket,
        output_prefix=outbox_prefix(key),
        max_active=limits.max_active,
        max_per_minute=limits.max_per_minute,
    )
    intake.create_batch(new, refuse="fail")
    return batch_id
