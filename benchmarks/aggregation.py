"""Aggregation: MB/s of merging a batch's shard results into output.jsonl / error.jsonl, against a raw
S3 copy of the same bytes through the same client (one streamed GET into the same multipart upload)
on the same moto server."""

from __future__ import annotations

from typing import Any

from benchmarks.common import Stopwatch


def measure(requests: int = 20_000, rounds: int = 2) -> dict[str, Any]:
    """Both timings on a batch of `requests` results (best of `rounds`; the aggregator is idempotent)."""
    from batchinfer.core import aws
    from batchinfer.core.settings import get_settings
    from batchinfer.data import batches, s3, shards
    from batchinfer.pipeline.aggregate import finalize_batch
    from benchmarks.aws_env import moto_environment
    from benchmarks.pipeline import instant_model, run_shards

    with moto_environment(), instant_model():
        batch_id = run_shards(requests)
        bucket = get_settings().bucket_name
        assert batches.get(batch_id) is not None
        shard_count = len(list(shards.query(batch_id)))
        best_ours = best_raw = float("inf")
        for round_ in range(rounds):
            if round_:  # run the aggregation again: back to "all shards done, not sealed"
                _reopen(batch_id)
            with Stopwatch() as ours:
                assert finalize_batch(batch_id) == "completed"
            best_ours = min(best_ours, ours.seconds)
            total = sum(
                s3.size(bucket, f"batches/{batch_id}/{kind}.jsonl") or 0 for kind in ("output", "error")
            )
            client = aws.client("s3")
            with Stopwatch() as raw:
                body = client.get_object(Bucket=bucket, Key=f"batches/{batch_id}/output.jsonl")["Body"]
                client.upload_fileobj(body, bucket, f"bench/copy-{round_}.jsonl", Config=s3._TRANSFER)
            best_raw = min(best_raw, raw.seconds)
    mib = total / 2**20
    return {
        "requests": requests,
        "shards": shard_count,
        "mib": mib,
        "ours": mib / best_ours,
        "raw": mib / best_raw,
    }


def _reopen(batch_id: str) -> None:
    # The header as the last shard commit left it: in progress, every shard done, not sealed.
    # Not a status change the status machine allows: written directly.
    from batchinfer.core import aws
    from batchinfer.data import keys

    aws.table().update_item(
        Key=keys.batch(batch_id),
        UpdateExpression="SET #s = :p REMOVE sealed, final_status",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":p": "in_progress"},
    )


if __name__ == "__main__":
    print(measure())
