"""Typed settings read once from the environment (set by `template.yaml` Globals, or by the local stack)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REGISTRY = Path(__file__).parents[1] / "backends" / "models.yaml"


class Settings(BaseSettings):
    """Deployment settings; every field maps to the upper-case environment variable of the same name.

    Raises `pydantic.ValidationError` at first use when a required variable is missing.
    """

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    table_name: str
    bucket_name: str
    prepare_queue_url: str = ""
    shards_queue_url: str = ""
    finalize_queue_url: str = ""
    webhook_queue_url: str = Field("", description="webhook deliveries (pipeline.webhooks); '' sends none")
    event_bus_name: str = Field("default", description="the EventBridge bus batch status events go to")
    webhook_timeout_seconds: float = Field(5.0, gt=0, description="one webhook POST, connect to answer")
    webhook_allow_loopback: bool = Field(
        False, description="webhooks may go to loopback addresses (a local stack's receivers); never deployed"
    )
    webhook_account_in_flight: int = Field(
        2, ge=1, description="webhook POSTs of one account in flight at once, in one invocation"
    )
    # Defaults measured by `make bench` (docs/performance.md), kept equal to template.yaml's.
    shard_size: int = Field(500, ge=1, le=10_000, description="requests per shard of an in-process model")
    remote_shard_size: int = Field(
        5000,
        ge=1,
        le=50_000,
        description="requests per shard of a model on a server of its own (openai, kserve_v2, bedrock): "
        "one worker keeps such a server full up to worker_concurrency in flight, and fewer workers "
        "sharing it find its capacity better than many (docs/performance.md)",
    )
    worker_concurrency: int = Field(
        512,
        ge=1,
        le=4096,
        description="safety cap on requests in flight per shard worker (its limiter finds the backend's "
        "capacity below it; 512 fits a large GPU server)",
    )
    max_shard_workers: int = Field(
        20, ge=2, le=1000, description="shard workers at once (the event source's MaximumConcurrency)"
    )
    account_shard_share: float = Field(
        0.8,
        gt=0,
        le=1,
        description="the fraction of MAX_SHARD_WORKERS one account's shards may run at once, on all models "
        "together (so one account cannot hold every worker; `account_shard_slots`)",
    )
    max_requests_per_file: int = Field(50_000, ge=1)
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1)
    max_line_bytes: int = Field(1024 * 1024, ge=1)
    max_line_errors: int = Field(1_000, ge=1, description="cap on errors.data entries of a failed batch")
    max_errors_bytes: int = Field(
        100 * 1024, ge=1024, description="cap on the JSON bytes of errors.data (a DynamoDB item holds 400 KB)"
    )
    inbox_prefix: str = "inbox/"
    outbox_prefix: str = "outbox/"
    model_registry: Path = DEFAULT_REGISTRY
    # Stop a shard this long before the Lambda time limit and continue in a new message.
    time_reserve_ms: int = Field(30_000, ge=0)
    # Commit a shard's finished requests this often, so a crash loses at most this much work.
    checkpoint_seconds: float = Field(60.0, gt=0)
    # A shard worker publishes its uncommitted progress on the batch header this often (one UpdateItem),
    # and reads the batch's status in the same write's answer: GET is at most about twice this behind,
    # and a cancel or expiry reaches every worker within it.
    progress_seconds: float = Field(1.0, gt=0)
    # After a cancel or expiry, requests already at the model may finish for this long (never past the
    # invocation's time reserve); OpenAI keeps a cancelled batch `cancelling` up to 10 minutes.
    cancel_grace_seconds: float = Field(600.0, ge=0)
    # Seconds per hour of a `completion_window` ("24h" is 24 of them): 3600 in every deployment; tests of
    # expiry shorten it.
    window_hour_seconds: int = Field(3600, ge=1)
    # Claims of one shard before its remaining requests are failed (below the queue's maxReceiveCount).
    max_shard_attempts: int = Field(4, ge=1)
    max_finalize_attempts: int = Field(
        5, ge=1, description="aggregator runs that could not write the result files before the batch fails"
    )
    # A shard's lease: its worker renews it every third of it while it works
    # (`worker.LeaseHeartbeat`), so a crashed worker's shard is free again at most this long after its
    # last beat. 90 s: two renewals in a row may fail (throttling, a 5xx) before it runs out, and a
    # crashed worker's shard is taken well inside a cancel's seal deadline (`aggregate.settle_deadline`).
    shard_lease_seconds: int = Field(90, ge=1)
    # The prepare lease, like a shard's: renewed every third of it while prepare streams the
    # input, so a second prepare of the batch is `busy` and the sweeper sends none; a prepare that died
    # leaves the batch to the next one at most this long after its last beat.
    prepare_lease_seconds: int = Field(90, ge=1)
    # A prepare message not received in this long is gone (the prepare queue keeps messages 4 days).
    prepare_wait_seconds: int = Field(4 * 86400, ge=1)
    # A batch with no progress for this long has lost a message: the sweeper sends it again.
    stuck_after_seconds: int = Field(900, ge=1)
    # A shard message not received in this long is gone: the shards queue keeps messages 4 days
    # (SQS's default MessageRetentionPeriod), and one that kept failing before its claim sits in the DLQ.
    shard_wait_seconds: int = Field(4 * 86400, ge=1)
    # Per-account limits (an account item may override them): batch creations per calendar
    # minute and batches not yet terminal. Over either, POST /v1/batches answers 429.
    max_creates_per_minute: int = Field(20, ge=1)
    max_active_batches: int = Field(10, ge=1)
    # `/v2` token requests an account may have in flight at once (an account item may override it);
    # over it, 429. Below TokenInferConcurrency, so one account cannot hold every /v2 environment.
    max_infer_in_flight: int = Field(4, ge=1)
    # Storage quotas per account (an account item may override them, `data.storage`): bytes of its
    # files and pending uploads, their number, pending uploads, and parts of one upload. Over one, 429
    # (413 for an object larger than the whole bytes quota).
    max_storage_bytes: int = Field(100 * 1024**3, ge=1)
    max_stored_files: int = Field(10_000, ge=1)
    max_pending_uploads: int = Field(100, ge=1)
    max_upload_parts: int = Field(1_000, ge=1)
    # The account that owns batches started by an inbox upload (no API key is involved).
    inbox_account_id: str = "default"
    # Lifetime of presigned S3 URLs: downloads (large file contents, user-path results) and uploads.
    presign_seconds: int = Field(900, ge=60, le=7 * 24 * 3600)
    # At most a day: template.yaml's lifecycle deletes upload staging objects (uploads/) a day old.
    upload_expires_seconds: int = Field(3600, ge=60, le=24 * 3600)
    # `cos://bucket.region/key` paths (TokenHub dialect) go to this S3-compatible endpoint; `{region}`
    # is replaced by the path's region (Tencent COS: https://cos.{region}.myqcloud.com). Empty: no COS.
    # The AWS account that must own every S3 bucket the functions call (data bucket and TokenHub user
    # buckets): sent as ExpectedBucketOwner, so a bucket name taken over by another account is refused
    # (403) instead of read or written. The template sets the deployment's own account; empty: not sent.
    expected_bucket_owner: str = ""
    cos_endpoint_url: str = ""
    cos_addressing_style: Literal["auto", "virtual", "path"] = "virtual"
    # Secrets Manager secret (name or ARN) holding {"access_key_id", "secret_access_key"} for COS;
    # empty: the default AWS credential chain (local stacks).
    cos_credentials_secret: str = ""

    def shard_size_for(self, in_process: bool) -> int:
        """Requests per shard of a batch whose model runs in the worker's process (`shard_size`: each
        shard worker is one more engine) or on a server of its own (`remote_shard_size`)."""
        return self.shard_size if in_process else self.remote_shard_size

    @property
    def account_shard_slots(self) -> int | None:
        """How many shards of one account may run at once on one model: `account_shard_share` of
        `max_shard_workers`, rounded down, at least 1; None when that is every worker (no bound: the
        event source's MaximumConcurrency bounds them already, and no slot is taken)."""
        slots = max(1, int(self.account_shard_share * self.max_shard_workers + 1e-9))
        return slots if slots < self.max_shard_workers else None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (validated once)."""
    return Settings()  # type: ignore[call-arg]
