"""Each pipeline function against moto: prepare, shard worker (real embedded model), aggregator, sweeper.

Given an input file in S3 and the batch created through the shared create path, each test feeds
the stage's handler the SQS event it would get and checks DynamoDB, S3 and the queues afterwards.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, files, s3, shards
from batchinfer.data.items import BatchChanges
from batchinfer.data.table import now
from batchinfer.pipeline import intake
from support.moto_env import Aws, sqs_event

pytestmark = pytest.mark.model


def chat_line(custom_id: str, content: str, max_tokens: int = 3) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "smollm2-135m-instruct",
                "max_tokens": max_tokens,
                "seed": 7,
                "temperature": 0,
                "messages": [{"role": "user", "content": content}],
            },
        }
    )


def create(aws: Aws, text: str, *, shard_size: int = 2, monkeypatch: pytest.MonkeyPatch) -> str:
    """Upload `text`, create its batch (message to PrepareQueue) and return the batch id."""
    monkeypatch.setenv("SHARD_SIZE", str(shard_size))
    monkeypatch.setenv("REMOTE_SHARD_SIZE", str(shard_size))
    get_settings.cache_clear()
    s3.put_bytes(aws.bucket, "files/file-test", text.encode())
    batch_id = ids.new_batch_id()
    intake.create_batch(
        intake.NewBatch(
            batch_id=batch_id,
            account_id="default",
            input_file_id="file-test",
            input_bucket=aws.bucket,
            input_key="files/file-test",
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    )
    return batch_id


def prepare(aws: Aws) -> list[dict[str, Any]]:
    """Run PrepareFunction on what the PrepareQueue holds; return the shard messages it sent."""
    assert aws.invoke("PrepareFunction", sqs_event(aws.messages("PrepareQueue"))) == {"batchItemFailures": []}
    return aws.messages("ShardsQueue")


def read(aws: Aws, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    item = files.get(file_id)
    return [json.loads(line) for line in s3.get_bytes(item.bucket, item.key).splitlines()]


def run_to_end(aws: Aws, shard_messages: list[dict[str, Any]]) -> dict[str, Any]:
    assert aws.invoke("ShardWorkerFunction", sqs_event(shard_messages)) == {"batchItemFailures": []}
    finalize = aws.messages("FinalizeQueue")
    assert len(finalize) == 1
    assert aws.invoke("AggregatorFunction", sqs_event(finalize)) == {"batchItemFailures": []}
    header = batches.get(finalize[0]["batch_id"])
    assert header is not None
    return header


LINES = "\n".join(chat_line(f"req-{i}", f"Say the number {i}.") for i in range(1, 6)) + "\n"


def test_prepare_shards_in_input_order_and_starts_the_batch(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(moto_aws, "\n" + LINES, monkeypatch=monkeypatch)  # a blank first line still counts
    messages = prepare(moto_aws)
    assert messages == [{"batch_id": batch_id, "shard": n} for n in range(3)]
    header = batches.get(batch_id)
    assert (header.status, header.shards_total, header.request_counts.model_dump(), header.model) == (
        "in_progress",
        3,
        {"total": 5, "completed": 0, "failed": 0},
        "smollm2-135m-instruct",
    )
    found = list(shards.query(batch_id))
    assert [(s.shard, s.size, s.first_line, s.state) for s in found] == [
        (0, 2, 2, "pending"),
        (1, 2, 4, "pending"),
        (2, 1, 6, "pending"),
    ]
    first = s3.get_bytes(moto_aws.bucket, found[0].input_key).split(b"\n")[0]
    assert first.split(b"\t")[0] == b"2"


def test_prepare_twice_does_not_shard_twice(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    batch_id = create(moto_aws, LINES, monkeypatch=monkeypatch)
    message = moto_aws.messages("PrepareQueue")
    moto_aws.invoke("PrepareFunction", sqs_event(message))
    first = moto_aws.messages("ShardsQueue")
    assert len(first) == 3
    # Redelivered: re-sends only pending shards nobody holds and no message waits for (here none)
    moto_aws.invoke("PrepareFunction", sqs_event(message))
    assert moto_aws.messages("ShardsQueue") == []
    assert len(list(shards.query(batch_id))) == 3


def test_a_bad_file_fails_with_every_line_error(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    text = chat_line("a", "x") + "\n{not json\n" + chat_line("a", "y") + "\n"
    batch_id = create(moto_aws, text, monkeypatch=monkeypatch)
    assert prepare(moto_aws) == []
    header = batches.get(batch_id)
    assert header.status == "failed"
    assert [(e.code, e.line) for e in header.errors.data] == [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
    ]
    assert header.failed_at >= header.created_at


def test_a_missing_input_object_fails_the_batch_once(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    batch_id = create(moto_aws, LINES, monkeypatch=monkeypatch)
    s3.delete(moto_aws.bucket, "files/file-test")
    assert prepare(moto_aws) == []
    header = batches.get(batch_id)
    assert header.status == "failed"
    assert [e.model_dump() for e in header.errors.data] == [
        {
            "code": "input_file_unavailable",
            "line": None,
            "param": "input_file_id",
            "message": "the input file could not be read (NoSuchKey)",
        }
    ]


def test_worker_and_aggregator_complete_the_batch(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    create(moto_aws, LINES, monkeypatch=monkeypatch)
    header = run_to_end(moto_aws, prepare(moto_aws))
    assert header.status == "completed"
    assert header.request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    assert header.error_file_id is None
    output = read(moto_aws, header.output_file_id)
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(1, 6)]
    assert {line["response"]["status_code"] for line in output} == {200}
    assert all(line["response"]["body"]["object"] == "chat.completion" for line in output)
    usage = header.usage
    assert usage.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in output)
    assert usage.output_tokens == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in output
    )
    assert header.created_at <= header.in_progress_at <= header.finalizing_at <= header.completed_at


def test_a_rejected_request_goes_to_the_error_file(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        chat_line("ok-1", "Hi")
        + "\n"
        + chat_line("long", "lorem " * 4000)
        + "\n"
        + chat_line("ok-2", "Yo")
        + "\n"
    )
    create(moto_aws, text, shard_size=10, monkeypatch=monkeypatch)
    header = run_to_end(moto_aws, prepare(moto_aws))
    assert header.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert [line["custom_id"] for line in read(moto_aws, header.output_file_id)] == ["ok-1", "ok-2"]
    [error] = read(moto_aws, header.error_file_id)
    assert error["custom_id"] == "long"
    assert error["error"] is None
    assert error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["code"] == "context_length_exceeded"


def test_a_shard_message_delivered_twice_in_a_row_counts_once(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(moto_aws, LINES, shard_size=5, monkeypatch=monkeypatch)
    [message] = prepare(moto_aws)
    assert moto_aws.invoke("ShardWorkerFunction", sqs_event([message])) == {"batchItemFailures": []}
    [key] = [part.key for part in shards.get(batch_id, 0).parts]
    results = s3.get_bytes(moto_aws.bucket, key)
    assert moto_aws.invoke("ShardWorkerFunction", sqs_event([message])) == {"batchItemFailures": []}
    assert [part.key for part in shards.get(batch_id, 0).parts] == [key]
    assert s3.keys_under(moto_aws.bucket, f"batches/{batch_id}/results/") == [key]  # nothing more written
    assert s3.get_bytes(moto_aws.bucket, key) == results
    assert batches.get(batch_id).request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    assert len(moto_aws.messages("FinalizeQueue")) == 1


def test_a_shard_message_delivered_twice_at_once_counts_once(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(moto_aws, LINES, shard_size=5, monkeypatch=monkeypatch)
    [message] = prepare(moto_aws)
    results: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(moto_aws.invoke("ShardWorkerFunction", sqs_event([message])))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [{"batchItemFailures": []}] * 2
    shard = shards.get(batch_id, 0)
    assert (shard.state, shard.attempts, len(shard.parts)) == ("done", 1, 1)
    assert batches.get(batch_id).request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    assert len(moto_aws.messages("FinalizeQueue")) == 1


def test_redelivery_after_completion_changes_nothing(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    create(moto_aws, LINES, shard_size=5, monkeypatch=monkeypatch)
    [message] = prepare(moto_aws)
    header = run_to_end(moto_aws, [message])
    output = files.get(header.output_file_id)
    before = s3.get_bytes(output.bucket, output.key)
    assert moto_aws.invoke("ShardWorkerFunction", sqs_event([message])) == {"batchItemFailures": []}
    assert moto_aws.invoke("AggregatorFunction", sqs_event([{"batch_id": header.id}])) == {
        "batchItemFailures": []
    }
    after = batches.get(header.id)
    assert after == header
    assert s3.get_bytes(output.bucket, output.key) == before
    assert moto_aws.messages("FinalizeQueue") == []


def test_only_the_failing_record_of_an_event_is_reported(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(moto_aws, LINES, shard_size=2, monkeypatch=monkeypatch)
    first, _, third = prepare(moto_aws)
    event = sqs_event([first, {"batch_id": batch_id, "shard": "not-a-number"}, third])
    assert moto_aws.invoke("ShardWorkerFunction", event) == {"batchItemFailures": [{"itemIdentifier": "m-1"}]}
    assert batches.get(batch_id).request_counts.completed == 3


def test_cancel_keeps_finished_results_and_closes_the_rest(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(moto_aws, LINES, shard_size=2, monkeypatch=monkeypatch)
    first, *_ = prepare(moto_aws)
    moto_aws.invoke("ShardWorkerFunction", sqs_event([first]))
    from batchinfer.wire.status import BatchStatus

    assert batches.transition(batch_id, BatchStatus.CANCELLING) is not None
    assert moto_aws.invoke("AggregatorFunction", sqs_event([{"batch_id": batch_id}])) == {
        "batchItemFailures": []
    }
    header = batches.get(batch_id)
    assert header.status == "cancelled"
    assert header.request_counts.model_dump() == {"total": 5, "completed": 2, "failed": 3}
    assert [line["custom_id"] for line in read(moto_aws, header.output_file_id)] == ["req-1", "req-2"]
    errors = read(moto_aws, header.error_file_id)
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == [
        ("req-3", None, "batch_cancelled"),
        ("req-4", None, "batch_cancelled"),
        ("req-5", None, "batch_cancelled"),
    ]


def test_the_sweeper_expires_an_overdue_batch(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    batch_id = create(moto_aws, LINES, shard_size=2, monkeypatch=monkeypatch)
    first, *_ = prepare(moto_aws)
    moto_aws.invoke("ShardWorkerFunction", sqs_event([first]))
    batches.update(batch_id, BatchChanges(expires_at=now() - 1))
    assert moto_aws.invoke("SweeperFunction", {"detail-type": "Scheduled Event"}) == {
        "expired": 1,
        "prepare": 0,
        "shards": 0,
        "failed_shards": 0,
        "finalize": 0,
        "past_window": 1,
        "files_expired": 0,
        "uploads_expired": 0,
    }
    moto_aws.invoke("AggregatorFunction", sqs_event(moto_aws.messages("FinalizeQueue")))
    header = batches.get(batch_id)
    assert header.status == "expired"
    assert header.request_counts.model_dump() == {"total": 5, "completed": 2, "failed": 3}
    assert {e["error"]["code"] for e in read(moto_aws, header.error_file_id)} == {"batch_expired"}


def test_cancel_while_validating_ends_with_nothing_run(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(moto_aws, LINES, monkeypatch=monkeypatch)
    prepare_message = moto_aws.messages("PrepareQueue")
    from batchinfer.wire.status import BatchStatus

    assert batches.transition(batch_id, BatchStatus.CANCELLING) is not None
    assert moto_aws.invoke("AggregatorFunction", sqs_event([{"batch_id": batch_id}])) == {
        "batchItemFailures": []
    }
    assert moto_aws.invoke("PrepareFunction", sqs_event(prepare_message)) == {"batchItemFailures": []}
    header = batches.get(batch_id)
    assert (header.status, header.request_counts.model_dump()) == (
        "cancelled",
        {"total": 0, "completed": 0, "failed": 0},
    )
    assert (header.output_file_id, header.error_file_id) == (None, None)
    assert moto_aws.messages("ShardsQueue") == []


def test_a_backend_that_fails_every_request_still_ends_the_batch(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # Given a model served by an OpenAI-compatible server that is down (nothing listens on the port)
    registry = tmp_path / "models.yaml"
    registry.write_text(
        "models:\n  smollm2-135m-instruct:\n    backend: openai\n"
        "    base_url: http://127.0.0.1:9/v1\n    model: m\n    api_key: unused\n    timeout: 2\n"
    )
    monkeypatch.setenv("MODEL_REGISTRY", str(registry))
    monkeypatch.setattr("batchinfer.pipeline.shard.retry.BACKOFF_BASE_S", 0.01)
    batch_id = create(moto_aws, LINES, shard_size=5, monkeypatch=monkeypatch)
    # When it runs: every request is retried, then recorded with the backend's status and message
    header = run_to_end(moto_aws, prepare(moto_aws))
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 0, "failed": 5},
    )
    assert header.output_file_id is None
    errors = read(moto_aws, header.error_file_id)
    assert [line["custom_id"] for line in errors] == [f"req-{i}" for i in range(1, 6)]
    assert {line["response"]["status_code"] for line in errors} == {502}
    assert {line["response"]["body"]["error"]["code"] for line in errors} == {"upstream_unavailable"}
    assert batch_id == header.id
