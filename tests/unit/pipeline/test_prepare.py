"""prepare's pure part: `shard_lines` groups the valid requests of a streamed file into shard files."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from batchinfer.pipeline.prepare import shard_lines
from batchinfer.validation.file import FileValidator
from batchinfer.validation.jsonl import iter_physical_lines

MODEL = "m"


def line(custom_id: str) -> bytes:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": custom_id}]},
        }
    ).encode()


def run(
    chunks: list[bytes],
    shard_size: int | Callable[[str | None], int],
    *,
    max_file_bytes: int = 10**6,
    **options: int,
) -> tuple[list[tuple[int, int, bytes]], FileValidator]:
    """The shards `shard_lines` yields for a file arriving in `chunks`, and its validator afterwards."""
    validator = FileValidator("/v1/chat/completions", {MODEL}.__contains__, max_file_bytes=max_file_bytes)
    lines = iter_physical_lines(chunks, 4096, max_total_bytes=max_file_bytes)
    size_for = shard_size if callable(shard_size) else lambda _model: shard_size
    return list(shard_lines(lines, validator, size_for, **options)), validator


def in_chunks(data: bytes, size: int = 7) -> list[bytes]:
    """`data` cut into chunks that split lines anywhere (as S3's stream does)."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_shards_hold_shard_size_requests_numbered_by_their_physical_lines() -> None:
    # Given blank lines before and between five requests (physical lines 2, 3, 5, 6 and 7)
    a, b, c, d, e = (line(x) for x in "abcde")
    data = b"\n" + a + b"\n" + b + b"\n \n" + c + b"\n" + d + b"\n" + e + b"\n"
    shards, validator = run(in_chunks(data), shard_size=2)
    # Then each shard starts at its first request's line, and the last one holds the rest
    assert shards == [
        (2, 2, b"2\t" + a + b"\n3\t" + b + b"\n"),
        (5, 2, b"5\t" + c + b"\n6\t" + d + b"\n"),
        (7, 1, b"7\t" + e + b"\n"),
    ]
    assert (validator.ok, validator.request_count) == (True, 5)


def test_the_shard_size_may_depend_on_the_files_model_and_is_asked_once() -> None:
    asked: list[str | None] = []

    def size_for(model: str | None) -> int:
        asked.append(model)
        return 3

    shards, _ = run([b"".join(line(x) + b"\n" for x in "abcdefg")], shard_size=size_for)
    assert ([(first, size) for first, size, _ in shards], asked) == ([(1, 3), (4, 3), (7, 1)], [MODEL])


def test_a_shard_also_ends_at_its_byte_bound() -> None:
    # Given requests of len(line) + 2 bytes in a shard ("<line>\t<request>\n"), a bound of two of them
    one = len(b"1\t" + line("a") + b"\n")
    shards, _ = run([b"".join(line(x) + b"\n" for x in "abcde")], shard_size=10, max_shard_bytes=2 * one)
    # Then a shard holds two requests, fewer than shard_size
    assert [(first, size) for first, size, _ in shards] == [(1, 2), (3, 2), (5, 1)]


def test_a_last_full_shard_is_not_followed_by_an_empty_one() -> None:
    shards, _ = run([b"".join(line(x) + b"\n" for x in "abcd")], shard_size=2)
    assert [(first, size) for first, size, _ in shards] == [(1, 2), (3, 2)]


def test_a_request_is_kept_as_the_bytes_read_without_bom_and_cr() -> None:
    # Spacing, key order, escapes and a raw U+2028 stay as written: the worker parses them once
    raw = (
        '{ "body": {"messages": [{"content": "caf\\u00e9 \u2028 x", "role": "user"}], "model": "m"},'
        ' "url": "/v1/chat/completions", "method": "POST", "custom_id": "a" }'
    ).encode()
    shards, validator = run(in_chunks(b"\xef\xbb\xbf" + raw + b"\r\n" + line("b") + b"\r\n"), shard_size=5)
    assert shards == [(1, 2, b"1\t" + raw + b"\n2\t" + line("b") + b"\n")]
    assert validator.ok


def test_once_a_line_fails_no_shard_follows() -> None:
    # Given two good lines, a bad one, then two more good ones
    data = line("a") + b"\n" + line("b") + b"\n{oops\n" + line("c") + b"\n" + line("d") + b"\n"
    shards, validator = run(in_chunks(data), shard_size=2)
    # Then the shard completed before the bad line was yielded (the caller discards it), none after
    assert shards == [(1, 2, b"1\t" + line("a") + b"\n2\t" + line("b") + b"\n")]
    assert [(e.code, e.line) for e in validator.errors] == [("invalid_json_line", 3)]
    assert validator.request_count == 5


def test_a_partial_shard_before_a_failure_is_not_yielded() -> None:
    data = line("a") + b"\n" + line("a") + b"\n" + line("b") + b"\n"  # line 2 repeats custom_id "a"
    shards, validator = run(in_chunks(data), shard_size=5)
    assert shards == []
    assert [(e.code, e.line) for e in validator.errors] == [("duplicate_custom_id", 2)]


@pytest.mark.parametrize(("shard_size", "firsts"), [(1, [1, 2]), (3, [])])
def test_a_file_found_too_large_at_the_end_fails_after_its_shards(shard_size: int, firsts: list[int]) -> None:
    # Given a file whose third line goes past the byte limit: reading stops there
    chunks = [line(x) + b"\n" for x in "abc"]
    limit = sum(map(len, chunks)) - 1
    shards, validator = run(chunks, shard_size, max_file_bytes=limit)
    # Then the shards full before then were yielded, and finish() reports the size (no partial shard)
    assert [first for first, _, _ in shards] == firsts
    assert [(e.code, e.line, e.message) for e in validator.errors] == [
        (
            "file_too_large",
            None,
            f"The file is larger than the limit of {limit} bytes ({sum(map(len, chunks))} bytes read).",
        )
    ]


def test_a_file_of_blank_lines_yields_nothing_and_fails_as_empty() -> None:
    shards, validator = run([b"\n \n\n"], shard_size=2)
    assert shards == []
    assert [(e.code, e.message) for e in validator.errors] == [
        ("empty_file", "The file has no requests: its 3 lines are all blank.")
    ]
