"""The shard worker under crashes: nothing lost, nothing counted twice, nothing re-sent to the model
except what was in flight. Real embedded model, moto in-process.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from batchinfer.core import chaos, ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, files, s3, shards
from batchinfer.data.items import BatchHeader
from batchinfer.data.table import CONFLICT_ATTEMPTS
from batchinfer.pipeline import intake
from batchinfer.pipeline.shard import worker
from support.data import intercept_transactions
from support.moto_env import Aws, sqs_event

pytestmark = pytest.mark.model


def chat_line(custom_id: str) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "smollm2-135m-instruct",
                "max_tokens": 2,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Say {custom_id}."}],
            },
        }
    )


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request the worker sends to the model (a spy in front of the real backend)."""
    sent: list[str] = []
    real_wrap = worker.backend_chaos.wrap

    class Spy:
        def __init__(self, backend: Any) -> None:
            self.backend = backend

        async def chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
            sent.append(body["messages"][0]["content"])
            return await self.backend.chat_completion(body)

    monkeypatch.setattr(worker.backend_chaos, "wrap", lambda backend: Spy(real_wrap(backend)))
    return sent


def start(aws: Aws, monkeypatch: pytest.MonkeyPatch, n: int = 5, **env: str) -> tuple[str, dict[str, Any]]:
    for key, value in {
        "SHARD_SIZE": str(n),
        "REMOTE_SHARD_SIZE": str(n),
        "SHARD_LEASE_SECONDS": "1",
        **env,
    }.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    s3.put_bytes(aws.bucket, "files/in", "".join(chat_line(f"r{i}") + "\n" for i in range(n)).encode())
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
    [message] = aws.messages("ShardsQueue")
    return batch_id, message


def crash(monkeypatch: pytest.MonkeyPatch, point: str, on_call: int) -> None:
    """The worker dies at `point` the `on_call`-th time it gets there."""
    seen = {"n": 0}

    def crash_point(fault: str) -> None:
        if fault == point:
            seen["n"] += 1
            if seen["n"] == on_call:
                raise chaos.ChaosCrash(fault)

    monkeypatch.setattr(chaos, "crash_point", crash_point)


def finish(aws: Aws, message: dict[str, Any]) -> BatchHeader:
    time.sleep(2.1)  # the dead worker's lease runs out (SHARD_LEASE_SECONDS=1, whole seconds)
    assert aws.invoke("ShardWorkerFunction", sqs_event([message])) == {"batchItemFailures": []}
    aws.invoke("AggregatorFunction", sqs_event(aws.messages("FinalizeQueue")))
    header = batches.get(message["batch_id"])
    assert header is not None
    return header


def output_ids(header: BatchHeader) -> list[str]:
    item = files.get(header.output_file_id)
    return [json.loads(line)["custom_id"] for line in s3.get_bytes(item.bucket, item.key).splitlines()]


def test_dies_after_writing_results_before_recording_them(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, calls: list[str]
) -> None:
    batch_id, message = start(moto_aws, monkeypatch)
    crash(monkeypatch, "crash_before_commit", on_call=1)
    with pytest.raises(BatchProcessingError, match="ChaosCrash"):  # the invocation dies: SQS redelivers
        moto_aws.invoke("ShardWorkerFunction", sqs_event([message]))
    [uncommitted] = s3.keys_under(moto_aws.bucket, s3.result_prefix(batch_id, 0, 0))
    written = s3.get_bytes(moto_aws.bucket, uncommitted)
    assert shards.get(batch_id, 0).next_index == 0
    assert len(calls) == 5

    header = finish(moto_aws, message)

    assert len(calls) == 5  # the written results were committed, not asked for again
    # copied to the retry's own key and committed there; the crashed writer's key is deleted
    [part] = shards.get(batch_id, 0).parts
    assert part.key != uncommitted
    assert s3.keys_under(moto_aws.bucket, s3.result_prefix(batch_id, 0, 0)) == [part.key]
    assert s3.get_bytes(moto_aws.bucket, part.key) == written
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 5, "failed": 0},
    )
    assert output_ids(header) == [f"r{i}" for i in range(5)]


def test_a_commit_that_keeps_conflicting_fails_the_invocation(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, calls: list[str]
) -> None:
    batch_id, message = start(moto_aws, monkeypatch)
    seen = intercept_transactions(monkeypatch, *["conflict"] * CONFLICT_ATTEMPTS)
    with pytest.raises(BatchProcessingError, match="TransactionConflict"):  # SQS redelivers: never "counted"
        moto_aws.invoke("ShardWorkerFunction", sqs_event([message]))
    assert len(seen.calls) == CONFLICT_ATTEMPTS
    assert shards.get(batch_id, 0).next_index == 0 and batches.get(batch_id).request_counts.completed == 0

    header = finish(moto_aws, message)

    assert len(calls) == 5  # the redelivery committed the written results, not asked for again
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 5, "failed": 0},
    )


def test_dies_halfway_through_a_shard(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, calls: list[str]
) -> None:
    # Checkpoint after every request, die after the second checkpoint.
    batch_id, message = start(moto_aws, monkeypatch, CHECKPOINT_SECONDS="0.001", WORKER_CONCURRENCY="1")
    crash(monkeypatch, "crash_after_commit", on_call=2)
    with pytest.raises(BatchProcessingError, match="ChaosCrash"):  # the invocation dies: SQS redelivers
        moto_aws.invoke("ShardWorkerFunction", sqs_event([message]))
    assert shards.get(batch_id, 0).next_index == 2

    header = finish(moto_aws, message)

    assert sorted(calls) == [f"Say r{i}." for i in range(5)]  # each request sent once
    shard = shards.get(batch_id, 0)
    assert [(p.start, p.end) for p in shard.parts] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 5, "failed": 0},
    )
    assert output_ids(header) == [f"r{i}" for i in range(5)]


def test_time_limit_commits_what_finished_and_continues(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, calls: list[str]
) -> None:
    batch_id, message = start(moto_aws, monkeypatch, WORKER_CONCURRENCY="1")
    # The invocation's time runs short as soon as the first request has been sent: 1 ms more than the
    # reserve (at the reserve itself, the per-request deadline, a request still in flight is dropped).
    short = get_settings().time_reserve_ms + 1
    outcome = worker.process_shard(
        worker.sqs.ShardMessage(**message), owner="first", time_left_ms=lambda: short if calls else 10**9
    )
    assert outcome == "continued"
    assert shards.get(batch_id, 0).next_index == 1
    [continuation] = moto_aws.messages("ShardsQueue")
    assert continuation == message
    assert moto_aws.invoke("ShardWorkerFunction", sqs_event([continuation])) == {"batchItemFailures": []}
    moto_aws.invoke("AggregatorFunction", sqs_event(moto_aws.messages("FinalizeQueue")))
    header = batches.get(batch_id)
    assert sorted(calls) == [f"Say r{i}." for i in range(5)]
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 5, "failed": 0},
    )
    assert output_ids(header) == [f"r{i}" for i in range(5)]


def test_continuations_are_not_attempts(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, calls: list[str]
) -> None:
    # Given a 5-request shard with at most 2 attempts, whose every invocation runs short of time after
    # one request (a healthy shard that needs 5 invocations)
    batch_id, message = start(moto_aws, monkeypatch, WORKER_CONCURRENCY="1", MAX_SHARD_ATTEMPTS="2")
    short = get_settings().time_reserve_ms + 1

    # When each continuation is run in turn
    outcomes = []
    for n in range(5):
        sent = len(calls)
        outcomes.append(
            worker.process_shard(
                worker.sqs.ShardMessage(**message),
                owner=f"invocation-{n}",
                time_left_ms=lambda sent=sent: short if len(calls) > sent else 10**9,
            )
        )
        assert moto_aws.messages("ShardsQueue") == ([message] if n < 4 else [])
    moto_aws.invoke("AggregatorFunction", sqs_event(moto_aws.messages("FinalizeQueue")))

    # Then every request was answered once, none given up as processing_failed
    header = batches.get(batch_id)
    assert outcomes == ["continued"] * 4 + ["done"]
    assert calls == [f"Say r{i}." for i in range(5)]
    assert shards.get(batch_id, 0).attempts == 1
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 5, "failed": 0},
    )
    assert output_ids(header) == [f"r{i}" for i in range(5)]


def test_a_shard_that_keeps_killing_its_worker_ends_as_error_lines(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, calls: list[str]
) -> None:
    _, message = start(moto_aws, monkeypatch, MAX_SHARD_ATTEMPTS="1")
    crash(monkeypatch, "crash_before_commit", on_call=1)
    with pytest.raises(BatchProcessingError, match="ChaosCrash"):  # attempt 1 dies
        moto_aws.invoke("ShardWorkerFunction", sqs_event([message]))
    monkeypatch.setattr(s3, "head_metadata", lambda bucket, key: None)  # and its results were lost
    header = finish(moto_aws, message)  # attempt 2 > MAX_SHARD_ATTEMPTS
    assert len(calls) == 5
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 0, "failed": 5},
    )
    item = files.get(header.error_file_id)
    lines = [json.loads(line) for line in s3.get_bytes(item.bucket, item.key).splitlines()]
    assert [(line["custom_id"], line["response"], line["error"]["code"]) for line in lines] == [
        (f"r{i}", None, "processing_failed") for i in range(5)
    ]


def test_a_shard_whose_messages_all_die_in_the_dlq_still_ends(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, calls: list[str]
) -> None:
    # Given a shard whose message never gets processed (say every delivery died and it sits in the DLQ)
    # (a message not received within SHARD_WAIT_SECONDS is gone)
    batch_id, _ = start(
        moto_aws, monkeypatch, STUCK_AFTER_SECONDS="1", MAX_SHARD_ATTEMPTS="2", SHARD_WAIT_SECONDS="1"
    )
    # When the sweeper finds it stuck: it re-drives it twice, then gives up on it
    sweeps = []
    for _ in range(3):
        time.sleep(1.1)
        sweeps.append(moto_aws.invoke("SweeperFunction", {}))
        moto_aws.messages("ShardsQueue")  # the re-driven messages die too
    assert [(s["shards"], s["failed_shards"]) for s in sweeps] == [(1, 0), (1, 0), (0, 1)]
    # Then the batch ends with those lines in error.jsonl
    moto_aws.invoke("AggregatorFunction", sqs_event(moto_aws.messages("FinalizeQueue")))
    header = batches.get(batch_id)
    assert calls == []
    assert (header.status, header.request_counts.model_dump()) == (
        "completed",
        {"total": 5, "completed": 0, "failed": 5},
    )
    item = files.get(header.error_file_id)
    lines = [json.loads(line) for line in s3.get_bytes(item.bucket, item.key).splitlines()]
    assert {line["error"]["code"] for line in lines} == {"processing_failed"}
