"""The live link to the batch while a window runs."""

import pytest

from batchinfer.data.items import LiveProgress
from batchinfer.pipeline.shard import progress
from batchinfer.pipeline.shard.progress import ProgressLink


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
