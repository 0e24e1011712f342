"""Unit tests of `batchinfer.api.anthropic_view`: each kind of result line in Anthropic's shape, in
input order, and the MessageBatch of a running batch."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchinfer.api import anthropic_view
from batchinfer.data.items import BatchHeader

HEADER = {
    "id": "batch_1",
    "account_id": "a",
    "endpoint": "/v1/messages",
    "input_file_id": "file-1",
    "completion_window": "24h",
    "created_at": 1_800_000_000,
    "expires_at": 1_800_086_400,
    "input_bucket": "b",
    "input_key": "files/file-1",
    "output_bucket": "b",
    "output_prefix": "batches/batch_1/",
}


def line(custom_id: str, status: int | None, body: Any = None, error: Any = None) -> dict[str, Any]:
    response = None if status is None else {"status_code": status, "request_id": "r", "body": body}
    return {"id": "x", "custom_id": custom_id, "response": response, "error": error}


def test_every_kind_of_result_line_in_input_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a cancelled batch's output and error files
    files = {
        "batches/batch_1/output.jsonl": [line("ok", 200, {"type": "message"})],
        "batches/batch_1/error.jsonl": [
            line("bad", 400, {"error": {"message": "params.x: no", "code": "invalid_request_error"}}),
            line("gone", 404, {"error": {"message": "no model", "code": "not_found_error"}}),
            line("down", 503, {"error": {"message": "backend down", "code": None}}),
            line("stuck", None, error={"code": "processing_failed", "message": "gave up"}),
            line("late", None, error={"code": "batch_cancelled", "message": "cancelled"}),
        ],
    }
    monkeypatch.setattr(anthropic_view, "_lines", lambda bucket, key, where: iter(files[key]))
    header = BatchHeader(
        **HEADER,
        status="cancelled",
        output_file_id="file-o",
        error_file_id="file-e",
        cancelled_at=1_800_000_100,
    )

    # When its results are read with the input's order
    order = ["late", "ok", "bad", "gone", "down", "stuck", "never"]
    lines = [json.loads(text) for text in anthropic_view.results(header, order).splitlines()]

    # Then each request has one line of its kind
    def errored(kind: str, message: str) -> dict[str, Any]:
        return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message}}}

    assert lines == [
        {"custom_id": "late", "result": {"type": "canceled"}},
        {"custom_id": "ok", "result": {"type": "succeeded", "message": {"type": "message"}}},
        {"custom_id": "bad", "result": errored("invalid_request_error", "params.x: no")},
        {"custom_id": "gone", "result": errored("not_found_error", "no model")},
        {"custom_id": "down", "result": errored("api_error", "backend down")},
        {"custom_id": "stuck", "result": errored("api_error", "gave up")},
        {"custom_id": "never", "result": errored("api_error", "the batch failed")},
    ]


def test_a_running_batch_counts_what_its_workers_finished() -> None:
    header = BatchHeader(
        **HEADER,
        status="in_progress",
        request_counts={"total": 5, "completed": 1, "failed": 1},
        live={"0": {"start": 2, "completed": 1}},
    )

    batch = anthropic_view.message_batch(header).model_dump(mode="json")

    assert batch["processing_status"] == "in_progress"
    assert batch["request_counts"] == {
        "processing": 2,
        "succeeded": 2,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    assert (batch["ended_at"], batch["results_url"]) == (None, None)
