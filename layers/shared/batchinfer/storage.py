"""S3 access that streams: bounded memory whatever the object size.

Keys in the service bucket (DESIGN.md): `files/<file_id>`, `batches/<id>/shards/<n>.jsonl`,
`batches/<id>/results/<n>.<start>.jsonl`, `batches/<id>/output.jsonl`, `batches/<id>/error.jsonl`.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import Any

from boto3.s3.transfer import TransferConfig

from batchinfer.aws import client

CHUNK_BYTES = 1024 * 1024
# 8 MiB parts: above S3's 5 MiB multipart minimum, and bounded memory (s3transfer queues a few).
_TRANSFER = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024,
                           max_concurrency=4, use_threads=True)


def shard_key(batch_id: str, shard: int) -> str:
    return f"batches/{batch_id}/shards/{shard:05d}.jsonl"


def result_key(batch_id: str, shard: int, start: int) -> str:
    """Results of requests `[start, ...)` of a shard: deterministic, so a retry overwrites."""
    return f"batches/{batch_id}/results/{shard:05d}.{start:05d}.jsonl"


def iter_chunks(bucket: str, key: str, *, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bytes of an object (or of the range `[start, end)`) in chunks of about 1 MiB.

    Raises botocore `ClientError` (`NoSuchKey`, `AccessDenied`) when the object can't be read.
    """
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if start or end is not None:
        if end is not None and end <= start:
            return
        kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    body = client("s3").get_object(**kwargs)["Body"]
    try:
        yield from body.iter_chunks(CHUNK_BYTES)
    finally:
        body.close()


def get_bytes(bucket: str, key: str) -> bytes:
    """A whole (small) object: shard inputs and results, never user files."""
    return client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


def put_bytes(bucket: str, key: str, data: bytes, content_type: str = "application/jsonl") -> None:
    client("s3").put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)


class _IterReader(io.RawIOBase):
    """A read-only file object over an iterable of byte chunks (for `upload_fileobj`)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        self.total += size
        return size


def upload_stream(bucket: str, key: str, chunks: Iterable[bytes], content_type: str = "application/jsonl") -> int:
    """Stream chunks into one object (multipart above 8 MiB, by s3transfer). Returns bytes written."""
    reader = _IterReader(chunks)
    client("s3").upload_fileobj(io.BufferedReader(reader, CHUNK_BYTES), bucket, key,
                                ExtraArgs={"ContentType": content_type}, Config=_TRANSFER)
    return reader.total


def presigned_get(bucket: str, key: str, *, expires_in: int = 900, filename: str | None = None) -> str:
    """A short-lived (seconds) download URL for an object."""
    params: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if filename:
        params["ResponseContentDisposition"] = f'attachment; filename="{filename}"'
    return client("s3").generate_presigned_url("get_object", Params=params, ExpiresIn=expires_in)


def delete(bucket: str, key: str) -> None:
    client("s3").delete_object(Bucket=bucket, Key=key)
