"""The S3 upload trigger: real-world keys, decoded exactly once; one batch per object, whatever repeats.

Keys from tests/fixtures/cases/README.md: S3 notifications URL-encode keys (`+` for space, `%2B` for `+`).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchinfer.core import ids
from batchinfer.data import accounts, batches, s3
from batchinfer.wire.status import BatchStatus
from support.moto_env import Aws, load_event, sqs_event

LINE = json.dumps(
    {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}]},
    }
)


def s3_record(bucket: str, encoded_key: str, etag: str = "0123456789abcdef") -> dict[str, Any]:
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": "2026-11-30T06:00:00.000Z",
        "eventName": "ObjectCreated:Put",
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "inbox",
            "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
            "object": {"key": encoded_key, "size": len(LINE), "eTag": etag, "sequencer": "0A1B"},
        },
    }


@pytest.mark.parametrize(
    ("real_key", "encoded_key"),
    [
        ("inbox/q1 summary (2).jsonl", "inbox/q1+summary+%282%29.jsonl"),
        ("inbox/a+b.jsonl", "inbox/a%2Bb.jsonl"),
        ("inbox/café.jsonl", "inbox/caf%C3%A9.jsonl"),
        ("inbox/pct%2Fname.jsonl", "inbox/pct%252Fname.jsonl"),
    ],
)
def test_keys_are_decoded_exactly_once(moto_aws: Aws, real_key: str, encoded_key: str) -> None:
    etag = uploaded(moto_aws, real_key, LINE.encode())["s3"]["object"]["eTag"]
    event = sqs_event([{"Records": [s3_record(moto_aws.bucket, encoded_key, etag=etag)]}])
    assert moto_aws.invoke("UploadTriggerFunction", event) == {"batchItemFailures": []}
    batch_id = ids.batch_id_for_object(moto_aws.bucket, real_key, f"{etag}:0A1B")  # ETag:sequencer
    header = batches.get(batch_id)
    assert (header.input_key, header.status) == (real_key, "validating")
    assert header.output_prefix == "outbox/" + real_key.removeprefix("inbox/").removesuffix(".jsonl") + "/"
    # prepare can read the object under that key
    assert moto_aws.invoke("PrepareFunction", sqs_event(moto_aws.messages("PrepareQueue"))) == {
        "batchItemFailures": []
    }
    assert batches.get(batch_id).status == "in_progress"


def test_one_event_with_two_records_starts_two_batches_and_repeats_start_none(moto_aws: Aws) -> None:
    for key in ("inbox/x.jsonl", "inbox/y.jsonl"):
        s3.put_bytes(moto_aws.bucket, key, LINE.encode())
    body = {
        "Records": [s3_record(moto_aws.bucket, "inbox/x.jsonl"), s3_record(moto_aws.bucket, "inbox/y.jsonl")]
    }
    for _ in range(2):  # the same notification delivered twice
        assert moto_aws.invoke("UploadTriggerFunction", sqs_event([body])) == {"batchItemFailures": []}
    found, _ = batches.page("default", limit=10, after=None)
    assert sorted(b.input_key for b in found) == ["inbox/x.jsonl", "inbox/y.jsonl"]


def test_other_keys_and_the_test_event_are_ignored(moto_aws: Aws) -> None:
    test_event = {"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": moto_aws.bucket}
    other = {"Records": [s3_record(moto_aws.bucket, "outbox/x/output.jsonl")]}
    assert moto_aws.invoke("UploadTriggerFunction", sqs_event([test_event, other])) == {
        "batchItemFailures": []
    }
    assert batches.page("default", limit=10, after=None) == ([], False)


def test_a_missing_object_fails_its_batch_once(moto_aws: Aws) -> None:
    event = load_event("upload-trigger.json")  # names inbox/q1 summary (2).jsonl, which is not there
    event["Records"][0]["body"] = event["Records"][0]["body"].replace(
        "batchinfer-123456789012-us-east-1-data", moto_aws.bucket
    )
    assert moto_aws.invoke("UploadTriggerFunction", event) == {"batchItemFailures": []}
    assert moto_aws.invoke("PrepareFunction", sqs_event(moto_aws.messages("PrepareQueue"))) == {
        "batchItemFailures": []
    }
    [batch], _ = batches.page("default", limit=10, after=None)
    assert (batch.input_key, batch.status) == ("inbox/q1 summary (2).jsonl", "failed")
    assert batch.errors.data[0].code == "input_file_unavailable"
    assert moto_aws.messages("PrepareQueue") == []  # not retried forever


def uploaded(aws: Aws, key: str, data: bytes) -> dict[str, Any]:
    """PUT `data` at `key`; the S3 record its notification carries (real ETag, VersionId if any)."""
    put = s3.s3_client().put_object(Bucket=aws.bucket, Key=key, Body=data)
    record = s3_record(aws.bucket, key, etag=put["ETag"].strip('"'))
    if put.get("VersionId"):
        record["s3"]["object"]["versionId"] = put["VersionId"]
    return record


@pytest.mark.parametrize("versioned", [True, False])
def test_prepare_reads_the_object_the_event_named_not_a_later_overwrite(
    moto_aws: Aws, versioned: bool
) -> None:
    # Given an inbox upload of one request, overwritten with two before its batch was prepared
    if versioned:
        s3.s3_client().put_bucket_versioning(
            Bucket=moto_aws.bucket, VersioningConfiguration={"Status": "Enabled"}
        )
    record = uploaded(moto_aws, "inbox/over.jsonl", f"{LINE}\n".encode())
    assert moto_aws.invoke("UploadTriggerFunction", sqs_event([{"Records": [record]}])) == {
        "batchItemFailures": []
    }
    second = LINE.replace('"a"', '"b"')
    s3.put_bytes(moto_aws.bucket, "inbox/over.jsonl", f"{LINE}\n{second}\n".encode())

    # When it is prepared
    moto_aws.invoke("PrepareFunction", sqs_event(moto_aws.messages("PrepareQueue")))

    # Then it ran the upload that started it: that version, or (unversioned bucket) it says the file changed
    [batch], _ = batches.page("default", limit=10, after=None)
    if versioned:
        assert (batch.status, batch.request_counts.total) == ("in_progress", 1)
    else:
        assert batch.status == "failed"
        assert [(e.code, e.param, e.message) for e in batch.errors.data] == [
            (
                "input_file_unavailable",
                "input_file_id",
                "the input file changed after the upload that started this batch (PreconditionFailed): "
                "its new upload starts a batch of its own",
            )
        ]


def upload_and_trigger(aws: Aws, key: str, deliveries: int = 1) -> str:
    """Upload one request at `key` and deliver its notification `deliveries` times; the batch id the
    upload started."""
    record = uploaded(aws, key, f"{LINE}\n".encode())
    for _ in range(deliveries):
        assert aws.invoke("UploadTriggerFunction", sqs_event([{"Records": [record]}])) == {
            "batchItemFailures": []
        }
    [started] = [b for b in batches.page("default", limit=100)[0] if b.input_key == key]
    return started.id


@pytest.mark.parametrize(
    ("limits", "code", "message"),
    [
        (
            {"max_active_batches": 1},
            "active_batch_limit_exceeded",
            "This account has 1 batches that have not finished, the most it may have: this upload was "
            "not run; upload the file again once one has ended or cancel one.",
        ),
        (
            {"max_creates_per_minute": 1},
            "rate_limit_exceeded",
            "Rate limit reached: 1 batch creations per minute: this upload was not run; upload the "
            "file again in a minute.",
        ),
    ],
    ids=["active", "rate"],
)
def test_an_inbox_upload_over_an_account_limit_fails_its_batch_and_says_which(
    moto_aws: Aws, limits: dict[str, int], code: str, message: str
) -> None:
    # Given the inbox account at its limit after one upload (the inbox must not bypass the limits)
    accounts.configure_account("default", **limits)
    first = upload_and_trigger(moto_aws, "inbox/one.jsonl")
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": first}]

    # When a second upload arrives (its notification delivered twice)
    second = upload_and_trigger(moto_aws, "inbox/two.jsonl", deliveries=2)

    # Then its batch exists and failed, naming the limit in OpenAI's errors.data; it is not counted,
    # never prepared, and its input is still there
    header = batches.get(second)
    assert (header.status, header.active_counted, header.failed_at is not None) == ("failed", None, True)
    assert header.errors.model_dump() == {
        "object": "list",
        "data": [{"code": code, "message": message, "param": None, "line": None}],
    }
    assert moto_aws.messages("PrepareQueue") == []
    assert accounts.active_batches("default") == 1
    assert batches.get(first).status == "validating"
    assert s3.s3_client().head_object(Bucket=moto_aws.bucket, Key="inbox/one.jsonl")["ContentLength"] > 0


def test_the_same_bytes_uploaded_again_start_a_new_batch(moto_aws: Aws) -> None:
    # An upload refused at the limit is run by uploading it again, even unchanged (same ETag)
    accounts.configure_account("default", max_active_batches=1)
    first = upload_and_trigger(moto_aws, "inbox/one.jsonl")
    refused = upload_and_trigger(moto_aws, "inbox/two.jsonl")
    assert batches.transition(first, BatchStatus.CANCELLING) is not None
    assert batches.transition(first, BatchStatus.CANCELLED) is not None
    moto_aws.messages("PrepareQueue")
    record = uploaded(moto_aws, "inbox/two.jsonl", f"{LINE}\n".encode())
    record["s3"]["object"]["sequencer"] = "0A1C"  # S3's next event for that key
    assert moto_aws.invoke("UploadTriggerFunction", sqs_event([{"Records": [record]}])) == {
        "batchItemFailures": []
    }
    [again] = [b for b in batches.page("default", limit=100)[0] if b.id not in (first, refused)]
    assert (again.input_key, again.status, batches.get(refused).status) == (
        "inbox/two.jsonl",
        "validating",
        "failed",
    )
    assert moto_aws.messages("PrepareQueue") == [{"batch_id": again.id}]
