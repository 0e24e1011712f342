"""`download --merged` and `--partial` (cli/steering.py) against a stub client: the latest line of
each custom_id across a batch and its ended retries, and the pages of the partial output joined."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from batchinfer.core.ids import retry_batch_id
from batchinfer_local import cli
from batchinfer_local.cli.steering import merged, write_partial
from batchinfer_local.client import ApiError, BatchClient


def line(custom_id: str, answer: str | None) -> bytes:
    error = None if answer else {"code": "server_error", "message": "overloaded"}
    return json.dumps({"custom_id": custom_id, "answer": answer, "error": error}).encode() + b"\n"


class Stub:
    """Batches by id, their result files by file id, and pages of partial output."""

    def __init__(
        self, batches: list[dict[str, Any]], files: dict[str, bytes], pages: list[tuple] = ()
    ) -> None:
        self.by_id, self.files, self.pages = {b["id"]: b for b in batches}, files, list(pages)
        self.afters: list[int] = []

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        if batch_id not in self.by_id:
            raise ApiError(404, "not found", code="batch_not_found")
        return self.by_id[batch_id]

    def content(self, file_id: str) -> bytes:
        return self.files[file_id]

    def output_page(self, batch_id: str, after: int) -> tuple[bytes, int, bool, bool]:
        self.afters.append(after)
        return self.pages.pop(0)


def batch(batch_id: str, status: str = "completed", **files: str) -> dict[str, Any]:
    return {"id": batch_id, "status": status, **{f"{kind}_file_id": f for kind, f in files.items()}}


def test_merged_takes_each_custom_ids_latest_line_across_the_retries() -> None:
    # Given a batch (a ok, b and c failed), its retry (b ok, c failed again) and the retry's retry (c ok)
    first, second = retry_batch_id("batch_1"), retry_batch_id(retry_batch_id("batch_1"))
    stub = Stub(
        [
            batch("batch_1", output="o1", error="e1"),
            batch(first, output="o2", error="e2"),
            batch(second, output="o3"),
        ],
        {
            "o1": line("a", "A"),
            "e1": line("b", None) + line("c", None),
            "o2": line("b", "B"),
            "e2": line("c", None),
            "o3": line("c", "C"),
        },
    )
    # When they are merged
    data, retries = merged(stub, stub.by_id["batch_1"])
    # Then each custom_id has its latest line, in the order they first appeared
    assert data == line("a", "A") + line("b", "B") + line("c", "C")
    assert retries == 2


def test_merged_leaves_out_a_retry_that_still_runs() -> None:
    retry = retry_batch_id("batch_1")
    stub = Stub(
        [batch("batch_1", output="o1", error="e1"), batch(retry, "in_progress")],
        {"o1": line("a", "A"), "e1": line("b", None)},
    )

    assert merged(stub, stub.by_id["batch_1"]) == (line("a", "A") + line("b", None), 0)


def test_partial_joins_the_pages_until_no_more(tmp_path: Path) -> None:
    stub = Stub([], {}, [(line("a", "A"), 1, True, False), (line("b", "B"), 2, False, False)])

    path = write_partial(stub, "batch_1", tmp_path, argparse.Namespace(json=True))

    assert path.read_bytes() == line("a", "A") + line("b", "B")
    assert stub.afters == [0, 1]


def test_the_steering_options_parse() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["retry", "batch_1"]).batch_id == "batch_1"
    assert parser.parse_args(["download", "batch_1", "--merged"]).merged is True
    assert parser.parse_args(["download", "batch_1", "--partial"]).partial is True
    assert parser.parse_args(["submit", "f.jsonl", "--dry-run"]).dry_run is True


ESTIMATE = {
    "object": "batch.dry_run",
    "input_file_id": "file-1",
    "model": "smollm2-135m-instruct",
    "valid": True,
    "errors": {"object": "list", "data": []},
    "request_counts": {"total": 3, "valid": 3},
    "usage": {
        "input_tokens": 113,
        "output_tokens": 15,
        "total_tokens": 128,
        "input_tokens_method": "tokenizer",
    },
    "estimated_cost": {"currency": "USD", "input": 2.26e-06, "output": 6e-07, "total": 2.86e-06},
}
INVALID = {
    **ESTIMATE,
    "valid": False,
    "errors": {"object": "list", "data": [{"code": "invalid_json_line", "message": "not JSON", "line": 2}]},
    "estimated_cost": None,
}


@pytest.mark.parametrize(
    ("estimate", "code", "printed"),
    [
        (
            ESTIMATE,
            0,
            "dry run of file-1: valid, 3 requests, model smollm2-135m-instruct\n"
            "tokens: 113 input (tokenizer), 15 output at most; estimated cost: 2.86e-06 USD\n",
        ),
        (
            INVALID,
            1,
            "dry run of file-1: invalid, 3 requests, model smollm2-135m-instruct\n"
            "  line 2: invalid_json_line: not JSON\n",
        ),
    ],
)
def test_submit_dry_run_prints_the_estimate_and_creates_nothing(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    estimate: dict,
    code: int,
    printed: str,
) -> None:
    # Given a file, and an API that answers its dry run
    path = tmp_path / "in.jsonl"
    path.write_text('{"url": "/v1/chat/completions"}\n')
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(BatchClient, "upload", lambda self, p: {"id": "file-1", "bytes": 30})
    monkeypatch.setattr(BatchClient, "dry_run", lambda self, file_id, **kw: asked.append(kw) or estimate)
    monkeypatch.setattr(BatchClient, "create", lambda *a, **kw: pytest.fail("a dry run creates no batch"))
    # When it is submitted with --dry-run, then the estimate is printed and the exit code says valid
    assert cli.main(["submit", str(path), "--dry-run", "--api-key", "k"]) == code
    assert capsys.readouterr().out == printed
    assert asked == [{"endpoint": "/v1/chat/completions", "completion_window": "24h"}]
