"""Typed settings read once from the environment (set by `template.yaml` Globals, or by the local stack)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REGISTRY = Path(__file__).with_name("models.yaml")


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
    shard_size: int = Field(100, ge=1, le=10_000, description="requests per shard")
    worker_concurrency: int = Field(8, ge=1, le=256, description="requests in flight per shard worker")
    max_requests_per_file: int = Field(50_000, ge=1)
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1)
    max_line_bytes: int = Field(1024 * 1024, ge=1)
    max_line_errors: int = Field(1_000, ge=1, description="cap on errors.data entries of a failed batch")
    inbox_prefix: str = "inbox/"
    outbox_prefix: str = "outbox/"
    model_registry: Path = DEFAULT_REGISTRY
    # Stop a shard this long before the Lambda time limit and continue in a new message.
    time_reserve_ms: int = Field(30_000, ge=0)
    # A batch with no progress for this long has lost a message: the sweeper sends it again.
    stuck_after_seconds: int = Field(900, ge=1)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (validated once)."""
    return Settings()  # type: ignore[call-arg]
