"""The aggregator's decisions, its data layer faked: which seal it writes for each header, which byte
ranges of the result parts go to which file, and the error lines of requests that never ran."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchinfer.core import ids
from batchinfer.data.items import BatchChanges, BatchHeader, ResultPart, Shard
from batchinfer.pipeline import aggregate
from batchinfer.wire.status import BatchStatus
from support.data import batch_header

S = BatchStatus


class Writes:
    """The header writes `_seal` asked for, each answered with `answer` (None: its condition failed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answer: BatchHeader | None) -> None:
        self.calls: list[tuple[Any, ...]] = []

        def update(batch_id: str, changes: BatchChanges, *, status: BatchStatus | None = None) -> Any:
            self.calls.append(("update", batch_id, changes, status))
            return answer

        def transition(batch_id: str, target: BatchStatus, **kwargs: Any) -> Any:
            self.calls.append(("transition", batch_id, target, kwargs))
            return answer

        monkeypatch.setattr(aggregate.batches, "update", update)
        monkeypatch.setattr(aggregate.batches, "transition", transition)


@pytest.mark.parametrize(
    "header",
    [
        batch_header(status=S.FINALIZING, sealed=True, final_status=S.EXPIRED, shards_total=3, shards_done=1),
        batch_header(
            status=S.FINALIZING, sealed=True, final_status=S.COMPLETED, shards_total=3, shards_done=3
        ),
        batch_header(
            status=S.CANCELLING, sealed=True, final_status=S.CANCELLED, shards_total=3, shards_done=0
        ),
    ],
    ids=["expiring", "completing", "cancelling-sealed"],
)
def test_a_sealed_batch_is_finalized_as_it_is(monkeypatch: pytest.MonkeyPatch, header: BatchHeader) -> None:
    writes = Writes(monkeypatch, answer=None)
    assert aggregate._seal(header) is header
    assert writes.calls == []


@pytest.mark.parametrize(
    "header",
    [
        batch_header(status=S.VALIDATING),
        batch_header(status=S.IN_PROGRESS, shards_total=3, shards_done=2),
    ],
    ids=["validating", "shards-left"],
)
def test_a_batch_with_shards_to_run_and_no_cancel_is_not_sealed(
    monkeypatch: pytest.MonkeyPatch, header: BatchHeader
) -> None:
    writes = Writes(monkeypatch, answer=header)
    assert aggregate._seal(header) is None
    assert writes.calls == []


@pytest.mark.parametrize("answered", [True, False], ids=["sealed", "condition-failed"])
def test_a_cancel_is_sealed_while_cancelling(monkeypatch: pytest.MonkeyPatch, answered: bool) -> None:
    header = batch_header(status=S.CANCELLING, shards_total=2, shards_done=2)
    sealed = header.model_copy(update={"sealed": True, "final_status": S.CANCELLED})
    writes = Writes(monkeypatch, answer=sealed if answered else None)
    assert aggregate._seal(header) is (sealed if answered else None)
    assert writes.calls == [
        ("update", header.id, BatchChanges(sealed=True, final_status=S.CANCELLED), S.CANCELLING)
    ]


@pytest.mark.parametrize("answered", [True, False], ids=["sealed", "condition-failed"])
def test_the_last_shard_done_seals_the_batch_as_completing(
    monkeypatch: pytest.MonkeyPatch, answered: bool
) -> None:
    header = batch_header(status=S.IN_PROGRESS, shards_total=2, shards_done=2)
    sealed = header.model_copy(update={"status": S.FINALIZING, "sealed": True, "final_status": S.COMPLETED})
    writes = Writes(monkeypatch, answer=sealed if answered else None)
    assert aggregate._seal(header) is (sealed if answered else None)
    assert writes.calls == [
        (
            "transition",
            header.id,
            S.FINALIZING,
            {"all_shards_done": True, "changes": BatchChanges(sealed=True, final_status=S.COMPLETED)},
        )
    ]


def part(key: str, output_bytes: int, size: int) -> ResultPart:
    return ResultPart(key=key, start=0, end=1, output_bytes=output_bytes, bytes=size)


def shard(n: int, size: int, next_index: int, parts: tuple[ResultPart, ...] = ()) -> Shard:
    return Shard(
        shard=n, size=size, first_line=1, input_key=f"shards/{n}", next_index=next_index, parts=list(parts)
    )


@pytest.mark.parametrize(
    ("errors", "ranges"),
    [
        (False, [("p0a", 0, 10), ("p0b", 0, 0), ("p1", 0, 5)]),
        (True, [("p0a", 10, 25), ("p0b", 0, 7), ("p1", 5, 5)]),
    ],
    ids=["output", "error"],
)
def test_each_file_reads_its_side_of_every_part_in_shard_order(
    monkeypatch: pytest.MonkeyPatch, errors: bool, ranges: list[tuple[str, int, int]]
) -> None:
    # Given parts holding their successes in [0, output_bytes) and their failures after
    found = [shard(0, 4, 4, (part("p0a", 10, 25), part("p0b", 0, 7))), shard(1, 2, 2, (part("p1", 5, 5),))]
    asked: list[tuple[str, list[tuple[str, int, int]]]] = []
    monkeypatch.setattr(
        aggregate.s3, "iter_ranges", lambda bucket, todo: asked.append((bucket, list(todo))) or iter(())
    )
    list(aggregate._result_parts("service", found, errors=errors))
    assert asked == [("service", ranges)]


@pytest.mark.parametrize(
    ("final", "code", "message"),
    [
        (S.CANCELLED, "batch_cancelled", "The batch was cancelled before this request ran."),
        (S.EXPIRED, "batch_expired", "The batch expired before this request ran."),
    ],
)
def test_requests_after_each_shards_next_index_become_never_ran_lines(
    monkeypatch: pytest.MonkeyPatch, final: BatchStatus, code: str, message: str
) -> None:
    # Given a done shard, one that ran its first request of three, and one that never ran
    inputs = {
        "shards/0": b'1\t{"custom_id":"a","body":{}}\n2\t{"custom_id":"b","body":{}}\n',
        "shards/1": b'4\t{"custom_id":"c","body":{}}\n5\t{"custom_id":"d","body":{}}\n'
        b'7\t{"custom_id":"e","body":{}}\n',
        "shards/2": b'8\t{"custom_id":"f","body":{}}\n',
    }
    read: list[str] = []
    monkeypatch.setattr(aggregate.s3, "get_bytes", lambda bucket, key: read.append(key) or inputs[key])
    found = [shard(0, 2, 2), shard(1, 3, 1), shard(2, 1, 0)]
    lines = [
        json.loads(line)
        for chunk in aggregate._never_ran("batch_x", "service", found, final)
        for line in chunk.splitlines()
    ]
    # Then only the requests that never ran have lines, in input order, with their request ids
    assert lines == [
        {
            "id": ids.request_id("batch_x", n),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
        for n, custom_id in [(5, "d"), (7, "e"), (8, "f")]
    ]
    assert read == ["shards/1", "shards/2"]  # a done shard's input is not read
