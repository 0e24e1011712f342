"""Unit tests of `batchinfer.validation.sniff`: what a file is when it is not JSON Lines at all."""

from __future__ import annotations

import pytest

from batchinfer.validation.sniff import jsonl_format_problem


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", None),
        (b"\n\n", None),
        (b'{"custom_id": "a"}\n', None),
        (b'{\n{"custom_id": "a"}\n', None),  # a bad line among objects: prepare reports it, with its number
        (
            b"\xef\xbb\xbf[\n",
            "it is a JSON array; this must be JSON Lines (one request object per line), without [ ] or "
            "commas.",
        ),
        (
            b"[1, 2]\n",
            "none of its first 1 line(s) is a JSON object (line 1 is not a JSON object); "
            "this must be JSON Lines (one request object per line).",
        ),
        (
            b"{\n" * 7,
            "none of its first 5 line(s) is a JSON object (line 1 is not valid JSON); "
            "this must be JSON Lines (one request object per line).",
        ),
    ],
)
def test_jsonl_format_problem_refuses_only_files_that_are_not_json_lines(
    content: bytes, problem: str | None
) -> None:
    assert jsonl_format_problem(content) == problem
