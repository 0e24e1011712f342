"""Streaming split of a JSON Lines byte stream into numbered physical lines.

A batch input file can be up to 200 MiB, so it is never held whole: bytes arrive as arbitrary chunks
(for example `StreamingBody.iter_chunks()` of an S3 object) and each line is handed on as soon as its
`\\n` is seen. Rules, from JSON Lines (https://jsonlines.org/: UTF-8, lines separated by `\\n`, a
`\\r\\n` ending is tolerated) and the OpenAI Batch API input format:

- Split on the byte `\\n` only. `str.splitlines` would also split on U+2028, U+0085, `\\x0b`, ...,
  which may legally appear raw inside a JSON string and must not cut a request in two.
- One trailing `\\r` of a line is dropped (CRLF files work); a final line without `\\n` still counts,
  while the empty string after a final `\\n` is not a line (nor is a file holding only a BOM).
- One UTF-8 byte order mark (EF BB BF) at the very start of the file is dropped (files saved by
  Windows editors); any other BOM is left in place for the validator to reject.
- Blank lines are yielded too, so line numbers are the 1-based physical line numbers an editor shows.
- A line longer than `max_line_bytes` is flagged and its content dropped: at most
  `max_line_bytes + 4` bytes of one line are buffered (room for the BOM and the `\\r`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

UTF8_BOM = b"\xef\xbb\xbf"
_CR = 0x0D
# Bytes a line may hold beyond the limit before it is certainly too long: a BOM (line 1) and a `\r`.
_SLACK = len(UTF8_BOM) + 1


class PhysicalLine(NamedTuple):
    """One physical line of the input file (a named tuple: one is made per line, twice as fast as a
    frozen dataclass).

    `number` is 1-based and counts blank lines. `data` is the line's bytes without its `\\n`, its
    trailing `\\r` and (line 1 only) a leading UTF-8 BOM; it is `b""` when `too_long`. `size` is the
    byte length of that content, also when it was too long to keep.
    """

    number: int
    data: bytes
    size: int
    too_long: bool = False


def _whole_line(number: int, raw: bytes, limit: int) -> PhysicalLine:
    if number == 1 and raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM) :]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) > limit:
        return PhysicalLine(number, b"", len(raw), True)
    return PhysicalLine(number, raw, len(raw))


class _LineBuffer:
    """The bytes of a line that spans chunks, or only its length once it is over the limit."""

    __slots__ = ("buf", "head", "last", "limit", "spilled")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.spilled: int | None = None  # bytes seen of an overlong line (its content is dropped)
        self.head = b""  # first 3 bytes of an overlong line, to discount a BOM from its size
        self.last = 0  # last byte of an overlong line, to discount a `\r` from its size

    @property
    def empty(self) -> bool:
        return not self.buf and self.spilled is None

    def add(self, piece: bytes) -> None:
        if not piece:
            return
        if self.spilled is None:
            if len(self.buf) + len(piece) <= self.limit + _SLACK:
                self.buf += piece
                return
            self.head = (bytes(self.buf[:3]) + piece[:3])[:3]
            self.spilled = len(self.buf)
            self.buf = bytearray()
        self.spilled += len(piece)
        self.last = piece[-1]

    def take(self, number: int) -> PhysicalLine:
        if self.spilled is None:
            line = _whole_line(number, bytes(self.buf), self.limit)
        else:
            size = self.spilled
            size -= len(UTF8_BOM) if number == 1 and self.head == UTF8_BOM else 0
            size -= 1 if self.last == _CR else 0
            line = PhysicalLine(number, b"", size, True)
        self.buf, self.spilled, self.head, self.last = bytearray(), None, b"", 0
        return line


class PhysicalLineReader(Iterator[PhysicalLine]):
    """Iterator of the `PhysicalLine`s of a chunked byte stream (build it with `iter_physical_lines`).

    `bytes_read` is the number of bytes pulled from the chunks so far (the file size once exhausted).
    With `max_total_bytes`, reading stops as soon as more than that many bytes were pulled, without
    yielding the rest of that chunk, and `exceeded` becomes True: the caller reports `file_too_large`.
    """

    def __init__(self, chunks: Iterable[bytes], max_line_bytes: int, max_total_bytes: int | None = None):
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be at least 1, got {max_line_bytes}")
        self.max_line_bytes = max_line_bytes
        self.max_total_bytes = max_total_bytes
        self.bytes_read = 0
        self.exceeded = False
        self._lines = self._split(chunks)

    def __iter__(self) -> PhysicalLineReader:
        return self

    def __next__(self) -> PhysicalLine:
        return next(self._lines)

    def _split(self, chunks: Iterable[bytes]) -> Iterator[PhysicalLine]:
        limit = self.max_line_bytes
        pending = _LineBuffer(limit)
        number = 1
        for chunk in chunks:
            if not chunk:
                continue
            chunk = bytes(chunk)  # no copy for bytes; accepts bytearray and memoryview
            self.bytes_read += len(chunk)
            if self.max_total_bytes is not None and self.bytes_read > self.max_total_bytes:
                self.exceeded = True
                return
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if pending.empty:
                    yield _whole_line(number, chunk[start:end], limit)  # the common case: no copy
                else:
                    pending.add(chunk[start:end])
                    yield pending.take(number)
                number += 1
                start = end + 1
            pending.add(chunk[start:])
        # Like the empty rest after a final newline, a file holding only a BOM has no line.
        if not pending.empty and not (number == 1 and pending.buf == UTF8_BOM):
            yield pending.take(number)


def iter_physical_lines(
    chunks: Iterable[bytes], max_line_bytes: int, *, max_total_bytes: int | None = None
) -> PhysicalLineReader:
    """Split byte `chunks` (any sizes, any boundaries) into numbered `PhysicalLine`s, streaming.

    Memory stays within one chunk plus `max_line_bytes + 4` bytes whatever the file size. The result
    is an iterator with `bytes_read` (bytes pulled so far) and, when `max_total_bytes` is given,
    `exceeded` (reading stopped early because the file is larger). Raises `ValueError` when
    `max_line_bytes < 1`. See the module docstring for the splitting rules and their sources.
    """
    return PhysicalLineReader(chunks, max_line_bytes, max_total_bytes)
