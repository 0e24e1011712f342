"""S3 access that streams: bounded memory whatever the object size.

Keys in the service bucket (DESIGN.md): `files/<file_id>`, `batches/<id>/shards/<n>.jsonl`,
`batches/<id>/results/<n>.<start>.<token>.jsonl`, `batches/<id>/output.jsonl`, `batches/<id>/error.jsonl`.
Objects in user storage (TokenHub paths) take `where` (see `batchinfer.data.locations`): `""` or None is
AWS S3, `"cos:<region>"` the configured COS endpoint.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any
from urllib.parse import quote

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from batchinfer.core.settings import get_settings
from batchinfer.data.locations import Location, check_bucket, s3_client

CHUNK_BYTES = 1024 * 1024
# 8 MiB parts: above S3's 5 MiB multipart minimum, and bounded memory (s3transfer queues a few).
_TRANSFER = TransferConfig(
    multipart_threshold=8 * 1024 * 1024,
    multipart_chunksize=8 * 1024 * 1024,
    max_concurrency=4,
    use_threads=True,
)


def shard_key(batch_id: str, shard: int) -> str:
    return f"batches/{batch_id}/shards/{shard:05d}.jsonl"


def result_prefix(batch_id: str, shard: int, start: int) -> str:
    """The common start of every result key of requests `[start, ...)` of a shard."""
    return f"batches/{batch_id}/results/{shard:05d}.{start:05d}."


def result_key(batch_id: str, shard: int, start: int, token: str) -> str:
    """Results of requests `[start, ...)` of a shard as one writer wrote them: `token` is new for each
    write (`ids.write_token`), so a writer that lost the shard's lease never overwrites the key its
    new holder commits; only the key a commit names (`ResultPart.key`) is ever read."""
    return f"{result_prefix(batch_id, shard, start)}{token}.jsonl"


def keys_under(bucket: str, prefix: str) -> list[str]:
    """The keys of the service bucket's objects under `prefix`, sorted (one ListObjectsV2 page: up to
    1,000, far more than the writers of one part)."""
    found = s3_client(None).list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(item["Key"] for item in found)


def copy(bucket: str, source: str, key: str) -> bool:
    """Copy an object of the service bucket to `key` (server side, its metadata with it); False when
    `source` does not exist (any more)."""
    try:
        s3_client(None).copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": source})
    except ClientError as error:
        if error.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def iter_chunks(
    bucket: str,
    key: str,
    *,
    start: int = 0,
    end: int | None = None,
    where: str | None = None,
    version_id: str | None = None,
    if_match: str | None = None,
) -> Iterator[bytes]:
    """The bytes of an object (or of the range `[start, end)`) in chunks of about 1 MiB; of its
    `version_id`, or only while its ETag is `if_match`, when given.

    Raises botocore `ClientError` (`NoSuchKey`, `AccessDenied`, `PreconditionFailed` for another ETag)
    when the object can't be read.
    """
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if version_id:
        kwargs["VersionId"] = version_id
    if if_match:
        kwargs["IfMatch"] = if_match
    if start or end is not None:
        if end is not None and end <= start:
            return
        kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    body = s3_client(where).get_object(**kwargs)["Body"]
    try:
        yield from body.iter_chunks(CHUNK_BYTES)
    finally:
        body.close()


def iter_ranges(
    bucket: str, ranges: Iterable[tuple[str, int, int]], *, ahead: int = 4, where: str | None = None
) -> Iterator[bytes]:
    """The bytes of each `(key, start, end)` range of `bucket`, in order, up to `ahead` GETs at once.

    For many small objects (the result parts of a batch) S3's latency, not its bandwidth, is the
    limit: fetching the next ranges while the current one is consumed hides it. Each range is read
    whole, so memory holds about `ahead` ranges. Empty ranges cost no request.
    """
    client = s3_client(where)

    def fetch(key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"].read()

    todo = iter(ranges)
    with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="s3-ranges") as pool:
        pending = deque(pool.submit(fetch, *r) for r in itertools.islice(todo, ahead))
        while pending:
            data = pending.popleft().result()
            if (following := next(todo, None)) is not None:
                pending.append(pool.submit(fetch, *following))
            if data:
                yield data


def get_bytes(bucket: str, key: str, *, where: str | None = None) -> bytes:
    """A whole (small) object: shard inputs and results, never user files."""
    return s3_client(where).get_object(Bucket=bucket, Key=key)["Body"].read()


def put_bytes(
    bucket: str,
    key: str,
    data: bytes,
    content_type: str = "application/jsonl",
    *,
    where: str | None = None,
    metadata: dict[str, str] | None = None,
) -> None:
    """One PUT of a small object, with optional user metadata (`x-amz-meta-*`)."""
    s3_client(where).put_object(
        Bucket=bucket, Key=key, Body=data, ContentType=content_type, Metadata=metadata or {}
    )


def head_metadata(bucket: str, key: str) -> dict[str, str] | None:
    """The user metadata of an object in the service bucket, or None when there is no such object."""
    try:
        return s3_client(None).head_object(Bucket=bucket, Key=key)["Metadata"]
    except ClientError as error:
        if error.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


class _IterReader(io.RawIOBase):
    """A read-only file object over an iterable of byte chunks (for `upload_fileobj`)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = memoryview(b"")  # slicing a memoryview copies nothing
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        self.total += size
        return size


def upload_stream(
    bucket: str,
    key: str,
    chunks: Iterable[bytes],
    content_type: str = "application/jsonl",
    *,
    where: str | None = None,
) -> int:
    """Stream chunks into one object (multipart above 8 MiB, by s3transfer). Returns bytes written."""
    reader = _IterReader(chunks)
    s3_client(where).upload_fileobj(
        io.BufferedReader(reader, CHUNK_BYTES),
        bucket,
        key,
        ExtraArgs={"ContentType": content_type},
        Config=_TRANSFER,
    )
    return reader.total


def presigned_get(
    bucket: str, key: str, *, expires_in: int = 900, filename: str | None = None, where: str | None = None
) -> str:
    """A short-lived (`expires_in` seconds) download URL for an object.

    A URL cannot carry `ExpectedBucketOwner` (its user would have to send the header), so for a bucket
    of AWS S3 other than the service's own, the owner is checked by a HeadBucket (which carries it)
    before the URL is made. Raises `locations.Unavailable` when that bucket is another account's (403)
    or gone.
    """
    if not where and bucket != get_settings().bucket_name:
        check_bucket(Location("s3", bucket, key))
    params: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if filename:
        params["ResponseContentDisposition"] = content_disposition(filename)
    return s3_client(where).generate_presigned_url("get_object", Params=params, ExpiresIn=expires_in)


def content_disposition(filename: str) -> str:
    """`Content-Disposition: attachment` naming `filename` safely, whatever it holds (RFC 6266).

    `filename="..."` is an ASCII fallback in which quotes, backslashes, slashes, control and
    non-ASCII characters become `_` (so no name can close the quotes or break the header), and
    `filename*=UTF-8''...` the exact name, percent-encoded (RFC 8187), which clients prefer.
    """
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\/' else "_" for c in filename)
    exact = quote(filename.encode("utf-8", "replace"), safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{exact}"


@cache
def _sigv4_presigner(endpoint: str | None) -> Any:
    # SigV4 signs the headers given (SigV2, boto3's default for presigning in us-east-1, cannot sign
    # Content-Length): the URL then takes exactly the declared size and type.
    return boto3.session.Session().client("s3", config=Config(signature_version="s3v4"))


def presigned_put(bucket: str, key: str, *, expires_in: int, content_type: str, content_length: int) -> str:
    """A URL that accepts a `PUT` of exactly `content_length` bytes of `content_type` at `key` of the
    service bucket for `expires_in` seconds: both headers are signed (SigV4 `X-Amz-SignedHeaders`),
    so S3 refuses any other size or type with 403 `SignatureDoesNotMatch`.
    """
    params = {"Bucket": bucket, "Key": key, "ContentType": content_type, "ContentLength": content_length}
    return _sigv4_presigner(os.environ.get("AWS_ENDPOINT_URL")).generate_presigned_url(
        "put_object", Params=params, ExpiresIn=expires_in
    )


class SizeMismatch(Exception):
    """Objects concatenated by `concatenate` hold `actual` bytes where `expected` were declared (at
    least `actual`: the copy stops as soon as it passes `expected`); nothing was written."""

    def __init__(self, actual: int, expected: int) -> None:
        super().__init__(f"{actual} bytes, {expected} expected")
        self.actual, self.expected = actual, expected


def concatenate(bucket: str, sources: list[str], key: str, *, expected_bytes: int, content_type: str) -> str:
    """Write the objects `sources` of `bucket`, in order, as one object `key` of the same bucket, streamed
    (about 1 MiB read at a time, 8 MiB parts written: memory does not grow with the size).

    Returns the MD5 (hex) of the bytes written. Raises `SizeMismatch` before anything is written (the
    multipart upload is aborted) when the sources do not hold exactly `expected_bytes` bytes. A
    streamed copy, not `UploadPartCopy`: that copies parts of at least 5 MiB from one source each,
    and the parts a client sends through the API are smaller than a request (6 MB).
    """
    digest = hashlib.md5(usedforsecurity=False)

    def checked() -> Iterator[bytes]:
        total = 0
        for chunk in itertools.chain.from_iterable(iter_chunks(bucket, source) for source in sources):
            total += len(chunk)
            if total > expected_bytes:
                raise SizeMismatch(total, expected_bytes)
            digest.update(chunk)
            yield chunk
        if total != expected_bytes:
            raise SizeMismatch(total, expected_bytes)

    upload_stream(bucket, key, checked(), content_type)
    return digest.hexdigest()


def read_at_most(bucket: str, key: str, limit: int, *, where: str | None = None) -> bytes | None:
    """The whole object if it holds at most `limit` bytes, else None, having read none of its body (the
    size is the GET's `Content-Length`, so an object grown since it was recorded is never read whole).
    """
    response = s3_client(where).get_object(Bucket=bucket, Key=key)
    body = response["Body"]
    try:
        return body.read() if int(response["ContentLength"]) <= limit else None
    finally:
        body.close()


def size(bucket: str, key: str, *, where: str | None = None) -> int | None:
    """The size in bytes of an object, or None when there is no such object."""
    try:
        return int(s3_client(where).head_object(Bucket=bucket, Key=key)["ContentLength"])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def delete(bucket: str, key: str, *, where: str | None = None) -> None:
    s3_client(where).delete_object(Bucket=bucket, Key=key)
