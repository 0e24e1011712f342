"""`ExpectedBucketOwner` on every S3 call (data/locations.py `s3_client`) in moto's copy of the template's
bucket: TokenHub user-bucket reads, writes (multipart too) and deletes all carry the deployment's
account; presigned URLs do not (their user would have to send it)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from batchinfer.core import aws
from batchinfer.data import locations, s3
from support.moto_env import Aws

USER = "batchinfer-user-acme"


def test_every_call_to_a_user_bucket_names_the_deployments_account(moto_aws: Aws) -> None:
    # Given a user bucket and a record of each S3 request the data layer sends
    boto3.client("s3").create_bucket(Bucket=USER)
    sent: list[tuple[str, str | None]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        sent.append((model.name, params["headers"].get("x-amz-expected-bucket-owner")))

    aws.client("s3").meta.events.register("before-call.s3", record)
    big = b"x" * (9 * 1024 * 1024)  # above the 8 MiB multipart threshold

    # When a TokenHub batch's calls are made on it
    s3.upload_stream(USER, "results/b/output.jsonl", iter([big]), where="")
    s3.put_bytes(USER, "in/batch.jsonl", b"{}\n", where="")
    size = locations.check_readable(locations.parse(f"s3://{USER}/in/batch.jsonl", "s3"))
    locations.check_bucket(locations.parse(f"s3://{USER}/results/", "s3", prefix=True))
    read = b"".join(s3.iter_chunks(USER, "in/batch.jsonl", where=""))
    url = s3.presigned_get(USER, "results/b/output.jsonl", where="")
    s3.delete(USER, "results/b/output.jsonl", where="")

    # Then each request named the account (the template's AWS::AccountId), and no URL did
    assert (size, read) == (3, b"{}\n")
    assert [name for name, _ in sent] == [
        "CreateMultipartUpload",
        "UploadPart",
        "UploadPart",
        "CompleteMultipartUpload",
        "PutObject",
        "HeadObject",
        "HeadBucket",
        "GetObject",
        "HeadBucket",  # the presigned URL's owner check
        "DeleteObject",
    ]
    assert {owner for _, owner in sent} == {"123456789012"}
    assert "expected-bucket-owner" not in url


def test_a_presigned_url_of_a_user_bucket_is_made_only_for_the_deployments_own_bucket(moto_aws: Aws) -> None:
    # Given a user bucket that another account took over (S3 answers 403 to the owner check)
    boto3.client("s3").create_bucket(Bucket=USER)
    sent: list[tuple[str, str | None]] = []

    def taken(model: Any, params: dict[str, Any], **_: Any) -> None:
        sent.append((model.name, params["headers"].get("x-amz-expected-bucket-owner")))
        raise ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, model.name)

    aws.client("s3").meta.events.register("before-call.s3", taken)
    # When a download URL of its results is asked for: refused, after one HeadBucket naming the account
    with pytest.raises(locations.Unavailable, match="cannot be used"):
        s3.presigned_get(USER, "results/b/output.jsonl", where="")
    assert sent == [("HeadBucket", "123456789012")]
    # And the service's own bucket needs no check
    assert s3.presigned_get(moto_aws.bucket, "files/x", where="").startswith("https://")
    assert sent == [("HeadBucket", "123456789012")]
