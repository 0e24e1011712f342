"""Helpers of the moto-backed tests of the pipeline modules: a batch created through `intake`, its
stages called directly (not through their handlers), its result files read back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import files, s3
from batchinfer.data.sqs import ShardMessage
from batchinfer.pipeline import intake, prepare
from batchinfer.pipeline.shard import worker
from support.moto_env import Aws


def create(
    aws: Aws, data: bytes, monkeypatch: pytest.MonkeyPatch, *, shard_size: int = 2, **fields: Any
) -> str:
    """Upload `data` as a batch input, create its batch (`intake.create_batch`, 24h window) with
    `SHARD_SIZE=shard_size` (and `REMOTE_SHARD_SIZE`) and drop the prepare message it sent; returns the
    batch id."""
    monkeypatch.setenv("SHARD_SIZE", str(shard_size))
    monkeypatch.setenv("REMOTE_SHARD_SIZE", str(shard_size))
    get_settings.cache_clear()
    batch_id = ids.new_batch_id()
    s3.put_bytes(aws.bucket, f"files/{batch_id}", data)
    new = {
        "batch_id": batch_id,
        "account_id": "default",
        "input_file_id": f"file-{batch_id}",
        "input_bucket": aws.bucket,
        "input_key": f"files/{batch_id}",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **fields,
    }
    intake.create_batch(intake.NewBatch(**new))
    assert aws.messages("PrepareQueue") == [{"batch_id": batch_id}]
    return batch_id


def prepared(
    aws: Aws, data: bytes, monkeypatch: pytest.MonkeyPatch, *, shard_size: int = 2, **fields: Any
) -> str:
    """`create`, then `prepare.prepare_batch` (which must start it), its shard messages dropped."""
    batch_id = create(aws, data, monkeypatch, shard_size=shard_size, **fields)
    assert prepare.prepare_batch(batch_id) == "in_progress"
    aws.messages("ShardsQueue")
    return batch_id


def prepare_failing(batch_id: str, target: object, name: str, error: Exception) -> None:
    """`prepare.prepare_batch` with `target.name` raising `error` (a Lambda timing out, SQS refusing a
    send ...), which must come out of it."""

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(target, name, fail)
        with pytest.raises(type(error)):
            prepare.prepare_batch(batch_id)


def run_shard(batch_id: str, shard: int, *, time_left_ms: Any = lambda: 900_000) -> str:
    """`worker.process_shard` for one shard message, as a Lambda with `time_left_ms()` left."""
    return worker.process_shard(
        ShardMessage(batch_id=batch_id, shard=shard), owner="test", time_left_ms=time_left_ms
    )


def result_lines(file_id: str | None) -> list[dict[str, Any]]:
    """The parsed lines of a result file (none for None)."""
    if file_id is None:
        return []
    record = files.get(file_id)
    return [json.loads(line) for line in s3.get_bytes(record.bucket, record.key).splitlines()]
