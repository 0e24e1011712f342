"""The `custom_id`s already seen in one batch input file: exact answers, memory set by the request limit."""

from __future__ import annotations

import hashlib
import tempfile
from typing import IO

from rbloom import Bloom

__all__ = ["SeenIds"]


def _seen_key(custom_id: str) -> bytes:
    # A 16-byte digest instead of the id bounds the memory of duplicate detection whatever the id
    # lengths; "surrogatepass" keeps the encoding one-to-one for ids with lone surrogates.
    return hashlib.blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class SeenIds:
    """The `custom_id`s of one file and the line of each, in memory set by `capacity` alone.

    A Bloom filter sized for `capacity` ids (4 MiB per million at a 1e-7 false-positive rate) says
    "certainly new" for almost every id. Every id is also appended as a fixed-size record (16-byte
    digest, 4-byte line) to an anonymous temporary file, and only when the filter says "maybe seen"
    is that file searched, so answers stay exact. Files of a few thousand lines never touch the
    disk; a file of a million lines writes 20 MB to it (Lambda's /tmp holds 512 MB).
    """

    _RECORD = 20
    _FLUSH_BYTES = 64 * 1024 - (64 * 1024) % _RECORD
    _READ_BYTES = 1024 * 1024 - (1024 * 1024) % _RECORD
    FALSE_POSITIVE_RATE = 1e-7

    def __init__(self, capacity: int) -> None:
        self._bloom = Bloom(max(1, capacity), self.FALSE_POSITIVE_RATE)
        self._pending = bytearray()
        self._file: IO[bytes] | None = None
        self._found: dict[bytes, int] = {}  # ids seen twice: their first line (failed files only)

    def first_line(self, custom_id: str, *, exact: bool = True) -> int | None:
        """The line where `custom_id` was added, or None if it never was.

        With `exact=False`, an id the filter only may have seen is reported as seen on line 0 without
        searching (for counting the errors of a file that has already failed many times).
        """
        if custom_id not in self._bloom:
            return None
        key = _seen_key(custom_id)
        if (line := self._found.get(key)) is not None:
            return line
        if not exact:
            return 0
        line = self._search(key)
        if line is not None:
            self._found[key] = line
        return line

    def maybe_seen(self, custom_id: str) -> bool:
        """False when `custom_id` was certainly never added (no search; True says nothing)."""
        return custom_id in self._bloom

    def add(self, custom_id: str, line: int) -> None:
        """Remember that `custom_id` appears on `line` (add each id once, in line order)."""
        self._bloom.add(custom_id)
        self._pending += _seen_key(custom_id) + line.to_bytes(4, "little")
        if len(self._pending) >= self._FLUSH_BYTES:
            self._flush()

    def close(self) -> None:
        """Delete the temporary file (the set answers nothing reliable afterwards)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _flush(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="batchinfer-ids-")
        self._file.write(self._pending)
        self._pending.clear()

    def _search(self, key: bytes) -> int | None:
        # Records are in line order: the first aligned match is the first use.
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            while block := self._file.read(self._READ_BYTES):
                if (line := self._find(block, key)) is not None:
                    self._file.seek(0, 2)
                    return line
            self._file.seek(0, 2)
        return self._find(self._pending, key)

    @classmethod
    def _find(cls, block: bytes | bytearray, key: bytes) -> int | None:
        at = block.find(key)
        while at >= 0 and at % cls._RECORD:
            at = block.find(key, at + 1)  # the digest's bytes straddling two records, never a match
        if at < 0:
            return None
        return int.from_bytes(block[at + 16 : at + cls._RECORD], "little")
