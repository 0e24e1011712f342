"""The items of the batch table as pydantic models: exactly the attributes stored (keys aside, see
`keys`).

Reading: DynamoDB returns numbers as `Decimal`; pydantic's lax mode turns them into the fields'
`int`s. Attributes a model does not know (the table and index keys) are ignored. Writing:
`Item.stored()` leaves out `None` fields, because several conditions test whether an attribute
exists (`attribute_not_exists(sealed)`, `attribute_not_exists(lease_until)`, `if_not_exists(revoked_at)`):
an attribute that is absent until a later write must not be stored as NULL.
Times are Unix seconds; sizes and offsets bytes, unless a field says otherwise.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from batchinfer.wire.openai import BatchErrors, FileObject, InputSource, OutputTarget, RequestCounts
from batchinfer.wire.status import BatchStatus, is_terminal


class Item(BaseModel):
    """A stored item."""

    model_config = ConfigDict(extra="ignore")

    def stored(self) -> dict[str, Any]:
        """The attributes to store (JSON-compatible values; `None` fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)


class TokenTotals(BaseModel):
    """A batch's token totals over its successful requests (the header's `usage` map); `cached_tokens`
    of the input tokens came from a prompt cache (OpenAI's `usage.input_tokens_details.cached_tokens`)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0


class LiveProgress(BaseModel):
    """What one shard worker has finished but not committed yet (the header's `live.<shard>`): requests
    `[start, ...)` of the shard, absolute counts (a repeated publish writes the same values), at Unix
    time `at`. Written by `batches.publish_progress`, moved into the committed counts by `shards.commit`.
    """

    start: int
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    at: int = 0
    window: int | None = Field(
        None,
        description="the worker's requests allowed in flight on the backend once its limiter found it, "
        "shared with the batch's other workers (`backends.limiter_rules.SharedCapacity`)",
    )

    def is_empty(self) -> bool:
        """True when it adds nothing to the committed counts."""
        return not (
            self.completed or self.failed or self.input_tokens or self.output_tokens or self.cached_tokens
        )


class BatchHeader(Item):
    """A batch: the OpenAI Batch fields (`wire.openai.Batch`) plus where it reads and writes and its
    bookkeeping. Written by `pipeline.intake`; every status change is a conditional write
    (`batches.transition`)."""

    id: str
    object: Literal["batch"] = "batch"
    account_id: str
    endpoint: str
    model: str | None = Field(None, description="the requests' model, known once prepare validated them")
    input_file_id: str
    completion_window: str
    status: BatchStatus = BatchStatus.VALIDATING
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: BatchErrors | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    usage: TokenTotals = Field(default_factory=TokenTotals)
    metadata: dict[str, str] | None = None
    name: str | None = None
    # TokenHub dialect (None on inbox batches: the Batch object's defaults apply)
    input_source: InputSource | None = None
    output_target: OutputTarget | None = None
    output_user_s3_path: str | None = None
    output_user_cos_path: str | None = None
    # internal
    shards_total: int = 0
    shards_done: int = Field(0, description="shards whose last request was committed")
    input_bucket: str
    input_key: str
    input_where: str = Field("", description="the storage of input_bucket (`data.locations`): '' is S3")
    input_version_id: str | None = Field(None, description="the object version prepare reads (inbox uploads)")
    input_etag: str | None = Field(None, description="the ETag prepare requires (If-Match; inbox uploads)")
    output_bucket: str
    output_prefix: str = Field(description="key prefix of output.jsonl / error.jsonl")
    output_where: str = ""
    active_counted: bool | None = Field(None, description="True: counted in the account's active batches")
    sealed: bool | None = Field(
        None,
        description="True once the aggregator fixed the final status; "
        "absent before (shard commits require that)",
    )
    final_status: BatchStatus | None = Field(None, description="the terminal status a sealed batch ends in")
    progress_at: int | None = Field(None, description="time of the last shard commit")
    live: dict[str, LiveProgress] = Field(
        default_factory=dict,
        description="uncommitted progress by shard number (stored as a map, {} at first)",
    )
    output_expires_at: int | None = Field(
        None, description="when the result files expire (created_at + output_expires_after.seconds)"
    )
    finalize_failures: int | None = Field(
        None, description="aggregator runs that could not write the result files; absent until the first"
    )
    # The prepare lease, as a shard's (`Shard`): one prepare at a time streams the input
    # (`batches.claim_prepare`), renewing the lease while it works; released once its shard messages
    # are sent, or lapsed at once when it fails.
    prepare_owner: str | None = Field(None, description="the prepare that holds or last held the lease")
    prepare_lease_until: int | None = Field(
        None,
        description="the prepare lease's end; absent when no prepare took it or the last one finished "
        "(present and past: that prepare died or failed before its shard messages were all sent)",
    )
    prepare_queued_at: int | None = Field(
        None, description="when a prepare message was sent that no prepare has received yet"
    )

    def prepare_leased(self, at: int) -> bool:
        """True while a prepare holds a live lease (renewed within one lease, as `Shard.lease_until`)."""
        return leased(self.prepare_lease_until, at)

    def prepare_waiting(self, at: int, wait_seconds: int) -> bool:
        """True while a prepare message waits in the queue (`waiting`, as `Shard.waiting`)."""
        return waiting(self.prepare_queued_at, at, wait_seconds)

    def shown_counts(self) -> tuple[RequestCounts, TokenTotals]:
        """The counts GET shows: committed ones, plus while the batch is open the shard workers'
        uncommitted progress (`live`), capped by the total (completed first, then failed).

        Monotonic while the batch runs: the worker that redoes a crashed worker's window publishes at
        least what that one had published (`pipeline.shard.progress.ProgressLink`). A terminal batch shows its
        exact committed counts.
        """
        counts, usage = self.request_counts, self.usage
        if is_terminal(self.status) or not self.live:
            return counts, usage
        live = list(self.live.values())
        completed = min(counts.total, counts.completed + sum(p.completed for p in live))
        failed = min(counts.total - completed, counts.failed + sum(p.failed for p in live))
        added_in = sum(p.input_tokens for p in live)
        added_out = sum(p.output_tokens for p in live)
        added_cached = sum(p.cached_tokens for p in live)
        return (
            RequestCounts(total=counts.total, completed=completed, failed=max(failed, 0)),
            TokenTotals(
                input_tokens=usage.input_tokens + added_in,
                output_tokens=usage.output_tokens + added_out,
                total_tokens=usage.total_tokens + added_in + added_out,
                cached_tokens=usage.cached_tokens + added_cached,
            ),
        )


class BatchChanges(BaseModel):
    """Header attributes a write after creation may SET (`batches.transition`, `batches.update`): only
    the fields given are written, each whole."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    errors: BatchErrors | None = None
    request_counts: RequestCounts | None = None
    shards_total: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    expires_at: int | None = None
    sealed: bool | None = None
    final_status: BatchStatus | None = None

    def assigned(self) -> dict[str, Any]:
        """The given fields as attribute values (a field given as None is SET to NULL)."""
        return self.model_dump(mode="json", include=self.model_fields_set)


class ResultPart(BaseModel):
    """One committed run of a shard's requests `[start, end)` (0-based within the shard): its result
    lines at `key` of the service bucket, successes in bytes `[0, output_bytes)`, failures after."""

    key: str
    start: int
    end: int
    output_bytes: int
    bytes: int


class Shard(Item):
    """A shard: `size` requests of a batch, from input line `first_line` (1-based), in the shard file
    `input_key`; requests `[0, next_index)` are committed (in `parts`, counted in the header)."""

    shard: int
    size: int
    first_line: int
    input_key: str
    state: Literal["pending", "done"] = "pending"
    next_index: int = 0
    parts: list[ResultPart] = Field(default_factory=list)
    completed: int = 0
    failed: int = 0
    attempts: int = Field(0, description="claims so far less continuations (handed back)")
    redrives: int | None = Field(None, description="re-drives by the sweeper; absent until the first")
    lease_owner: str | None = None
    lease_until: int | None = Field(None, description="the lease's end; absent when not leased")
    updated_at: int | None = Field(None, description="time of the last commit")
    queued_at: int | None = Field(
        None, description="when a message for it was sent that no claim has received yet; absent once claimed"
    )

    def waiting(self, at: int, wait_seconds: int) -> bool:
        """True while a message for it waits in the queue (sent by prepare, a continuation or a
        re-drive, and not claimed since; see `waiting`): only a shard whose holder died, or whose
        message is gone, is re-driven."""
        return waiting(self.queued_at, at, wait_seconds)


def leased(lease_until: int | None, at: int) -> bool:
    """True when a lease ending at `lease_until` (Unix seconds; None: no lease) is live at `at`: until
    the second `lease_until` has passed (its holder renews it every third of a lease while it works)."""
    return lease_until is not None and lease_until >= at


def waiting(queued_at: int | None, at: int, wait_seconds: int) -> bool:
    """True while a message sent at `queued_at` (Unix seconds; None: none sent since the last claim)
    may still wait in its queue at `at`: younger than `wait_seconds` (older: SQS dropped it, or it kept
    failing before any claim and sits in the DLQ). Waiting in a backlog is not failure."""
    return queued_at is not None and at - queued_at < wait_seconds


class FileRecord(Item):
    """A file: the OpenAI File fields plus its owner and object (`where`: its storage, `data.locations`)."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = Field(None, description="Unix seconds: past it the sweeper deletes the file")
    account_id: str
    bucket: str
    key: str
    where: str | None = None
    counted: bool | None = Field(None, description="True: its bytes are in the account's storage counter")


class UploadRecord(Item):
    """An upload (`api.uploads`): the OpenAI Upload fields, its owner and the object its bytes go to;
    `file` is the File it became once completed."""

    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"] = "pending"
    mime_type: str
    account_id: str
    file_id: str
    bucket: str
    key: str
    file: FileObject | None = None
    parts: int | None = Field(None, description="parts added (`data.uploads.add_part`)")
    part_bytes: int | None = Field(None, description="the bytes of the parts added")
    reserved: bool | None = Field(
        None, description="True: its bytes and file are reserved in the account's storage (`data.storage`)"
    )


class UploadPart(Item):
    """A part of an upload (`POST /v1/uploads/{id}/parts`): `bytes` bytes at `key` of the service bucket."""

    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
    bytes: int
    key: str


class Slot(Item):
    """One slot of a bounded set (`data.inflight`): a `/v2` request in flight of an account, or a
    shard worker of an account on a model; `owner` holds it until `lease_until` (Unix seconds); `ttl`
    lets DynamoDB remove it once long expired."""

    owner: str
    lease_until: int
    ttl: int


class ApiKey(Item):
    """A stored API key (never the secret itself)."""

    key_id: str
    account_id: str
    name: str | None = None
    created_at: int
    revoked_at: int | None = None


class KeyPointer(Item):
    """What a key id leads to: the SHA-256 (hex) of its key's secret."""

    key_hash: str
    account_id: str


class Account(Item):
    """An account's settings. `None` limits mean the deployment's defaults (Settings)."""

    account_id: str
    allowed_buckets: list[str] = Field(
        default_factory=list,
        description="`s3://bucket` / `cos://bucket` the account may use whole, or `s3://bucket/prefix/` "
        "only under that prefix",
    )
    max_active_batches: int | None = Field(None, ge=1)
    max_creates_per_minute: int | None = Field(None, ge=1)
    max_infer_in_flight: int | None = Field(None, ge=1, description="`/v2` requests at once")
    max_storage_bytes: int | None = Field(None, ge=1, description="bytes of files and pending uploads")
    max_stored_files: int | None = Field(None, ge=1, description="files and pending uploads")
    max_pending_uploads: int | None = Field(None, ge=1)
    max_upload_parts: int | None = Field(None, ge=1, description="parts of one upload")
    webhook_url: str | None = Field(None, description="where batch webhooks go (`accounts.set_webhook`)")
    webhook_secret: str | None = Field(
        None, description="the Standard Webhooks signing secret, `whsec_` + base64 (never logged)", repr=False
    )
    webhook_previous_secret: str | None = Field(
        None,
        description="the secret before the last rotation, still signing until `webhook_previous_until`",
        repr=False,
    )
    webhook_previous_until: int | None = Field(None, description="Unix seconds: the rotation's grace ends")
    created_at: int | None = Field(None, description="None: the account has no settings item")

    def webhook_secrets(self, at: int) -> list[str]:
        """The secrets a delivery at `at` (Unix seconds) is signed with: the current one, and the one
        before the last rotation while its grace lasts (`accounts.rotate_webhook_secret`)."""
        secrets = [self.webhook_secret] if self.webhook_secret else []
        if self.webhook_previous_secret and at < (self.webhook_previous_until or 0):
            secrets.append(self.webhook_previous_secret)
        return secrets

    def allows(self, bucket_ref: str) -> bool:
        """True when `bucket_ref` (`s3://bucket` or `cos://bucket`) is on the allowlist, whole."""
        return bucket_ref in self.allowed_buckets

    def allows_key(self, bucket_ref: str, key: str) -> bool:
        """True when `key` of `bucket_ref` may be used: the bucket is allowed whole, or an allowed
        `<bucket_ref>/<prefix>/` starts the key (paths have no `..` segments: `locations.parse`)."""
        path = f"{bucket_ref}/{key}"
        return self.allows(bucket_ref) or any(
            entry.endswith("/") and path.startswith(entry) for entry in self.allowed_buckets
        )


class OpenBackfill(Item):
    """How far the sweeper got putting batch headers written before the `OpenBatches` index into it
    (`batches.backfill_open_index`): `position` is the table scan's next `ExclusiveStartKey`
    (`PK`, `SK`), `done` True once the scan ended."""

    done: bool = False
    position: dict[str, str] | None = None
