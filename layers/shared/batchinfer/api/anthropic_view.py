"""What a Message Batch looks like in Anthropic's dialect: the `MessageBatch` of a batch header, and its
results as JSON Lines in input order, made from the batch's input file and its output/error files.

Request states: a line of output.jsonl is `succeeded`; a line of error.jsonl that ran is `errored`
(its error's type: the line's `code` when it is one of Anthropic's types, else `invalid_request_error`
for a 4xx and `api_error` for a 5xx); one that never ran is `canceled` (`batch_cancelled`) or
`expired` (`batch_expired`), else `errored`. A request with no result line at all (a batch that
failed before running) is `errored` with the batch's own error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, get_args

from batchinfer.data import s3, shards
from batchinfer.data.items import BatchHeader
from batchinfer.wire.anthropic import ErrorType, MessageBatch, RequestCounts
from batchinfer.wire.status import BatchStatus, is_terminal

_ENDED_AT = ("completed_at", "failed_at", "expired_at", "cancelled_at")
_ERROR_TYPES = frozenset(get_args(ErrorType))
_UNRUN = {"batch_cancelled": "canceled", "batch_expired": "expired"}


def results_url(batch_id: str) -> str:
    """Where a batch's results are read (relative: the SDK resolves it against its base URL)."""
    return f"/v1/messages/batches/{batch_id}/results"


def _unrun(header: BatchHeader) -> int:
    """Requests of an ended batch that never ran: its total less what its shards committed."""
    ran = sum(shard.completed + shard.failed for shard in shards.query(header.id))
    return max(header.request_counts.total - ran, 0)


def _counts(header: BatchHeader) -> RequestCounts:
    counts, _ = header.shown_counts()
    total = counts.total
    if header.status == BatchStatus.FAILED:
        return RequestCounts(errored=total)
    if not is_terminal(header.status):
        return RequestCounts(
            processing=total - counts.completed - counts.failed,
            succeeded=counts.completed,
            errored=counts.failed,
        )
    unrun = _unrun(header) if header.status in (BatchStatus.CANCELLED, BatchStatus.EXPIRED) else 0
    kind = "canceled" if header.status == BatchStatus.CANCELLED else "expired"
    return RequestCounts(
        succeeded=counts.completed,
        errored=total - counts.completed - unrun,
        **({kind: unrun} if unrun else {}),
    )


def message_batch(header: BatchHeader) -> MessageBatch:
    """The `MessageBatch` of a batch header: `in_progress` until it ends (`canceling` once cancelled),
    live counts meanwhile (requests the workers finished count as succeeded/errored at once), the
    exact counts once ended. Ended batches read their shards once to count what never ran."""
    ended = is_terminal(header.status)
    status = "ended" if ended else "canceling" if header.status == BatchStatus.CANCELLING else "in_progress"
    ended_at = next((getattr(header, name) for name in _ENDED_AT if getattr(header, name)), None)
    return MessageBatch(
        id=header.id,
        processing_status=status,
        request_counts=_counts(header),
        created_at=header.created_at,
        expires_at=header.expires_at,
        ended_at=ended_at if ended else None,
        cancel_initiated_at=header.cancelling_at,
        results_url=results_url(header.id) if ended else None,
    )


def _lines(bucket: str, key: str, where: str) -> Iterator[dict[str, Any]]:
    data = s3.get_bytes(bucket, key, where=where)
    for line in data.splitlines():
        if line.strip():
            yield json.loads(line)


def _result(line: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic result of one OpenAI-shaped result line."""
    response = line.get("response")
    if response is not None and response.get("status_code") == 200:
        return {"type": "succeeded", "message": response["body"]}
    if response is None:
        error = line.get("error") or {}
        if (kind := _UNRUN.get(error.get("code", ""))) is not None:
            return {"type": kind}
        return _errored("api_error", error.get("message", "the request was not run"))
    error = (response.get("body") or {}).get("error") or {}
    code = error.get("code")
    kind = code if code in _ERROR_TYPES else "invalid_request_error"
    if response["status_code"] >= 500 and code not in _ERROR_TYPES:
        kind = "api_error"
    return _errored(kind, str(error.get("message") or "the request failed"))


def _errored(kind: str, message: str) -> dict[str, Any]:
    return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message}}}


def results(header: BatchHeader, custom_ids: list[str]) -> bytes:
    """The JSON Lines of an ended batch's results, one per request in `custom_ids`' order (its input)."""
    found: dict[str, dict[str, Any]] = {}
    for kind, file_id in (("output", header.output_file_id), ("error", header.error_file_id)):
        if file_id:
            key = f"{header.output_prefix}{kind}.jsonl"
            for line in _lines(header.output_bucket, key, header.output_where):
                found[line["custom_id"]] = _result(line)
    failure = header.errors.data[0].message if header.errors and header.errors.data else "the batch failed"
    out = bytearray()
    for custom_id in custom_ids:
        result = found.get(custom_id) or _errored("api_error", failure)
        out += json.dumps({"custom_id": custom_id, "result": result}, separators=(",", ":")).encode() + b"\n"
    return bytes(out)


def input_custom_ids(bucket: str, key: str, where: str = "") -> list[str]:
    """The `custom_id`s of a Message Batch's input file, in order."""
    return [line["custom_id"] for line in _lines(bucket, key, where)]


__all__ = ["input_custom_ids", "message_batch", "results", "results_url"]
