"""`prepare.prepare_batch` against moto: what it does for each batch state, and how it fails.

The whole-handler flows (sharding in input order, a redelivered message, a bad or missing file) are in
test_functions.py; these call the module directly. No model runs: prepare only checks model names.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from batchinfer.core import aws, ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, keys, s3, shards
from batchinfer.data.items import ResultPart
from batchinfer.data.table import now
from batchinfer.pipeline import prepare, sweep
from batchinfer.wire.status import BatchStatus
from support.api_stack import MODEL, chat_line, jsonl
from support.data import batch_header
from support.moto_env import Aws
from support.pipeline import create, prepare_failing

FIVE = jsonl(*(chat_line(f"r{i}", f"Say {i}.") for i in range(1, 6)))
SEVEN = jsonl(*(chat_line(f"r{i}", f"Say {i}.") for i in range(1, 8)))


def shard_states(batch_id: str) -> list[tuple[int, int, int, str]]:
    return [(s.shard, s.size, s.first_line, s.state) for s in shards.query(batch_id)]


def shard_objects(aws: Aws, batch_id: str) -> list[str]:
    listed = s3.s3_client().list_objects_v2(Bucket=aws.bucket, Prefix=f"batches/{batch_id}/shards/")
    return [o["Key"] for o in listed.get("Contents", [])]


def test_an_unknown_batch_is_skipped(moto_aws: Aws) -> None:
    assert prepare.prepare_batch(ids.new_batch_id()) == "skipped"
    assert moto_aws.messages("ShardsQueue") == []


@pytest.mark.parametrize(
    "status",
    [
        BatchStatus.CANCELLING,
        BatchStatus.FINALIZING,
        BatchStatus.FAILED,
        BatchStatus.COMPLETED,
        BatchStatus.CANCELLED,
        BatchStatus.EXPIRED,
    ],
)
def test_a_batch_past_validating_is_skipped_untouched(moto_aws: Aws, status: BatchStatus) -> None:
    s3.put_bytes(moto_aws.bucket, "files/in", FIVE)
    header = batch_header(
        status=status, input_bucket=moto_aws.bucket, input_key="files/in", output_bucket=moto_aws.bucket
    )
    assert batches.put(header)
    assert prepare.prepare_batch(header.id) == "skipped"
    assert batches.get(header.id) == header
    assert (shard_states(header.id), shard_objects(moto_aws, header.id)) == ([], [])
    assert moto_aws.messages("ShardsQueue") == []


def test_a_batch_cancelled_while_it_is_sharded_is_not_started(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a cancel that lands once prepare has read the header and written its first shard item
    batch_id = create(moto_aws, FIVE, monkeypatch)
    real_put = shards.put

    def put_then_cancel(batch_id: str, shard: shards.Shard) -> bool:
        written = real_put(batch_id, shard)
        if shard.shard == 0:
            assert batches.transition(batch_id, BatchStatus.CANCELLING) is not None
        return written

    monkeypatch.setattr(prepare.shards, "put", put_then_cancel)
    # Then the conditional start fails: nothing is sent, and the header keeps what the cancel wrote
    assert prepare.prepare_batch(batch_id) == "skipped"
    header = batches.get(batch_id)
    assert (header.status, header.in_progress_at, header.shards_total, header.model) == (
        "cancelling",
        None,
        0,
        None,
    )
    assert header.request_counts.model_dump() == {"total": 0, "completed": 0, "failed": 0}
    assert moto_aws.messages("ShardsQueue") == []
    assert len(shard_states(batch_id)) == 3  # written before the start failed; the aggregator ignores them


def test_a_repeated_prepare_of_a_running_batch_resends_only_shards_neither_waiting_nor_leased(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(moto_aws, SEVEN, monkeypatch)
    assert prepare.prepare_batch(batch_id) == "in_progress"
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": n} for n in range(4)]
    # Given shard 0 done, shard 1 leased by a live worker, shard 2's message still waiting in the
    # queue (sent by prepare, never received), shard 3 claimed by a worker that died (its lease ran out)
    part = ResultPart(key=s3.result_key(batch_id, 0, 0, "worker"), start=0, end=2, output_bytes=0, bytes=0)
    assert shards.claim(batch_id, 0, owner="worker", lease_seconds=60) is not None
    assert shards.commit(
        batch_id, 0, part, owner="worker", size=2, completed=2, failed=0, input_tokens=0, output_tokens=0
    )
    assert shards.claim(batch_id, 1, owner="live", lease_seconds=60) is not None
    assert shards.claim(batch_id, 3, owner="dead", lease_seconds=-1) is not None
    before = batches.get(batch_id)
    # When the prepare message comes again
    assert prepare.prepare_batch(batch_id) == "resent"
    # Then only the dead worker's shard is sent again (and now waits for its message), nothing else
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": 3}]
    assert [(s.state, s.lease_owner, s.queued_at is not None) for s in shards.query(batch_id)] == [
        ("done", "worker", False),
        ("pending", "live", False),
        ("pending", None, True),
        ("pending", "dead", True),
    ]
    assert batches.get(batch_id).model_dump(exclude={"prepare_owner"}) == before.model_dump(
        exclude={"prepare_owner"}
    )


def test_a_prepare_that_died_before_starting_the_batch_is_redone_whole(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a first attempt that wrote every shard and died before its status write
    batch_id = create(moto_aws, FIVE, monkeypatch)

    prepare_failing(batch_id, prepare.batches, "transition", TimeoutError("the Lambda timed out"))
    first = [s3.get_bytes(moto_aws.bucket, key) for key in shard_objects(moto_aws, batch_id)]
    # When it is redelivered: the same shards, the batch started, every shard sent
    assert prepare.prepare_batch(batch_id) == "in_progress"
    assert [s3.get_bytes(moto_aws.bucket, key) for key in shard_objects(moto_aws, batch_id)] == first
    assert shard_states(batch_id) == [(0, 2, 1, "pending"), (1, 2, 3, "pending"), (2, 1, 5, "pending")]
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": n} for n in range(3)]
    header = batches.get(batch_id)
    assert (header.status, header.shards_total, header.request_counts.total) == ("in_progress", 3, 5)


def test_a_file_failing_after_full_shards_records_none(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two shards' worth of good lines, then a line that is not JSON
    batch_id = create(moto_aws, FIVE[:-1] + b"\n{oops\n", monkeypatch, shard_size=1)
    assert prepare.prepare_batch(batch_id) == "failed"
    header = batches.get(batch_id)
    assert (header.status, header.shards_total, header.in_progress_at) == ("failed", 0, None)
    assert [(e.code, e.line) for e in header.errors.data] == [("invalid_json_line", 6)]
    assert shard_states(batch_id) == []
    assert moto_aws.messages("ShardsQueue") == []


def test_max_line_errors_caps_the_errors_kept(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_LINE_ERRORS", "2")
    batch_id = create(moto_aws, b"[1]\n{x\n" + FIVE + b"null\n", monkeypatch)
    assert prepare.prepare_batch(batch_id) == "failed"
    assert [(e.code, e.line) for e in batches.get(batch_id).errors.data] == [
        ("invalid_json_line", 1),
        ("invalid_json_line", 2),
    ]


def test_models_are_those_of_the_configured_registry(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a registry that serves `other-model` only (its server is never called by prepare)
    registry = tmp_path / "models.yaml"
    registry.write_text(
        "models:\n  other-model:\n    backend: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n"
    )
    monkeypatch.setenv("MODEL_REGISTRY", str(registry))
    known = create(moto_aws, jsonl(chat_line("a", "Hi", model="other-model")), monkeypatch)
    unknown = create(moto_aws, jsonl(chat_line("a", "Hi", model=MODEL)), monkeypatch)
    assert (prepare.prepare_batch(known), prepare.prepare_batch(unknown)) == ("in_progress", "failed")
    assert batches.get(known).model == "other-model"
    assert [(e.code, e.line, e.param) for e in batches.get(unknown).errors.data] == [
        ("model_not_found", 1, "body.model")
    ]


def test_a_model_on_a_server_of_its_own_is_sharded_by_remote_shard_size(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given an in-process model and one on a server (never called by prepare), five requests each
    registry = tmp_path / "models.yaml"
    registry.write_text(
        f"models:\n  {MODEL}:\n    backend: llama_cpp\n"
        "  remote:\n    backend: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n"
    )
    monkeypatch.setenv("MODEL_REGISTRY", str(registry))
    local = create(moto_aws, jsonl(*(chat_line(c, "Hi") for c in "abcde")), monkeypatch)
    remote = create(moto_aws, jsonl(*(chat_line(c, "Hi", model="remote") for c in "abcde")), monkeypatch)
    # When they are prepared with ShardSize 2 and RemoteShardSize 3
    monkeypatch.setenv("REMOTE_SHARD_SIZE", "3")
    get_settings.cache_clear()
    assert (prepare.prepare_batch(local), prepare.prepare_batch(remote)) == ("in_progress", "in_progress")
    # Then the in-process model's batch has shards of 2, the other's of 3
    sizes = {b: [s.size for s in shards.query(b)] for b in (local, remote)}
    assert sizes == {local: [2, 2, 1], remote: [3, 2]}


def test_an_input_that_cannot_be_read_fails_with_its_error_code(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an input in a bucket that does not exist (a user path gone since the batch was created)
    batch_id = create(moto_aws, FIVE, monkeypatch, input_bucket="no-such-bucket")
    assert prepare.prepare_batch(batch_id) == "failed"
    assert [e.model_dump() for e in batches.get(batch_id).errors.data] == [
        {
            "code": "input_file_unavailable",
            "line": None,
            "param": "input_file_id",
            "message": "the input file could not be read (NoSuchBucket)",
        }
    ]


def test_errors_that_would_not_fit_in_one_item_are_cut_to_a_byte_budget(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 800 lines without a body, whose errors name the lines' other keys: the first line has
    # 3,000 of them (a message of 190 KB if all were named), past DynamoDB's 400 KB item limit if kept
    # whole (the cap must count bytes, not errors, or the batch stays `validating`)
    def line(n: int, keys: int) -> str:
        others = {f"key{k:04d}": k for k in range(keys)}
        return json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/chat/completions"} | others)

    lines = [line(1, 3000)] + [line(n, 10) for n in range(2, 801)]
    batch_id = create(moto_aws, "".join(f"{text}\n" for text in lines).encode(), monkeypatch)

    # When it is prepared
    outcome = prepare.prepare_batch(batch_id)

    # Then it fails with the first errors that fit the byte budget, each naming a few of the keys
    header = batches.get(batch_id)
    assert (outcome, header.status) == ("failed", "failed")
    data = [e.model_dump() for e in header.errors.data]
    budget = get_settings().max_errors_bytes
    assert budget - 1000 < len(json.dumps(data)) <= budget
    assert {(e["code"], e["param"]) for e in data} == {("missing_required_parameter", "body")}
    assert [e["line"] for e in data] == list(range(1, len(data) + 1))
    shown = "'key0000', 'key0001', 'key0002', 'key0003', 'key0004'"
    assert data[0]["message"] == f"Line 1: body is missing (the line has {shown} and 2,995 more)."
    assert data[1]["message"] == f"Line 2: body is missing (the line has {shown} and 5 more)."


LEASE = 2  # PREPARE_LEASE_SECONDS: beats every 2/3 s
NO_ACTIONS = {"expired": 0, "prepare": 0, "shards": 0, "failed_shards": 0, "finalize": 0, "past_window": 0}


@contextmanager
def paused_prepare(monkeypatch: pytest.MonkeyPatch, batch_id: str) -> Iterator[tuple[Future[str], list[str]]]:
    """`prepare.prepare_batch` in a thread, paused once it streamed its first shard (it holds the
    lease meanwhile); resumed when the block ends. Yields its future and the inputs read so far (one
    batch id per `s3.iter_chunks`, by any prepare)."""
    paused, resume, reads = threading.Event(), threading.Event(), []
    real_put, real_chunks = s3.put_bytes, s3.iter_chunks

    def put_bytes(bucket: str, key: str, data: bytes, **kwargs: object) -> None:
        real_put(bucket, key, data, **kwargs)
        if key == s3.shard_key(batch_id, 0):
            paused.set()
            assert resume.wait(30)

    def iter_chunks(bucket: str, key: str, **kwargs: object) -> Iterator[bytes]:
        reads.append(batch_id)
        return real_chunks(bucket, key, **kwargs)

    monkeypatch.setattr(prepare.s3, "put_bytes", put_bytes)
    monkeypatch.setattr(prepare.s3, "iter_chunks", iter_chunks)
    with ThreadPoolExecutor(1) as pool:
        try:
            running = pool.submit(prepare.prepare_batch, batch_id)
            assert paused.wait(10)
            yield running, reads
        finally:
            resume.set()


def test_a_prepare_at_work_past_stuck_after_is_neither_resent_nor_run_twice(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a prepare streaming a batch's input (paused after its first shard) longer than a lease and
    # than the sweeper's quiet time (a 20,000-line input takes minutes)
    monkeypatch.setenv("PREPARE_LEASE_SECONDS", str(LEASE))
    monkeypatch.setenv("STUCK_AFTER_SECONDS", "1")
    batch_id = create(moto_aws, FIVE, monkeypatch)
    with paused_prepare(monkeypatch, batch_id) as (running, reads):
        time.sleep(LEASE + 1)
        # Then its lease was renewed: the sweeper sends no prepare message ...
        assert sweep.sweep() == NO_ACTIONS
        assert moto_aws.messages("PrepareQueue") == []
        held = batches.get(batch_id)
        assert (held.status, held.prepare_queued_at) == ("validating", None)
        assert now() <= held.prepare_lease_until <= now() + LEASE
        # ... and a second delivery of its message is busy: it does not read the input
        assert prepare.prepare_batch(batch_id) == "busy"
        assert reads == [batch_id]
    # When the first prepare goes on, it starts the batch and sends each shard's message once
    assert running.result(timeout=30) == "in_progress"
    assert reads == [batch_id]
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": n} for n in range(3)]
    header = batches.get(batch_id)
    assert (header.status, header.prepare_lease_until, header.prepare_queued_at) == (
        "in_progress",
        None,
        None,
    )


def test_a_prepare_whose_lease_was_taken_stops_and_writes_no_status(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a prepare paused mid-stream
    monkeypatch.setenv("PREPARE_LEASE_SECONDS", str(LEASE))
    batch_id = create(moto_aws, FIVE, monkeypatch)
    with paused_prepare(monkeypatch, batch_id) as (running, _):
        # When another prepare takes the lease over (as if this one had been paused past its lease)
        aws.table().update_item(
            Key=keys.batch(batch_id),
            UpdateExpression="SET prepare_lease_until = :past",
            ExpressionAttributeValues={":past": now() - 10},
        )
        assert batches.claim_prepare(batch_id, owner="thief", lease_seconds=60) is not None
        time.sleep(LEASE)  # its next beats find the new owner
    # Then it stops: no status written, no shard message sent, the thief's lease left alone
    assert running.result(timeout=30) == "lost"
    header = batches.get(batch_id)
    assert (header.status, header.in_progress_at, header.shards_total, header.prepare_owner) == (
        "validating",
        None,
        0,
        "thief",
    )
    assert header.prepare_lease_until >= now()
    assert moto_aws.messages("ShardsQueue") == []


def test_a_prepare_that_failed_before_sending_its_shards_is_redone_by_the_next(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a prepare that started its batch and failed sending the shard messages (its lease lapsed
    # at once, still present: the next prepare knows the messages may be unsent)
    batch_id = create(moto_aws, FIVE, monkeypatch)

    prepare_failing(batch_id, prepare.sqs, "send", RuntimeError("SQS refused 3 message(s)"))
    assert (batches.get(batch_id).status, batches.get(batch_id).prepare_lease_until) == ("in_progress", 0)
    assert moto_aws.messages("ShardsQueue") == []
    # When its message is redelivered: every pending shard is sent, once (they looked queued)
    assert prepare.prepare_batch(batch_id) == "resent"
    assert moto_aws.messages("ShardsQueue") == [{"batch_id": batch_id, "shard": n} for n in range(3)]
    # and once that prepare finished, another delivery finds them waiting: nothing more is sent
    assert batches.get(batch_id).prepare_lease_until is None
    assert prepare.prepare_batch(batch_id) == "resent"
    assert moto_aws.messages("ShardsQueue") == []
