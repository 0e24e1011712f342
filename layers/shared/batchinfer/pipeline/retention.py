"""Result files that expire: a batch created with `output_expires_after` has its output and error
files deleted once `expires_at` (created_at + seconds) has passed, by the sweeper.

Why the sweeper and not an S3 lifecycle rule: a lifecycle rule counts whole days from the object's
creation and runs about once a day (an hour's expiry could take two days), and it knows nothing of
the File object in DynamoDB, which would stay listed with a dead object. The sweeper runs every 5
minutes, deletes both, and each step is idempotent: a file already deleted (by its owner, or by a
sweep that died half-way) is skipped, and the marker goes last, so an interrupted sweep redoes it.
"""

from __future__ import annotations

from batchinfer.core.observability import logger
from batchinfer.data import files, s3
from batchinfer.data.table import now


def expire_files(at: int | None = None, limit: int = 100) -> int:
    """Delete the result files whose `expires_at` is at or before `at` (Unix seconds, default now):
    their objects, then their File records, then their markers. Returns how many markers were done
    (at most `limit` per call: the next sweep takes the rest)."""
    at = now() if at is None else at
    done = 0
    for expires_at, file_id in files.due_expiries(at, limit):
        record = files.get(file_id)
        # A record rewritten with another expiry (an aggregator run again) is not due by this marker.
        if record is not None and record.expires_at is not None and record.expires_at <= at:
            s3.delete(record.bucket, record.key, where=record.where)
            files.remove(record)
            logger.info("result file expired", extra={"file_id": file_id, "expires_at": expires_at})
        files.drop_expiry(expires_at, file_id)
        done += 1
    return done
