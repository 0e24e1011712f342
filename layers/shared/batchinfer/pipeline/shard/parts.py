"""A shard's results as parts: result lines (`render`, `never_ran`), one PUT per part to a key of its
writer's own (`write_part`, its counts in the object's metadata), and the recovery of a part an
earlier attempt wrote but never committed (`recover_part`)."""

from __future__ import annotations

from dataclasses import dataclass

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import s3
from batchinfer.data.items import ResultPart
from batchinfer.endpoints.base import Endpoint
from batchinfer.pipeline.shard.requests import COUNTS, Outcome, Request
from batchinfer.wire.openai import result_line_bytes


def tally(counts: dict[str, int], outcome: Outcome, endpoint: Endpoint) -> None:
    """Add one outcome to `counts` (`COUNTS`: completed, failed, input, output and cached tokens), its
    tokens as the batch's `endpoint` counts them."""
    if outcome.ok:
        usage = endpoint.usage(outcome.body or {})
        counts["completed"] += 1
        counts["input_tokens"] += usage.input_tokens
        counts["output_tokens"] += usage.output_tokens
        counts["cached_tokens"] += usage.cached_tokens
    else:
        counts["failed"] += 1


def render(batch_id: str, outcomes: list[Outcome], endpoint: Endpoint) -> tuple[bytes, int, dict[str, int]]:
    """Result lines: successes first, then failures, each in input order; tokens counted by the
    batch's `endpoint`.

    Returns (bytes, length of the success part, counts `COUNTS`).
    """
    good, bad = bytearray(), bytearray()
    counts = dict.fromkeys(COUNTS, 0)
    for outcome in outcomes:
        encoded = result_line_bytes(
            line_id=ids.request_id(batch_id, outcome.request.line),
            custom_id=outcome.request.custom_id,
            status_code=outcome.status_code,
            request_id=outcome.request_id,
            body=outcome.body,
            error=outcome.error,
        )
        if outcome.ok:
            good += encoded
        else:
            bad += encoded
        tally(counts, outcome, endpoint)
    return bytes(good + bad), len(good), counts


def never_ran(
    batch_id: str, requests: list[Request], code: str, message: str
) -> tuple[bytes, dict[str, int]]:
    """Error lines (`response: null`, `error {code, message}`) for requests that were not answered."""
    data = bytearray()
    for request in requests:
        data += result_line_bytes(
            line_id=ids.request_id(batch_id, request.line),
            custom_id=request.custom_id,
            status_code=None,
            request_id=None,
            body=None,
            error={"code": code, "message": message},
        )
    return bytes(data), {**dict.fromkeys(COUNTS, 0), "failed": len(requests)}


@dataclass(frozen=True, slots=True)
class Recovered:
    """Results an earlier writer put for a part of a shard and never committed, copied to a key of this
    writer's own (`part.key`): the part, its counts, and the earlier writer's key (`source`: garbage
    once `part` is committed, `discard`)."""

    part: ResultPart
    counts: dict[str, int]
    source: str


def recover_part(batch_id: str, shard_no: int, start: int) -> Recovered | None:
    """Results an earlier attempt wrote for `[start, ...)` of a shard but died (or lost its lease)
    before committing, if any: the first such object (a ListObjectsV2, a HeadObject for its counts, see
    `write_part`) copied to a key of this writer's own, ready to commit.

    Copied, not committed under the earlier writer's key, so each key is only ever committed by its
    own writer: a refused writer may delete its key (`discard`) without racing a recovery of it."""
    bucket = get_settings().bucket_name
    for source in s3.keys_under(bucket, s3.result_prefix(batch_id, shard_no, start)):
        meta = s3.head_metadata(bucket, source)
        if meta is None or "end" not in meta:
            continue
        key = s3.result_key(batch_id, shard_no, start, ids.write_token())
        if not s3.copy(bucket, source, key):
            continue  # its writer deleted it meanwhile
        # A part written before cached tokens were counted has no cached-tokens: 0.
        counts = {name: int(meta.get(name.replace("_", "-"), 0)) for name in COUNTS}
        part = ResultPart(
            key=key,
            start=start,
            end=int(meta["end"]),
            output_bytes=int(meta["output-bytes"]),
            bytes=int(meta["bytes"]),
        )
        return Recovered(part, counts, source)
    return None


def discard(key: str) -> None:
    """Delete a result key no commit names (a refused writer's own, or a recovered part's source).
    Safe: a key is committed only by the writer that made it, and never after its commit was refused."""
    s3.delete(get_settings().bucket_name, key)


def write_part(
    batch_id: str, shard_no: int, start: int, end: int, data: bytes, output_bytes: int, counts: dict[str, int]
) -> ResultPart:
    """One PUT of a part's result lines to a key of this write's own (`s3.result_key`: a writer that
    lost the lease can't overwrite what its new holder commits); its counts ride along as object
    metadata for `recover_part`."""
    key = s3.result_key(batch_id, shard_no, start, ids.write_token())
    part = ResultPart(key=key, start=start, end=end, output_bytes=output_bytes, bytes=len(data))
    metadata = {
        "end": str(end),
        "output-bytes": str(output_bytes),
        "bytes": str(len(data)),
        **{name.replace("_", "-"): str(counts[name]) for name in COUNTS},
    }
    s3.put_bytes(get_settings().bucket_name, key, data, metadata=metadata)
    return part
