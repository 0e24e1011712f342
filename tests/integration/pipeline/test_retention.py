"""Result files that expire (`output_expires_after`): the aggregator dates them, the sweeper deletes
them once due, object and File record, and a second sweep finds nothing to do."""

from __future__ import annotations

import json

import pytest

from batchinfer.core import ids
from batchinfer.data import batches, files, s3
from batchinfer.data.items import FileRecord
from batchinfer.pipeline import intake, retention
from support.moto_env import Aws, sqs_event

pytestmark = pytest.mark.model


LINE = json.dumps(
    {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "smollm2-135m-instruct",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}],
        },
    }
)


def run_batch(aws: Aws, *, output_expires_after: int) -> str:
    """A one-line batch created with `output_expires_after`, run through prepare, worker, aggregator."""
    s3.put_bytes(aws.bucket, "files/file-exp", (LINE + "\n").encode())
    batch_id = ids.new_batch_id()
    intake.create_batch(
        intake.NewBatch(
            batch_id=batch_id,
            account_id="default",
            input_file_id="file-exp",
            input_bucket=aws.bucket,
            input_key="files/file-exp",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            output_expires_after=output_expires_after,
        )
    )
    for function, queue in (
        ("PrepareFunction", "PrepareQueue"),
        ("ShardWorkerFunction", "ShardsQueue"),
        ("AggregatorFunction", "FinalizeQueue"),
    ):
        assert aws.invoke(function, sqs_event(aws.messages(queue))) == {"batchItemFailures": []}
    return batch_id


def sweep_at(aws: Aws, at: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run the SweeperFunction as if it were `at` (Unix seconds); its `files_expired`."""
    monkeypatch.setattr(retention, "now", lambda: at)
    return aws.invoke("SweeperFunction", {"detail-type": "Scheduled Event"})["files_expired"]


def test_result_files_expire_when_due_and_only_then(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a finished batch created with output_expires_after 3600 s
    header = batches.get(run_batch(moto_aws, output_expires_after=3600))
    assert header is not None and header.status == "completed"
    created_at = header.created_at
    assert header.output_expires_at == created_at + 3600
    record = files.get(header.output_file_id or "")
    assert record is not None and record.expires_at == created_at + 3600

    # When the sweeper runs a second before, at, and after the expiry
    early = sweep_at(moto_aws, created_at + 3599, monkeypatch)
    still_there = files.get(record.id) is not None and s3.size(record.bucket, record.key) is not None
    due = sweep_at(moto_aws, created_at + 3600, monkeypatch)
    again = sweep_at(moto_aws, created_at + 7200, monkeypatch)

    # Then the file goes exactly once it is due: its object and its File record
    assert (early, still_there, due, again) == (0, True, 1, 0)
    assert files.get(record.id) is None
    assert s3.size(record.bucket, record.key) is None
    assert files.due_expiries(created_at + 10**6) == []


def test_a_file_deleted_by_its_owner_first_is_skipped(moto_aws: Aws) -> None:
    record = FileRecord(
        id="file-gone",
        bytes=1,
        created_at=100,
        filename="x",
        purpose="batch_output",
        expires_at=200,
        account_id="a",
        bucket=moto_aws.bucket,
        key="batches/b/output.jsonl",
    )
    files.schedule_expiry(record)  # the record itself was deleted (or never written)
    assert retention.expire_files(at=200) == 1
    assert files.due_expiries(10**6) == []
