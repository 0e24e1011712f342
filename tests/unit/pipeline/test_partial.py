"""Which committed parts are readable while a batch runs (pipeline/partial.py): the prefix of the
output in input order, whole shards skipped by `after` without reading them."""

from __future__ import annotations

from batchinfer.data.items import ResultPart, Shard
from batchinfer.pipeline.partial import readable_parts


def shard(number: int, size: int, parts: list[tuple[int, int, int]], completed: int) -> Shard:
    """A shard with parts `(start, end, output_bytes)` committed, `completed` successes in them."""
    return Shard(
        shard=number,
        size=size,
        first_line=1 + number * size,
        input_key=f"s{number}",
        next_index=parts[-1][1] if parts else 0,
        parts=[
            ResultPart(key=f"p{number}.{s}", start=s, end=e, output_bytes=o, bytes=o) for s, e, o in parts
        ],
        completed=completed,
    )


DONE_0 = shard(0, 2, [(0, 2, 20)], completed=2)
HALF_1 = shard(1, 4, [(0, 2, 10)], completed=1)
DONE_2 = shard(2, 2, [(0, 2, 20)], completed=2)


def test_the_readable_parts_stop_after_the_first_shard_not_done() -> None:
    assert readable_parts([DONE_0, HALF_1, DONE_2], 0, ended=False) == (
        [("p0.0", 0, 20), ("p1.0", 0, 10)],
        0,
    )


def test_an_ended_batch_reads_every_committed_part() -> None:
    assert readable_parts([DONE_0, HALF_1, DONE_2], 0, ended=True)[0] == [
        ("p0.0", 0, 20),
        ("p1.0", 0, 10),
        ("p2.0", 0, 20),
    ]


def test_after_skips_whole_shards_unread_and_counts_the_rest() -> None:
    assert readable_parts([DONE_0, HALF_1, DONE_2], 2, ended=False) == ([("p1.0", 0, 10)], 0)
    assert readable_parts([DONE_0, HALF_1, DONE_2], 1, ended=False) == (
        [("p0.0", 0, 20), ("p1.0", 0, 10)],
        1,
    )
