"""`SeenIds`: the Bloom-filtered set of a file's custom_ids answers exactly, and names the first line."""

from __future__ import annotations

import json

from batchinfer.validation.file import FileValidator
from batchinfer.validation.seen_ids import SeenIds

MODEL = "smollm2-135m-instruct"


def test_seen_ids_are_exact_even_when_the_filter_says_maybe_to_everything() -> None:
    # Given a filter sized for 1 id, so that after a few thousand ids it answers "maybe" to all
    seen = SeenIds(1)
    for line in range(1, 10_001):  # 200 kB of records: most of them in the temporary file
        seen.add(f"id-{line}", line)

    # Then a search tells the ids it has from those it has not, with the line of each
    assert seen.maybe_seen("never-added")
    assert seen.first_line("never-added") is None
    assert seen.first_line("id-1") == 1
    assert seen.first_line("id-5000") == 5000
    assert seen.first_line("id-10000") == 10_000  # still in memory, not yet in the file
    assert seen.first_line("id-10001") is None
    seen.close()


def test_seen_ids_without_search_report_line_zero_for_maybe_and_none_for_certainly_new() -> None:
    seen = SeenIds(1000)
    seen.add("a", 7)
    assert seen.first_line("a", exact=False) == 0
    assert seen.first_line("b", exact=False) is None
    assert seen.first_line("a") == 7


def test_seen_ids_keep_ids_that_differ_only_in_case_whitespace_or_surrogates_apart() -> None:
    seen = SeenIds(100)
    for line, custom_id in enumerate(["req-1", "REQ-1", "req-1 ", "a\ud800", "a\udc00"], start=1):
        assert seen.first_line(custom_id) is None
        seen.add(custom_id, line)
    assert [seen.first_line(i) for i in ["req-1", "REQ-1", "req-1 ", "a\ud800", "a\udc00"]] == [1, 2, 3, 4, 5]


def test_duplicates_far_apart_in_a_large_file_name_the_first_line() -> None:
    lines = [
        json.dumps(
            {
                "custom_id": f"r-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
            }
        )
        for i in range(20_000)
    ]
    lines.append(lines[3])
    validator = FileValidator("/v1/chat/completions", {MODEL}.__contains__)
    requests = list(validator.validate_stream([("\n".join(lines) + "\n").encode()]))
    assert len(requests) == 20_000
    assert [(e.code, e.line) for e in validator.errors] == [("duplicate_custom_id", 20_001)]
    assert "duplicates line 4" in validator.errors[0].message
