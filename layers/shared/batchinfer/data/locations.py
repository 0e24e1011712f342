"""User storage paths of the TokenHub dialect: `s3://bucket/key` and `cos://bucket.region/key`.

A TokenHub batch names its input object and its output prefix in the user's own storage instead of
an uploaded file (`input_source: user_s3 | user_cos`, `output_target: user_s3 | user_cos`). S3 paths
are read with the deployment's AWS credentials; COS paths (Tencent Cloud Object Storage, an
S3-compatible API) go to the endpoint configured by the `COS_ENDPOINT_URL` setting, where `{region}`
is replaced by the region named in the path (COS: https://cloud.tencent.com/document/product/436/37421).

Where an object lives is kept on batch and file items as a short `where` string: `""` for AWS S3,
`"cos:<region>"` for COS; `s3_client(where)` gives the boto3 client for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, Literal

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import CredentialProvider, RefreshableCredentials
from botocore.exceptions import BotoCoreError, ClientError

from batchinfer.core import aws
from batchinfer.core.settings import get_settings

Scheme = Literal["s3", "cos"]
# S3 bucket naming rules (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html);
# COS buckets are `<name>-<appid>` without dots, so the first dot of a cos:// host ends the bucket.
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_COS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}[a-z0-9]$")
MAX_KEY_BYTES = 1024  # S3 and COS object key limit
# Under an output prefix a batch writes `<batch id>/output.jsonl` (`batch_` and 24 hex, the longest name):
# the prefix leaves room for it, or every result write of the batch would fail after it ran.
RESULT_KEY_BYTES = len(f"batch_{'0' * 24}/output.jsonl")


class InvalidPath(ValueError):
    """A path that is not `s3://bucket/key` or `cos://bucket.region/key` (the message says why)."""


class Unavailable(Exception):
    """An object or bucket that cannot be read or written; `code` is the storage error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Location:
    """An object (or, for outputs, a key prefix) in user storage."""

    scheme: Scheme
    bucket: str
    key: str
    region: str | None = None

    @property
    def where(self) -> str:
        """`""` for AWS S3, `"cos:<region>"` for COS (see the module docstring)."""
        return f"cos:{self.region}" if self.scheme == "cos" else ""

    @property
    def bucket_ref(self) -> str:
        """`s3://bucket` or `cos://bucket`: how an account's bucket allowlist names this bucket."""
        return f"{self.scheme}://{self.bucket}"

    def uri(self, key: str | None = None) -> str:
        """The path of this location, or of `key` in the same bucket."""
        host = f"{self.bucket}.{self.region}" if self.scheme == "cos" else self.bucket
        return f"{self.scheme}://{host}/{self.key if key is None else key}"


def parse(uri: str, scheme: Scheme, *, prefix: bool = False) -> Location:
    """Parse `s3://bucket/key` (scheme `s3`) or `cos://bucket.region/key` (scheme `cos`).

    With `prefix`, the key is an output prefix: it may be empty, it is given a trailing `/`, and it
    leaves `RESULT_KEY_BYTES` for the result files' names. A `..` or `.` segment is refused (a
    store may resolve it to another key). Raises `InvalidPath` naming the problem.
    """
    head = f"{scheme}://"
    if not uri.startswith(head):
        example = "s3://bucket/key" if scheme == "s3" else "cos://bucket.region/key"
        raise InvalidPath(f"expected a {scheme}:// path such as {example!r}, got {uri[:80]!r}")
    host, _, key = uri[len(head) :].partition("/")
    region = None
    if scheme == "cos":
        bucket, _, region = host.partition(".")
        if not _REGION.match(region):
            raise InvalidPath(
                f"cos:// paths name the bucket and its region, 'cos://bucket.region/key'; got host {host!r}"
            )
        pattern = _COS_BUCKET
    else:
        bucket, pattern = host, _S3_BUCKET
    if not pattern.match(bucket) or ".." in bucket:
        raise InvalidPath(f"{bucket!r} is not a valid bucket name")
    if prefix:
        key = key if not key or key.endswith("/") else key + "/"
    elif not key or key.endswith("/"):
        raise InvalidPath(f"{uri[:120]!r} names no object (the key is empty or ends with '/')")
    if {".", ".."} & set(key.split("/")):
        raise InvalidPath("the key has a '.' or '..' segment")
    limit = MAX_KEY_BYTES - RESULT_KEY_BYTES if prefix else MAX_KEY_BYTES
    if len(key.encode()) > limit:
        raise InvalidPath(f"the key is longer than {limit} bytes" + (" (an output prefix)" if prefix else ""))
    return Location(scheme, bucket, key, region)


# How long COS keys read from Secrets Manager are used before they are read again (seconds): a rotated
# key pair reaches a warm environment within this. botocore reads them again this far ahead of the
# expiry we give them (its advisory refresh; 15 minutes by default, meant for STS sessions).
COS_SECRET_MAX_AGE_S = 300
_REFRESH_AHEAD_S = 60


@lru_cache(maxsize=16)
def _cos_client(region: str, endpoint: str, style: str, secret: str) -> Any:
    session = botocore.session.get_session()
    if secret:
        # First in the chain: keys that a rotation replaces, not the environment's AWS credentials.
        session.get_component("credential_provider").insert_before("env", _CosSecretProvider(secret))
    return boto3.session.Session(botocore_session=session).client(
        "s3",
        endpoint_url=endpoint.format(region=region),
        region_name=region,
        config=Config(
            s3={"addressing_style": style},
            signature_version="s3v4",
            retries={"mode": "standard", "max_attempts": 5},
        ),
    )


class _CosSecretProvider(CredentialProvider):
    """botocore credential provider: the COS key pair in Secrets Manager `secret` (JSON
    `{"access_key_id", "secret_access_key"}`), read again every `COS_SECRET_MAX_AGE_S` by botocore's
    own refreshable credentials. The COS client lives as long as its environment: keys read once
    would outlive a rotation."""

    METHOD = "cos-secret"
    CANONICAL_NAME = "custom-cos-secret"

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def load(self) -> RefreshableCredentials:
        return RefreshableCredentials.create_from_metadata(
            self._read(),
            refresh_using=self._read,
            method=self.METHOD,
            advisory_timeout=_REFRESH_AHEAD_S,
            mandatory_timeout=_REFRESH_AHEAD_S // 2,
        )

    def _read(self) -> dict[str, Any]:
        from aws_lambda_powertools.utilities import parameters

        # With the deployment's own client (its endpoint, retries and chaos hooks), not Powertools' default
        # provider, whose client is made once per process.
        provider = parameters.SecretsProvider(boto3_client=aws.client("secretsmanager"))
        value = provider.get(self.secret, transform="json", force_fetch=True)
        due = datetime.now(UTC) + timedelta(seconds=COS_SECRET_MAX_AGE_S + _REFRESH_AHEAD_S)
        return {
            "access_key": value["access_key_id"],
            "secret_key": value["secret_access_key"],
            "token": None,
            "expiry_time": due.isoformat(),
        }


def _expect_owner(params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
    """botocore `before-parameter-build.s3` handler: `ExpectedBucketOwner` on every operation that takes
    it (GetObject, PutObject, HeadBucket, the multipart calls ...), unless the caller set one.

    Presigned URLs are left alone: the parameter would become a signed header their user must send.
    """
    owner = get_settings().expected_bucket_owner
    if (
        owner
        and not context.get("is_presign_request")
        and "ExpectedBucketOwner" in model.input_shape.members
        and "ExpectedBucketOwner" not in params
    ):
        params["ExpectedBucketOwner"] = owner


@lru_cache(maxsize=8)
def _owner_checked(client: Any) -> Any:
    # A handler on the client, not a parameter at each call: s3transfer's uploads make their own
    # calls (CreateMultipartUpload, UploadPart ...), and no call can forget it.
    client.meta.events.register("before-parameter-build.s3", _expect_owner, unique_id="expected-bucket-owner")
    return client


def s3_client(where: str | None = None) -> Any:
    """The boto3 S3 client for objects at `where` (`""`/None: AWS S3; `"cos:<region>"`: COS).

    On AWS S3 every call but a presign carries `ExpectedBucketOwner` (the `EXPECTED_BUCKET_OWNER`
    setting: the deployment's own account), for the data bucket and the user buckets of TokenHub
    `s3://` paths alike: S3 answers 403 for a bucket of another account. COS has no such check.
    Raises `InvalidPath` for COS when the deployment has no `COS_ENDPOINT_URL`.
    """
    if not where:
        return _owner_checked(aws.client("s3"))
    kind, _, region = where.partition(":")
    settings = get_settings()
    if kind != "cos" or not settings.cos_endpoint_url:
        raise InvalidPath("cos:// paths are not enabled on this deployment (COS_ENDPOINT_URL is not set)")
    return _cos_client(
        region, settings.cos_endpoint_url, settings.cos_addressing_style, settings.cos_credentials_secret
    )


def check_readable(location: Location) -> int:
    """Size in bytes of the object at `location`; raises `Unavailable` when it can't be read."""
    try:
        head = s3_client(location.where).head_object(Bucket=location.bucket, Key=location.key)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "Unknown")
        raise Unavailable(code, f"{location.uri()} cannot be read ({code})") from None
    except BotoCoreError as error:
        raise Unavailable(
            "EndpointError", f"{location.uri()} cannot be read ({type(error).__name__})"
        ) from None
    return int(head["ContentLength"])


def check_bucket(location: Location) -> None:
    """Raise `Unavailable` unless the bucket of `location` exists and is reachable."""
    try:
        s3_client(location.where).head_bucket(Bucket=location.bucket)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "Unknown")
        raise Unavailable(code, f"bucket {location.bucket_ref} cannot be used ({code})") from None
    except BotoCoreError as error:
        raise Unavailable(
            "EndpointError", f"bucket {location.bucket_ref} cannot be used ({type(error).__name__})"
        ) from None


def located(where: str | None, bucket: str, key: str) -> Location:
    """The `Location` of an object stored at (`where`, `bucket`, `key`) (inverse of `Location.where`)."""
    kind, _, region = (where or "").partition(":")
    return Location("cos", bucket, key, region) if kind == "cos" else Location("s3", bucket, key)
