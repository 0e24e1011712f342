"""The local stack delivers shard messages as an SQS fair queue does: a small account's batch created
right after a big one is not held back behind the big one's backlog.

The scripted model answers a `GATE` prompt only when the test hands out a pass (`admit`), so what has
run when is read from the stack (request counts, the model's arrivals), never from timings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer_local import LocalStack
from support.api_stack import (
    SCRIPTED,
    api_client,
    chat_line,
    create,
    jsonl,
    new_account,
    stack_with_upstream,
    upload,
    wait_for,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)


def queued(stack: LocalStack) -> int:
    """Visible messages of the shards queue (not in flight)."""
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.queue_urls["ShardsQueue"], AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


def test_a_small_accounts_batch_overtakes_the_backlog_of_a_big_one(tmp_path: Path) -> None:
    overrides = {"ShardSize": "1", "MaxShardWorkers": "2"}
    with stack_with_upstream(tmp_path, parameter_overrides=overrides) as (stack, upstream):
        big_account, small_account = (
            api_client(stack, new_account("acct-a")),
            api_client(stack, new_account("acct-b")),
        )
        # Given account A's batch of 30 one-line shards, each request waiting at the model for a pass:
        # both shard workers hold one of A's shards, its 28 others wait in the queue
        big_input = jsonl(*(chat_line(f"a{i}", f"GATE a{i}", model=SCRIPTED) for i in range(30)))
        big = create(big_account, upload(big_account, big_input)).json()["id"]
        wait_until(lambda: len(upstream.arrivals) == 2, what="two of A's requests at the model")
        # and account B's batch of 2 shards created right after: its messages are queued behind A's
        small_input = jsonl(*(chat_line(f"b{i}", f"b{i}", model=SCRIPTED) for i in range(2)))
        small = create(small_account, upload(small_account, small_input)).json()["id"]
        wait_until(lambda: queued(stack) == 30, what="B's shard messages queued behind A's 28")
        # When A's two requests at the model answer (and no other of A's)
        upstream.admit(2)
        # Then B's shards are delivered before A's older ones: B completes while A has 2 of 30 done
        done = wait_for(small_account, small, timeout=60)
        assert (done["status"], done["request_counts"]) == (
            "completed",
            {"total": 2, "completed": 2, "failed": 0},
        )
        running = big_account.get(f"/batches/{big}").json()
        assert (running["status"], running["request_counts"]) == (
            "in_progress",
            {"total": 30, "completed": 2, "failed": 0},
        )
        # and at most one more of A's requests reached the model before B's (a tie of no messages in
        # flight goes to the oldest message: A's third)
        arrivals = list(upstream.arrivals)
        before_b = arrivals[: max(arrivals.index("b0"), arrivals.index("b1")) + 1]
        assert sorted(before_b) in (
            ["GATE a0", "GATE a1", "b0", "b1"],
            ["GATE a0", "GATE a1", "GATE a2", "b0", "b1"],
        ), arrivals
        # And A then completes in full
        upstream.admit(28)
        finished = wait_for(big_account, big, timeout=120)
        assert (finished["status"], finished["request_counts"]) == (
            "completed",
            {"total": 30, "completed": 30, "failed": 0},
        )
