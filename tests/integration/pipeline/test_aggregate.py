"""`aggregate.finalize_batch` against moto: which batches it ends, and the files and counts it writes.

Shards run on the real worker and HTTP backend with a scripted model (`support.scripted`: prompts
holding `FAIL` get a 400). Whole-handler flows (completion, cancel after a shard, a redelivered
finalize) are in test_functions.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from batchinfer.core import chaos, ids
from batchinfer.data import batches, files, s3, shards
from batchinfer.data.items import BatchChanges
from batchinfer.data.table import now
from batchinfer.pipeline import aggregate, prepare, sweep
from batchinfer.wire.status import BatchStatus
from support.api_stack import HoldableUpstream, chat_line, jsonl
from support.data import batch_header
from support.moto_env import Aws
from support.pipeline import create, prepared, result_lines, run_shard
from support.scripted import SCRIPTED, scripted_model


@pytest.fixture
def upstream(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldableUpstream]:
    with scripted_model(tmp_path, monkeypatch) as served:
        yield served


def lines(*prompts: str) -> bytes:
    """A batch input: request `r<n>` asks the scripted model `prompts[n-1]`."""
    return jsonl(*(chat_line(f"r{n}", prompt, model=SCRIPTED) for n, prompt in enumerate(prompts, 1)))


def summary(file_id: str | None) -> list[tuple[str, int | None, str | None]]:
    """(custom_id, response status code, error code) of each line of a result file."""
    return [
        (
            line["custom_id"],
            line["response"] and line["response"]["status_code"],
            line["error"] and line["error"]["code"],
        )
        for line in result_lines(file_id)
    ]


def arm_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next aggregator run dies between writing output.jsonl and error.jsonl (once)."""
    armed = [True]

    def crash_point(fault: str) -> None:
        if fault == "crash_in_aggregator" and armed:
            armed.clear()
            raise chaos.ChaosCrash(fault)

    monkeypatch.setattr(chaos, "crash_point", crash_point)


def test_an_unknown_batch_is_skipped(moto_aws: Aws) -> None:
    assert aggregate.finalize_batch(ids.new_batch_id()) == "skipped"


@pytest.mark.parametrize(
    "status", [BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED]
)
def test_a_terminal_batch_is_skipped_untouched(moto_aws: Aws, status: BatchStatus) -> None:
    header = batch_header(status=status, sealed=True, output_bucket=moto_aws.bucket)
    assert batches.put(header)
    assert aggregate.finalize_batch(header.id) == "skipped"
    assert batches.get(header.id) == header
    assert (
        s3.s3_client().list_objects_v2(Bucket=moto_aws.bucket, Prefix=header.output_prefix).get("KeyCount")
        == 0
    )


def test_a_batch_with_shards_left_is_not_sealed(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = prepared(moto_aws, lines("a", "b", "c", "d"), monkeypatch)
    assert run_shard(batch_id, 0) == "done"
    before = batches.get(batch_id)
    # An early finalize message (a duplicate, or the sweeper's) changes nothing
    assert aggregate.finalize_batch(batch_id) == "skipped"
    assert batches.get(batch_id) == before
    assert before.sealed is None
    # and the last shard still commits and ends the batch
    assert run_shard(batch_id, 1) == "done"
    assert aggregate.finalize_batch(batch_id) == "completed"
    assert batches.get(batch_id).request_counts.model_dump() == {"total": 4, "completed": 4, "failed": 0}


def test_a_batch_cancelled_before_it_ran_ends_with_no_lines(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a cancel that landed while prepare was writing shard items (they stay, all pending)
    batch_id = create(moto_aws, lines("a", "b", "c"), monkeypatch)
    real_put = shards.put

    def put_then_cancel(batch_id: str, shard: Any) -> bool:
        if shard.shard == 0:
            batches.transition(batch_id, BatchStatus.CANCELLING)
        return real_put(batch_id, shard)

    with monkeypatch.context() as patch:
        patch.setattr(prepare.shards, "put", put_then_cancel)
        assert prepare.prepare_batch(batch_id) == "skipped"
    assert [s.state for s in shards.query(batch_id)] == ["pending", "pending"]
    # Then its pending shards are not taken for requests that never ran
    assert aggregate.finalize_batch(batch_id) == "cancelled"
    header = batches.get(batch_id)
    assert (header.status, header.output_file_id, header.error_file_id) == ("cancelled", None, None)
    assert header.request_counts.model_dump() == {"total": 0, "completed": 0, "failed": 0}
    assert [files.get(ids.result_file_id(batch_id, kind)) for kind in ("output", "error")] == [None, None]
    assert upstream.arrivals == []


def test_an_expired_batch_keeps_what_ran_and_closes_the_rest(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given one request in flight at a time: shard 0 done, shard 1 stopped after its first request
    # (the Lambda ran short), shard 2 never run
    monkeypatch.setenv("WORKER_CONCURRENCY", "1")
    batch_id = prepared(moto_aws, lines("a", "FAIL b", "c", "d", "e"), monkeypatch)
    assert run_shard(batch_id, 0) == "done"
    assert (
        run_shard(batch_id, 1, time_left_ms=lambda: 900_000 if len(upstream.arrivals) < 3 else 0)
        == "continued"
    )
    assert (shards.get(batch_id, 1).next_index, upstream.arrivals) == (1, ["a", "FAIL b", "c"])
    # When the sweeper finds it past its window, and the aggregator ends it
    batches.update(batch_id, BatchChanges(expires_at=now() - 1))
    assert sweep.sweep()["expired"] == 1
    assert aggregate.finalize_batch(batch_id) == "expired"
    # Then the requests that ran keep their results, and each one that did not is a batch_expired line
    header = batches.get(batch_id)
    assert (header.status, header.request_counts.model_dump()) == (
        "expired",
        {"total": 5, "completed": 2, "failed": 3},
    )
    assert summary(header.output_file_id) == [("r1", 200, None), ("r3", 200, None)]
    assert summary(header.error_file_id) == [
        ("r2", 400, None),
        ("r4", None, "batch_expired"),
        ("r5", None, "batch_expired"),
    ]
    assert header.finalizing_at <= header.expired_at


@pytest.mark.parametrize(
    ("final", "errors"),
    [
        ("completed", [("r2", 400, None)]),
        ("cancelled", [("r2", 400, None), ("r3", None, "batch_cancelled")]),
    ],
)
def test_a_crash_between_the_files_then_a_rerun_rewrites_the_same_files(
    moto_aws: Aws,
    upstream: HoldableUpstream,
    monkeypatch: pytest.MonkeyPatch,
    final: str,
    errors: list[tuple[str, int | None, str | None]],
) -> None:
    batch_id = prepared(moto_aws, lines("a", "FAIL b", "c"), monkeypatch)
    assert run_shard(batch_id, 0) == "done"
    if final == "completed":
        assert run_shard(batch_id, 1) == "done"
    else:
        assert batches.transition(batch_id, BatchStatus.CANCELLING) is not None
    # When the first run dies after writing output.jsonl: the batch stays sealed, not ended
    arm_crash(monkeypatch)
    with pytest.raises(chaos.ChaosCrash):
        aggregate.finalize_batch(batch_id)
    crashed = batches.get(batch_id)
    assert (crashed.status, crashed.sealed, crashed.final_status, crashed.output_file_id) == (
        "finalizing" if final == "completed" else "cancelling",
        True,
        final,
        None,
    )
    output_id = ids.result_file_id(batch_id, "output")
    record = files.get(output_id)
    written = s3.get_bytes(record.bucket, record.key)
    assert files.get(ids.result_file_id(batch_id, "error")) is None
    # Then the redelivered message writes the same output again, the error file, and ends the batch
    assert aggregate.finalize_batch(batch_id) == final
    header = batches.get(batch_id)
    assert (header.status, header.output_file_id, header.error_file_id) == (
        final,
        output_id,
        ids.result_file_id(batch_id, "error"),
    )
    assert s3.get_bytes(record.bucket, record.key) == written
    assert summary(output_id) == [("r1", 200, None)] + ([("r3", 200, None)] if final == "completed" else [])
    assert summary(header.error_file_id) == errors
    assert header.request_counts.model_dump() == {
        "total": 3,
        "completed": 3 - len(errors),
        "failed": len(errors),
    }


def test_a_batch_without_failures_has_no_error_file(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = prepared(moto_aws, lines("a", "b", "c"), monkeypatch, output_prefix="outbox/q1/")
    assert [run_shard(batch_id, n) for n in (0, 1)] == ["done", "done"]
    before = now()
    assert aggregate.finalize_batch(batch_id) == "completed"
    header = batches.get(batch_id)
    assert (header.output_file_id, header.error_file_id) == (ids.result_file_id(batch_id, "output"), None)
    assert files.get(ids.result_file_id(batch_id, "error")) is None
    output = s3.get_bytes(moto_aws.bucket, "outbox/q1/output.jsonl")
    # No error file is written at all (OpenAI: `error_file_id` null when no request failed).
    with pytest.raises(ClientError) as missing:
        s3.get_bytes(moto_aws.bucket, "outbox/q1/error.jsonl")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    record = files.get(header.output_file_id)
    assert before <= record.created_at <= now()
    assert record.model_dump(exclude={"created_at"}) == {
        "id": header.output_file_id,
        "object": "file",
        "bytes": len(output),
        "filename": f"{batch_id}_output.jsonl",
        "purpose": "batch_output",
        "status": "processed",
        "expires_at": None,  # no output_expires_after (an inbox batch never has one)
        "account_id": "default",
        "bucket": moto_aws.bucket,
        "key": "outbox/q1/output.jsonl",
        "where": "",
        "counted": None,  # a result file is in no storage quota
    }
    assert summary(header.output_file_id) == [("r1", 200, None), ("r2", 200, None), ("r3", 200, None)]


def test_two_aggregators_at_once_end_the_batch_once(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = prepared(moto_aws, lines("a", "FAIL b"), monkeypatch)
    assert run_shard(batch_id, 0) == "done"
    outcomes: list[str] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(aggregate.finalize_batch(batch_id))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["completed", "skipped"]
    header = batches.get(batch_id)
    assert header.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
    assert (summary(header.output_file_id), summary(header.error_file_id)) == (
        [("r1", 200, None)],
        [("r2", 400, None)],
    )


def test_the_error_file_of_a_cancelled_batch_is_in_input_order(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given shard 1 run (with a failure) while shard 0 never ran, then a cancel
    batch_id = prepared(moto_aws, lines("a", "b", "FAIL c", "d"), monkeypatch)
    assert run_shard(batch_id, 1) == "done"
    assert batches.transition(batch_id, BatchStatus.CANCELLING) is not None
    assert aggregate.finalize_batch(batch_id) == "cancelled"
    header = batches.get(batch_id)
    assert summary(header.output_file_id) == [("r4", 200, None)]
    assert summary(header.error_file_id) == [
        ("r1", None, "batch_cancelled"),
        ("r2", None, "batch_cancelled"),
        ("r3", 400, None),
    ]


def test_results_that_cannot_be_written_end_the_batch_failed_after_bounded_attempts(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch that ran, whose output bucket is gone (deleted, or access revoked)
    monkeypatch.setenv("MAX_FINALIZE_ATTEMPTS", "3")
    batch_id = prepared(
        moto_aws, lines("a", "b", "c"), monkeypatch, output_bucket="batchinfer-gone", output_prefix="out/"
    )
    assert [run_shard(batch_id, n) for n in (0, 1)] == ["done", "done"]

    # When the aggregator tries: the first attempts fail (SQS and the sweeper send it again)
    for _ in range(2):
        with pytest.raises(ClientError, match="NoSuchBucket"):
            aggregate.finalize_batch(batch_id)
        assert batches.get(batch_id).status == "finalizing"

    # Then the last one ends the batch failed, saying why, and it stays so
    assert aggregate.finalize_batch(batch_id) == "failed"
    header = batches.get(batch_id)
    assert (header.status, header.output_file_id, header.error_file_id) == ("failed", None, None)
    assert header.failed_at is not None
    assert [e.model_dump() for e in header.errors.data] == [
        {
            "code": "output_write_failed",
            "message": "The batch's results could not be written to s3://batchinfer-gone/out/ in 3 "
            "attempts (NoSuchBucket): check that the location exists and that batchinfer may write to it.",
            "param": None,
            "line": None,
        }
    ]
    assert header.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert aggregate.finalize_batch(batch_id) == "skipped"


def test_an_output_endpoint_that_cannot_be_reached_ends_the_batch_failed_after_bounded_attempts(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch that ran, whose output endpoint is gone (no connection at all: a BotoCoreError)
    monkeypatch.setenv("MAX_FINALIZE_ATTEMPTS", "2")
    batch_id = prepared(moto_aws, lines("a", "b", "c"), monkeypatch, output_prefix="out/")
    assert [run_shard(batch_id, n) for n in (0, 1)] == ["done", "done"]

    def unreachable(bucket: str, key: str, chunks: Iterator[bytes], **_: Any) -> int:
        next(iter(chunks))  # the parts are read: only the write fails
        raise EndpointConnectionError(endpoint_url="https://cos.gone.example.com")

    monkeypatch.setattr(aggregate.s3, "upload_stream", unreachable)
    # When the aggregator tries twice
    with pytest.raises(EndpointConnectionError):
        aggregate.finalize_batch(batch_id)
    assert aggregate.finalize_batch(batch_id) == "failed"
    # Then the batch ended failed, saying why
    [entry] = batches.get(batch_id).errors.data
    assert (entry.code, "in 2 attempts (EndpointConnectionError)" in entry.message) == (
        "output_write_failed",
        True,
    )


def test_a_network_failure_reading_the_batch_s_own_parts_is_not_counted(
    moto_aws: Aws, upstream: HoldableUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch that ran, whose parts cannot be read for now
    monkeypatch.setenv("MAX_FINALIZE_ATTEMPTS", "1")
    batch_id = prepared(moto_aws, lines("a", "b", "c"), monkeypatch)
    assert [run_shard(batch_id, n) for n in (0, 1)] == ["done", "done"]
    read = s3.iter_ranges

    def flaky(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        raise EndpointConnectionError(endpoint_url="https://s3.us-east-1.amazonaws.com")
        yield b""

    # When the aggregator runs: it fails without counting, then succeeds once reads work again
    monkeypatch.setattr(aggregate.s3, "iter_ranges", flaky)
    with pytest.raises(aggregate.SourceUnreadable):
        aggregate.finalize_batch(batch_id)
    assert batches.get(batch_id).status == "finalizing"
    monkeypatch.setattr(aggregate.s3, "iter_ranges", read)
    assert aggregate.finalize_batch(batch_id) == "completed"
