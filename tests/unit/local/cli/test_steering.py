"""`download --merged` and `--partial` (cli/steering.py) against a stub client: the latest line of
each custom_id across a batch and its ended retries, and the pages of the partial output joined."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from batchinfer.core.ids import retry_batch_id
from batchinfer_local import cli
from batchinfer_local.cli.steering import merged, write_partial
from batchinfer_local.client import ApiError


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
