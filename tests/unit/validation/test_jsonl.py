"""Unit tests of `batchinfer.validation.jsonl`: streaming split into numbered physical lines."""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchinfer.validation.jsonl import UTF8_BOM, PhysicalLine, iter_physical_lines


def _lines(data: bytes, limit: int = 1000, chunk: int | None = None) -> list[PhysicalLine]:
    chunks = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    return list(iter_physical_lines(chunks, limit))


def _pairs(data: bytes, limit: int = 1000, chunk: int | None = None) -> list[tuple[int, bytes]]:
    return [(line.number, line.data) for line in _lines(data, limit, chunk)]


def _reference(data: bytes, limit: int) -> list[PhysicalLine]:
    """The splitting rules written the obvious, non-streaming way."""
    if data.startswith(UTF8_BOM):
        data = data[3:]
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()  # the empty string after a final newline is not a line
    out = []
    for number, part in enumerate(parts, start=1):
        part = part[:-1] if part.endswith(b"\r") else part
        too_long = len(part) > limit
        out.append(PhysicalLine(number, b"" if too_long else part, len(part), too_long))
    return out


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", []),
        (UTF8_BOM, []),
        (UTF8_BOM + b"\n", [(1, b"")]),
        (b"\n", [(1, b"")]),
        (b"a", [(1, b"a")]),
        (b"a\n", [(1, b"a")]),
        (b"a\nb", [(1, b"a"), (2, b"b")]),
        (b"a\n\nb\n", [(1, b"a"), (2, b""), (3, b"b")]),
        (b"a\n\n\n", [(1, b"a"), (2, b""), (3, b"")]),
        (b"\n\n\n", [(1, b""), (2, b""), (3, b"")]),
        (b"a\r\nb\r\n", [(1, b"a"), (2, b"b")]),
        (b"a\r\r\n", [(1, b"a\r")]),  # only the one `\r` of the line ending goes
        (b"a\rb\n", [(1, b"a\rb")]),  # a lone `\r` is not a line break
        (b"  \t \nx", [(1, b"  \t "), (2, b"x")]),
    ],
)
def test_splits_on_newline_counting_blank_lines(data: bytes, expected: list[tuple[int, bytes]]) -> None:
    assert _pairs(data) == expected


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\r"])
def test_unicode_line_separators_do_not_split(separator: str) -> None:
    data = f'{{"c": "first{separator}second"}}\n{{"c": 2}}\n'.encode()
    assert _pairs(data) == [(1, f'{{"c": "first{separator}second"}}'.encode()), (2, b'{"c": 2}')]


def test_leading_utf8_bom_is_stripped_from_line_1_only() -> None:
    assert _pairs(UTF8_BOM + b"a\n" + UTF8_BOM + b"b\n") == [(1, b"a"), (2, UTF8_BOM + b"b")]


def test_only_one_leading_bom_is_stripped() -> None:
    assert _pairs(UTF8_BOM + UTF8_BOM + b"a") == [(1, UTF8_BOM + b"a")]


def test_bom_split_across_chunks_is_stripped() -> None:
    chunks = [b"\xef", b"\xbb", b"\xbf{", b"}\r", b"\n"]
    assert list(iter_physical_lines(chunks, 100)) == [PhysicalLine(1, b"{}", 2)]


def test_utf16_bom_is_not_stripped() -> None:
    assert _pairs(b"\xff\xfea\x00") == [(1, b"\xff\xfea\x00")]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 64])
def test_any_chunking_gives_the_same_lines(chunk: int) -> None:
    data = UTF8_BOM + b'{"a": 1}\r\n\n  \n{"b": "x\xe2\x80\xa8y"}\r\n{"c": 3}'
    assert _pairs(data, chunk=chunk) == [
        (1, b'{"a": 1}'),
        (2, b""),
        (3, b"  "),
        (4, b'{"b": "x\xe2\x80\xa8y"}'),
        (5, b'{"c": 3}'),
    ]


def test_line_at_the_limit_is_kept_and_one_byte_more_is_flagged() -> None:
    data = b"x" * 10 + b"\r\n" + b"y" * 11 + b"\n" + b"z"
    assert _lines(data, limit=10) == [
        PhysicalLine(1, b"x" * 10, 10),
        PhysicalLine(2, b"", 11, too_long=True),
        PhysicalLine(3, b"z", 1),
    ]


@pytest.mark.parametrize("chunk", [1, 3, 4, 100])
def test_overlong_line_spanning_chunks_reports_its_exact_size(chunk: int) -> None:
    # Line 1 has a BOM and a CRLF ending, neither counts; line 2 spans chunks too.
    data = UTF8_BOM + b"a" * 25 + b"\r\n" + b"b" * 30 + b"\r\n" + b"ok"
    assert _lines(data, limit=10, chunk=chunk) == [
        PhysicalLine(1, b"", 25, too_long=True),
        PhysicalLine(2, b"", 30, too_long=True),
        PhysicalLine(3, b"ok", 2),
    ]


def test_overlong_last_line_without_newline_is_reported() -> None:
    assert _lines(b"a\n" + b"b" * 50, limit=10, chunk=7) == [
        PhysicalLine(1, b"a", 1),
        PhysicalLine(2, b"", 50, too_long=True),
    ]


def test_overlong_line_is_not_held_in_memory() -> None:
    limit = 1024
    piece = b"x" * 65536

    def chunks() -> Iterator[bytes]:
        for _ in range(128):  # one 8 MiB line
            yield piece
        yield b"\n{}\n"

    tracemalloc.start()
    try:
        lines = list(iter_physical_lines(chunks(), limit))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [PhysicalLine(1, b"", 8 * 1024 * 1024, too_long=True), PhysicalLine(2, b"{}", 2)]
    assert peak < 256 * 1024  # far below the 8 MiB line: only the pending bytes up to the limit


def test_bytes_read_counts_every_byte_pulled() -> None:
    reader = iter_physical_lines([b"ab\n", b"", b"cd\r\n", b"\n"], 100)
    assert reader.bytes_read == 0
    assert next(reader) == PhysicalLine(1, b"ab", 2)
    assert reader.bytes_read == 3
    assert list(reader) == [PhysicalLine(2, b"cd", 2), PhysicalLine(3, b"", 0)]
    assert reader.bytes_read == 8
    assert reader.exceeded is False


def test_max_total_bytes_stops_reading_early() -> None:
    pulled = []

    def chunks() -> Iterator[bytes]:
        for i in range(100):
            pulled.append(i)
            yield b"0123456\n"  # 8 bytes, one line each

    reader = iter_physical_lines(chunks(), 100, max_total_bytes=20)
    assert [line.number for line in reader] == [1, 2]  # the third chunk crosses the limit: not split
    assert reader.exceeded is True
    assert reader.bytes_read == 24
    assert pulled == [0, 1, 2]


def test_max_total_bytes_equal_to_the_size_is_not_exceeded() -> None:
    reader = iter_physical_lines([b"a\n", b"b\n"], 100, max_total_bytes=4)
    assert [line.data for line in reader] == [b"a", b"b"]
    assert reader.exceeded is False


def test_bytearray_and_memoryview_chunks_are_accepted() -> None:
    chunks = [bytearray(b"a\nb"), memoryview(b"c\n")]
    assert [(line.number, line.data) for line in iter_physical_lines(chunks, 100)] == [(1, b"a"), (2, b"bc")]


def test_max_line_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_line_bytes must be at least 1, got 0"):
        iter_physical_lines([b"a"], 0)


@given(
    data=st.lists(
        st.sampled_from([b"a", b"\n", b"\r", b"\r\n", UTF8_BOM, b"\xe2\x80\xa8", b" "]), max_size=40
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
    limit=st.integers(min_value=1, max_value=6),
)
def test_matches_the_non_streaming_reference(data: bytes, cuts: list[int], limit: int) -> None:
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    reader = iter_physical_lines(chunks, limit)
    assert list(reader) == _reference(data, limit)
    assert reader.bytes_read == len(data)
