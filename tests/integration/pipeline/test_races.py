"""Races between the last shard's commit and a cancel or an expiry: whichever wins, every
line ends in exactly one result file, counts add up and the status is terminal.

The races are DynamoDB's: the model is a scripted upstream (`support.scripted`), answering at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchinfer.core import chaos, ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, files, s3
from batchinfer.data.items import BatchChanges, BatchHeader
from batchinfer.data.table import now
from batchinfer.pipeline import intake
from batchinfer.wire.status import BatchStatus
from support.invariant import assert_batch_invariant
from support.moto_env import Aws, sqs_event
from support.scripted import SCRIPTED, scripted_model

TEXT = "".join(
    json.dumps(
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": SCRIPTED,
                "max_tokens": 2,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Say {i}."}],
            },
        }
    )
    + "\n"
    for i in range(4)
)


@pytest.fixture(autouse=True)
def _scripted(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with scripted_model(tmp_path, monkeypatch):
        yield


def start(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[dict[str, Any]]]:
    monkeypatch.setenv("SHARD_SIZE", "2")
    monkeypatch.setenv("REMOTE_SHARD_SIZE", "2")
    get_settings.cache_clear()
    s3.put_bytes(aws.bucket, "files/in", TEXT.encode())
    batch_id = ids.new_batch_id()
    intake.create_batch(
        intake.NewBatch(
            batch_id=batch_id,
            account_id="default",
            input_file_id="f",
            input_bucket=aws.bucket,
            input_key="files/in",
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    )
    aws.invoke("PrepareFunction", sqs_event(aws.messages("PrepareQueue")))
    return batch_id, aws.messages("ShardsQueue")


def file_bytes(file_id: str | None) -> bytes | None:
    if file_id is None:
        return None
    item = files.get(file_id)
    return s3.get_bytes(item.bucket, item.key)


def during_last_commit(monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Run `action` just before the worker commits (the race's other side)."""

    def crash_point(fault: str) -> None:
        if fault == "crash_before_commit":
            action()

    monkeypatch.setattr(chaos, "crash_point", crash_point)


def finish(aws: Aws, batch_id: str) -> BatchHeader:
    aws.invoke("AggregatorFunction", sqs_event(aws.messages("FinalizeQueue") or [{"batch_id": batch_id}]))
    header = batches.get(batch_id)
    assert_batch_invariant(
        header.model_dump(), TEXT, file_bytes(header.output_file_id), file_bytes(header.error_file_id)
    )
    return header


def test_a_cancel_during_the_last_commit_keeps_its_answers(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id, (first, last) = start(moto_aws, monkeypatch)
    moto_aws.invoke("ShardWorkerFunction", sqs_event([first]))
    waited: list[Any] = []

    def cancel_and_aggregate() -> None:
        batches.transition(batch_id, BatchStatus.CANCELLING)
        waited.append(moto_aws.invoke("AggregatorFunction", sqs_event([{"batch_id": batch_id}])))
        waited.append(batches.get(batch_id))

    during_last_commit(monkeypatch, cancel_and_aggregate)
    moto_aws.invoke("ShardWorkerFunction", sqs_event([last]))  # the aggregator waited for its lease
    header = finish(moto_aws, batch_id)
    # The aggregator did not end the batch under the worker's live lease: nothing answered is lost.
    assert (waited[1].status, waited[1].sealed) == ("cancelling", None)
    assert (header.status, header.request_counts.model_dump()) == (
        "cancelled",
        {"total": 4, "completed": 4, "failed": 0},
    )


def test_last_shard_wins_against_a_cancel(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    batch_id, (first, last) = start(moto_aws, monkeypatch)
    moto_aws.invoke("ShardWorkerFunction", sqs_event([first]))
    during_last_commit(monkeypatch, lambda: batches.transition(batch_id, BatchStatus.CANCELLING))
    moto_aws.invoke("ShardWorkerFunction", sqs_event([last]))  # commits: cancelling does not seal by itself
    header = finish(moto_aws, batch_id)
    assert (header.status, header.request_counts.model_dump()) == (
        "cancelled",
        {"total": 4, "completed": 4, "failed": 0},
    )


def test_an_expiry_during_the_last_commit_keeps_its_answers(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id, (first, last) = start(moto_aws, monkeypatch)
    moto_aws.invoke("ShardWorkerFunction", sqs_event([first]))

    def expire() -> None:
        batches.update(batch_id, BatchChanges(expires_at=now() - 1))
        moto_aws.invoke("SweeperFunction", {})

    during_last_commit(monkeypatch, expire)
    moto_aws.invoke("ShardWorkerFunction", sqs_event([last]))  # its commit still counts: not sealed
    header = finish(moto_aws, batch_id)
    assert (header.status, header.request_counts.model_dump()) == (
        "expired",
        {"total": 4, "completed": 4, "failed": 0},
    )
    assert header.error_file_id is None


def test_completion_wins_against_expiry(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    batch_id, messages = start(moto_aws, monkeypatch)
    moto_aws.invoke("ShardWorkerFunction", sqs_event(messages))
    moto_aws.invoke("AggregatorFunction", sqs_event(moto_aws.messages("FinalizeQueue")))
    batches.update(batch_id, BatchChanges(expires_at=now() - 1))
    assert moto_aws.invoke("SweeperFunction", {})["expired"] == 0  # terminal batches are never reopened
    header = finish(moto_aws, batch_id)
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 4, "completed": 4, "failed": 0},
    )


def test_a_cancel_after_a_worker_crashed_before_its_commit_keeps_its_part(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a first shard whose worker wrote its part and died before the commit (its lease ran out)
    monkeypatch.setenv("SHARD_LEASE_SECONDS", "1")
    batch_id, (first, _) = start(moto_aws, monkeypatch)

    def crash_point(fault: str) -> None:
        if fault == "crash_before_commit":
            raise chaos.ChaosCrash(fault)

    monkeypatch.setattr(chaos, "crash_point", crash_point)
    with pytest.raises(Exception, match="failed processing"):
        moto_aws.invoke("ShardWorkerFunction", sqs_event([first]))
    assert batches.get(batch_id).request_counts.completed == 0
    time.sleep(2.1)  # lease_until (whole seconds) is behind us

    # When the batch is cancelled and the aggregator runs
    batches.transition(batch_id, BatchStatus.CANCELLING)
    header = finish(moto_aws, batch_id)

    # Then the crashed worker's answers are committed and kept; the shard that never ran is cancelled
    assert (header.status, header.request_counts.model_dump()) == (
        "cancelled",
        {"total": 4, "completed": 2, "failed": 2},
    )
    output = [json.loads(line)["custom_id"] for line in file_bytes(header.output_file_id).splitlines()]
    errors = [json.loads(line) for line in file_bytes(header.error_file_id).splitlines()]
    assert output == ["r0", "r1"]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("r2", "batch_cancelled"),
        ("r3", "batch_cancelled"),
    ]
