"""The live link to the batch while a window runs."""

from types import SimpleNamespace

import pytest

from batchinfer.data.items import LiveProgress
from batchinfer.pipeline.shard import progress
from batchinfer.pipeline.shard.progress import ProgressLink
from batchinfer.wire.status import BatchStatus


def test_the_link_never_publishes_less_than_a_crashed_predecessor(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a predecessor that had published 3 answers of the window starting at 4
    sent: list[LiveProgress] = []
    monkeypatch.setattr(progress.batches, "publish_progress", lambda b, s, p: sent.append(p))
    before = LiveProgress(start=4, completed=3, input_tokens=30, output_tokens=6)
    link = ProgressLink("batch_x", 0, 4, before)

    # When the redo publishes 1 answer, commits 2, then publishes 1 of the next window
    link.publish({"completed": 1, "failed": 0, "input_tokens": 10, "output_tokens": 2})
    committed = {"completed": 2, "failed": 0, "input_tokens": 20, "output_tokens": 4}
    rest = link.rest_after(committed, 6)
    link.committed(committed, 6)
    link.publish({"completed": 0, "failed": 1, "input_tokens": 0, "output_tokens": 0})

    # Then what is shown never drops below the predecessor's 3
    assert [(p.start, p.completed, p.failed, p.input_tokens) for p in sent] == [(4, 3, 0, 30), (6, 1, 1, 10)]
    assert (rest.start, rest.completed, rest.input_tokens, rest.output_tokens) == (6, 1, 10, 2)
    assert ProgressLink("batch_x", 0, 5, before).floor["completed"] == 0  # another window: no floor


def test_the_link_publishes_its_window_and_reads_the_running_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a header where shard 1 published a window of 20 just now and shard 2 one long ago
    monkeypatch.setattr(progress, "now", lambda: 100)
    header = SimpleNamespace(
        live={"1": LiveProgress(start=0, at=99, window=20), "2": LiveProgress(start=0, at=90, window=50)},
        status=BatchStatus.IN_PROGRESS,
        expires_at=1000,
        final_status=None,
    )
    sent: list[LiveProgress] = []

    def publish(batch_id: str, shard_no: int, live: LiveProgress) -> SimpleNamespace:
        sent.append(live)
        header.live["0"] = live
        return header

    monkeypatch.setattr(progress.batches, "publish_progress", publish)
    link = ProgressLink("batch_1", 0, 0, None)

    # When shard 0 publishes its window of 12
    assert link.publish({"completed": 1}, 12) is None

    # Then its window is on the header, and the windows of the workers running are its own and shard 1's
    assert (sent[0].window, sorted(link.windows)) == (12, [12, 20])


def test_a_new_link_knows_the_windows_of_the_workers_running_when_it_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a header read at the claim: shard 1 running at 20, shard 2 gone, shard 0's own old entry
    monkeypatch.setattr(progress, "now", lambda: 100)
    live = {
        "0": LiveProgress(start=0, at=99, window=30),
        "1": LiveProgress(start=0, at=98, window=20),
        "2": LiveProgress(start=0, at=90, window=50),
    }

    # When shard 0's link is made, and shard 3's with nothing running
    link, alone = ProgressLink("batch_1", 0, 0, live["0"], live), ProgressLink("batch_1", 3, 0, None, {})

    # Then its windows are shard 1's and its own, not known yet (its share: half of 20)
    assert (link.windows, alone.windows) == ([20, None], [])
