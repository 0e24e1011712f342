"""The inbox convention, `intake.create_batch` faked: which keys start a batch, where its results go,
and which version of the object names it. The S3 trigger end to end is
tests/integration/pipeline/test_inbox.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes.s3_event import S3EventRecord

from batchinfer.core import ids
from batchinfer.core.settings import Settings
from batchinfer.data.accounts import BatchLimits
from batchinfer.data.items import Account
from batchinfer.pipeline import inbox


@pytest.fixture
def created(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The arguments of every `intake.create_batch` call, the `NewBatch` fields given and the options
    (with the default prefixes, and the limits of an inbox account allowed 3 active batches and 7
    creations a minute)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        inbox.intake,
        "create_batch",
        lambda new, **options: calls.append({**new.model_dump(exclude_unset=True), **options}),
    )
    monkeypatch.setattr(inbox.accounts, "get_account", lambda account_id: Account(account_id=account_id))
    monkeypatch.setattr(
        inbox.accounts,
        "batch_limits",
        lambda account: (
            BatchLimits(max_active=3, max_per_minute=7) if account.account_id == "default" else None
        ),
    )
    use_settings(monkeypatch)
    return calls


def use_settings(monkeypatch: pytest.MonkeyPatch, **fields: str) -> None:
    settings = Settings(
        table_name="t",
        bucket_name="b",
        **{"inbox_prefix": "inbox/", "outbox_prefix": "outbox/", "inbox_account_id": "default", **fields},
    )
    monkeypatch.setattr(inbox, "get_settings", lambda: settings)


def record(key: str, **obj: str) -> S3EventRecord:
    """An `ObjectCreated` record of bucket `data` (`key` URL-encoded as S3 sends it)."""
    return S3EventRecord(
        {
            "eventName": "ObjectCreated:Put",
            "s3": {"bucket": {"name": "data"}, "object": {"key": key, "sequencer": "0A1B", **obj}},
        }
    )


@pytest.mark.parametrize(
    ("key", "prefix"),
    [
        ("inbox/q1.jsonl", "outbox/q1/"),
        ("inbox/team/a/q1.jsonl", "outbox/team/a/q1/"),
        ("inbox/q1.jsonl.jsonl", "outbox/q1.jsonl/"),  # one suffix removed
        ("other/q1.jsonl", "outbox/other/q1/"),  # not under the inbox: kept whole
    ],
)
def test_outbox_prefix_mirrors_the_inbox_path(monkeypatch: pytest.MonkeyPatch, key: str, prefix: str) -> None:
    use_settings(monkeypatch)
    assert inbox.outbox_prefix(key) == prefix


def test_outbox_prefix_follows_the_configured_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    use_settings(monkeypatch, inbox_prefix="drop/in/", outbox_prefix="drop/out/")
    assert inbox.outbox_prefix("drop/in/x/y.jsonl") == "drop/out/x/y/"


@pytest.mark.parametrize(
    "key",
    [
        "outbox/q1.jsonl",
        "inbox/q1.json",
        "inbox/q1.jsonl.gz",
        "data/inbox/q1.jsonl",
        "inboxq1.jsonl",
        "inbox/",
    ],
)
def test_other_keys_start_nothing(created: list[dict[str, Any]], key: str) -> None:
    assert inbox.start_from_record(record(key, eTag="e1")) is None
    assert created == []


def test_an_inbox_upload_becomes_a_chat_batch_with_results_in_the_outbox(
    created: list[dict[str, Any]],
) -> None:
    batch_id = inbox.start_from_record(record("inbox/q1+summary+%282%29.jsonl", eTag="e1"))
    key = "inbox/q1 summary (2).jsonl"
    assert batch_id == ids.batch_id_for_object("data", key, "e1:0A1B")
    assert created == [
        {
            "batch_id": batch_id,
            "account_id": "default",
            "input_file_id": f"s3://data/{key}",
            "input_bucket": "data",
            "input_key": key,
            "input_version_id": None,
            "input_etag": "e1",
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "output_bucket": "data",
            "output_prefix": "outbox/q1 summary (2)/",
            # the account's limits, and over one a failed batch rather than an exception
            "max_active": 3,
            "max_per_minute": 7,
            "refuse": "fail",
        }
    ]


@pytest.mark.parametrize(
    ("obj", "version"),
    [
        ({"versionId": "v1", "eTag": "e1"}, "v1"),  # a versioned bucket: each overwrite is a new batch
        ({"eTag": "e1"}, "e1:0A1B"),  # unversioned: the same bytes uploaded again are a new batch too
        ({}, "0A1B"),  # no version, no eTag: the sequencer
    ],
    ids=["version", "etag", "sequencer"],
)
def test_the_batch_id_names_the_object_version(
    created: list[dict[str, Any]], obj: dict[str, str], version: str
) -> None:
    batch_id = inbox.start_from_record(record("inbox/q1.jsonl", **obj))
    assert batch_id == ids.batch_id_for_object("data", "inbox/q1.jsonl", version)
    assert [call["batch_id"] for call in created] == [batch_id]
    # and prepare reads that version, or requires that ETag
    pinned = {
        "input_version_id": obj.get("versionId"),
        "input_etag": None if "versionId" in obj else obj.get("eTag"),
    }
    assert {name: created[0][name] for name in pinned} == pinned
