"""`intake.create_batch` against moto: the header it stores, its idempotence, and what it refuses.

The counters themselves are tested with the data layer (tests/integration/data/test_batches.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, batches
from batchinfer.data.accounts import LimitExceeded
from batchinfer.pipeline import intake
from batchinfer.wire.status import BatchStatus
from support.moto_env import Aws

AT = 1_800_000_030  # 30 s into a calendar minute


def create(batch_id: str, at: int = AT, **fields: Any) -> Any:
    new = {
        "batch_id": batch_id,
        "account_id": "acct",
        "input_file_id": "file-in",
        "input_bucket": "in-bucket",
        "input_key": "files/file-in",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        **fields,
    }
    return intake.create_batch(intake.NewBatch(**new), at=at)


def test_a_new_batch_is_stored_validating_counted_and_sent_to_prepare(moto_aws: Aws) -> None:
    batch_id = ids.new_batch_id()
    header = create(batch_id, completion_window="48h", metadata={"k": "v"}, name="nightly")
    assert batches.get(batch_id) == header
    assert header.model_dump(
        include={
            "status",
            "created_at",
            "expires_at",
            "output_bucket",
            "output_prefix",
            "output_where",
            "input_where",
            "active_counted",
            "metadata",
            "name",
            "in_progress_at",
            "shards_total",
        }
    ) == {
        "status": "validating",
        "created_at": AT,
        "expires_at": AT + 48 * 3600,
        "output_bucket": get_settings().bucket_name,
        "output_prefix": f"batches/{batch_id}/",
        "output_where": "",
        "input_where": "",
        "active_counted": True,
        "metadata": {"k": "v"},
        "name": "nightly",
        "in_progress_at": None,
        "shards_total": 0,
    }
    assert accounts.active_batches("acct") == 1
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": batch_id}]


def test_results_go_where_the_caller_says(moto_aws: Aws) -> None:
    header = create(
        ids.new_batch_id(),
        output_bucket="user-bucket",
        output_prefix="outbox/q1/",
        output_where="cos:ap-guangzhou",
    )
    assert (header.output_bucket, header.output_prefix, header.output_where) == (
        "user-bucket",
        "outbox/q1/",
        "cos:ap-guangzhou",
    )


def test_a_repeated_create_returns_the_first_batch_and_sends_prepare_again(moto_aws: Aws) -> None:
    batch_id = ids.new_batch_id()
    first = create(batch_id, name="first")
    # The same id again (a retried request, a repeated S3 event), with other fields: the stored batch wins
    again = create(batch_id, name="second", completion_window="1h", at=AT + 60)
    stored = batches.get(batch_id)
    assert again == first == stored.model_copy(update={"prepare_queued_at": AT})
    assert stored.prepare_queued_at == AT + 60  # its message waits from the second send
    assert accounts.active_batches("acct") == 1
    # Still validating: the first attempt may have died before its message was sent
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": batch_id}] * 2


def test_a_repeated_create_of_a_started_batch_sends_nothing(moto_aws: Aws) -> None:
    batch_id = ids.new_batch_id()
    create(batch_id)
    moto_aws.messages("PrepareQueue")
    started = batches.transition(batch_id, BatchStatus.IN_PROGRESS)
    assert create(batch_id) == started
    assert moto_aws.messages("PrepareQueue") == []


@pytest.mark.parametrize("window", ["0h", "169h", "24", "1d", "1.5h"])
def test_a_bad_completion_window_is_refused_before_anything_is_written(moto_aws: Aws, window: str) -> None:
    batch_id = ids.new_batch_id()
    with pytest.raises(
        ValueError, match=f"completion_window must be whole hours from '1h' to '168h', got '{window}'"
    ):
        create(batch_id, completion_window=window)
    assert (batches.get(batch_id), accounts.active_batches("acct")) == (None, 0)
    assert moto_aws.messages("PrepareQueue") == []


@pytest.mark.parametrize(
    ("limits", "kind", "limit", "retry_after"),
    [
        ({"max_active": 1}, "active", 1, accounts.ACTIVE_RETRY_AFTER_S),
        ({"max_per_minute": 1}, "rate", 1, 30),
    ],
)
def test_an_account_at_its_limit_is_refused_and_nothing_is_sent(
    moto_aws: Aws, limits: dict[str, int], kind: str, limit: int, retry_after: int
) -> None:
    first, refused = ids.new_batch_id(), ids.new_batch_id()
    create(first, **limits)
    with pytest.raises(LimitExceeded) as raised:
        create(refused, **limits)
    assert (raised.value.kind, raised.value.limit, raised.value.retry_after) == (kind, limit, retry_after)
    assert batches.get(refused) is None
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": first}]


def test_a_prepare_message_that_could_not_be_sent_is_not_taken_for_waiting(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given SQS refusing the prepare message of a new batch
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("SQS refused 1 message(s)")

    monkeypatch.setattr(intake.sqs, "send", refuse)
    batch_id = ids.new_batch_id()
    with pytest.raises(RuntimeError, match="SQS refused"):
        create(batch_id)
    # Then the batch is stored with no message recorded as waiting: the sweeper sends one once quiet
    stored = batches.get(batch_id)
    assert (stored.status, stored.prepare_queued_at) == ("validating", None)
    assert moto_aws.messages("PrepareQueue") == []
