"""Every message about a batch carries its account as `MessageGroupId` (SQS fair queues), against moto.

The queues stay standard queues: moto receives with `MessageSystemAttributeNames=["MessageGroupId"]`
(`Aws.grouped`) and answers with the group each message was sent with. Which receiver gets which
message first is the local stack's matter (tests/integration/local/test_fair_delivery.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import batches, s3, shards
from batchinfer.data.items import BatchChanges
from batchinfer.data.table import now
from batchinfer.pipeline import intake, prepare, sweep
from batchinfer.wire.status import BatchStatus
from support.api_stack import chat_line, jsonl
from support.moto_env import Aws
from support.pipeline import create, prepared, run_shard
from support.scripted import SCRIPTED, scripted_model

ACCOUNT = "acct-fair"


@pytest.fixture(autouse=True)
def _scripted(moto_aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with scripted_model(tmp_path, monkeypatch):
        yield


def lines(n: int) -> bytes:
    return jsonl(*(chat_line(f"r{i}", f"Say {i}.", model=SCRIPTED) for i in range(n)))


def sweep_later(seconds: int) -> dict[str, int]:
    """One sweep with the sweeper's clock `seconds` ahead."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep, "now", lambda: now() + seconds)
        return sweep.sweep()


def test_a_new_batch_asks_for_prepare_in_its_accounts_group(moto_aws: Aws) -> None:
    batch_id = ids.new_batch_id()
    s3.put_bytes(moto_aws.bucket, f"files/{batch_id}", lines(1))
    intake.create_batch(
        intake.NewBatch(
            batch_id=batch_id,
            account_id=ACCOUNT,
            input_file_id=f"file-{batch_id}",
            input_bucket=moto_aws.bucket,
            input_key=f"files/{batch_id}",
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    )
    assert moto_aws.grouped("PrepareQueue") == [(ACCOUNT, {"batch_id": batch_id})]


def test_prepare_sends_each_shard_in_its_accounts_group_and_so_does_a_resend(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch of 12 shards (two SendMessageBatch calls of 10 and 2)
    batch_id = create(moto_aws, lines(12), monkeypatch, shard_size=1, account_id=ACCOUNT)
    expected = [(ACCOUNT, {"batch_id": batch_id, "shard": n}) for n in range(12)]
    assert prepare.prepare_batch(batch_id) == "in_progress"
    assert sorted(moto_aws.grouped("ShardsQueue"), key=lambda m: m[1]["shard"]) == expected
    # A redelivered prepare message re-sends the lost shards (here each claimed by a worker that died):
    # in the same group
    for n in range(12):
        assert shards.claim(batch_id, n, owner="dead", lease_seconds=-1) is not None
    assert prepare.prepare_batch(batch_id) == "resent"
    assert sorted(moto_aws.grouped("ShardsQueue"), key=lambda m: m[1]["shard"]) == expected


def test_a_continuation_and_the_last_shards_finalize_stay_in_the_accounts_group(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = prepared(moto_aws, lines(1), monkeypatch, shard_size=1, account_id=ACCOUNT)
    # An invocation with no time left runs nothing and hands the shard on
    assert run_shard(batch_id, 0, time_left_ms=lambda: 0) == "continued"
    assert moto_aws.grouped("ShardsQueue") == [(ACCOUNT, {"batch_id": batch_id, "shard": 0})]
    # The commit of the last shard asks for aggregation
    assert run_shard(batch_id, 0) == "done"
    assert moto_aws.grouped("FinalizeQueue") == [(ACCOUNT, {"batch_id": batch_id})]


def test_the_sweepers_redrives_stay_in_the_accounts_group(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck = get_settings().stuck_after_seconds
    # A shard whose worker died holding it, a batch whose prepare message was lost, a finished one
    # whose finalize message was lost
    running = prepared(moto_aws, lines(1), monkeypatch, account_id=ACCOUNT)
    assert shards.claim(running, 0, owner="dead", lease_seconds=-1) is not None
    monkeypatch.setenv("PREPARE_WAIT_SECONDS", str(stuck))  # a message not received by then is lost
    validating = create(moto_aws, lines(1), monkeypatch, account_id="acct-other")
    finished = prepared(moto_aws, lines(1), monkeypatch, account_id=ACCOUNT)
    assert run_shard(finished, 0) == "done"
    moto_aws.grouped("FinalizeQueue")
    assert batches.transition(finished, BatchStatus.IN_PROGRESS, changes=BatchChanges()) is None  # still so

    assert sweep_later(stuck + 1) == {
        "expired": 0,
        "prepare": 1,
        "shards": 1,
        "failed_shards": 0,
        "finalize": 1,
        "past_window": 0,
    }
    assert moto_aws.grouped("ShardsQueue") == [(ACCOUNT, {"batch_id": running, "shard": 0})]
    assert moto_aws.grouped("PrepareQueue") == [("acct-other", {"batch_id": validating})]
    assert moto_aws.grouped("FinalizeQueue") == [(ACCOUNT, {"batch_id": finished})]
