"""Results while a batch runs: the committed successes, in input order as far as they are complete.

A batch's `output.jsonl` is, byte for byte, the success ranges of its shards' committed result parts,
shard after shard, each shard's parts in order (`aggregate._result_parts`). The lines readable early
are a prefix of it: every part of the shards whose requests are all committed, then the committed
parts of the first shard that is not, and nothing after it (a later shard's lines would come out of
input order). A part, once committed, is never changed, and a shard commit after the batch is sealed
is refused: a line shown here is in the final file, at the same position, with the same bytes.

Reading costs the pipeline nothing: the parts are the workers' own commits, read from S3 and the
shard items when asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from batchinfer.core.settings import get_settings
from batchinfer.data import s3, shards
from batchinfer.data.items import BatchHeader, Shard
from batchinfer.wire.status import is_terminal

# At most this much of the output in one answer (a Lambda response is capped at 6 MB).
MAX_PAGE_BYTES = 4 * 1024 * 1024
NEWLINE = b"\n"


@dataclass(frozen=True, slots=True)
class Page:
    """Output lines `after` + 1 ... `after` + `lines` (1-based) of a batch: `data` (whole lines), `more`
    (True: further lines are committed already, beyond `MAX_PAGE_BYTES`) and `complete` (True: the
    batch has ended and these are its last output lines)."""

    data: bytes
    after: int
    lines: int
    more: bool
    complete: bool


def readable_parts(found: list[Shard], after: int, ended: bool) -> tuple[list[tuple[str, int, int]], int]:
    """The success ranges `(key, start, end)` of the committed parts that form the readable prefix of
    the output (every committed part once the batch has `ended`: none is added after), skipping whole
    shards that lie within its first `after` lines (their lines are not read); and how many of the
    `after` lines remain to skip in the ranges returned."""
    ranges: list[tuple[str, int, int]] = []
    skip = after
    for shard in found:
        if not ranges and shard.completed <= skip:
            skip -= shard.completed
        else:
            ranges += [(part.key, 0, part.output_bytes) for part in shard.parts]
        if shard.next_index < shard.size and not ended:
            break  # the shards after it would come out of input order
    return ranges, skip


def _lines(chunks: Iterator[bytes], skip: int) -> Iterator[bytes]:
    """The lines of `chunks` (each part ends with a newline) after the first `skip`, each with its
    newline."""
    for chunk in chunks:
        for line in chunk.splitlines(keepends=True):
            if skip:
                skip -= 1
            else:
                yield line


def read_output(header: BatchHeader, after: int = 0) -> Page:
    """The output lines of `header`'s batch committed so far, from line `after` + 1, in input order as
    far as they are complete, up to `MAX_PAGE_BYTES` (at least one line)."""
    ended = is_terminal(header.status)  # the header read before the shards: no commit follows an end
    found = list(shards.query(header.id)) if header.in_progress_at else []
    ranges, skip = readable_parts(found, after, ended)
    data, count, more = bytearray(), 0, False
    for line in _lines(s3.iter_ranges(get_settings().bucket_name, ranges), skip):
        if data and len(data) + len(line) > MAX_PAGE_BYTES:
            more = True
            break
        data += line
        count += 1
    return Page(data=bytes(data), after=after, lines=count, more=more, complete=ended and not more)
