"""The local stack delivers shard messages as an SQS fair queue does: a small account's batch created
right after a big one is not held back behind the big one's backlog; and once delivered, one
account's shards hold at most its share of a model's shard workers (`AccountShardShare`):
its shard over the share waits without reaching the model while another account's shard runs.

The scripted model answers a `GATE` prompt only when the test hands out a pass (`admit`), so what has
run when is read from the stack (request counts, the model's arrivals), never from timings.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from batchinfer.data import shards
from batchinfer_local import LocalStack
from support.api_stack import (
    SCRIPTED,
    HoldableUpstream,
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


def gated(
    stack: LocalStack, upstream: HoldableUpstream, lines: int
) -> tuple[httpx.Client, httpx.Client, str]:
    """Clients of two new accounts A and B, and A's batch of `lines` one-line shards (`GATE a<i>`: each
    request waits at the model for a pass), once two of its requests are at the model."""
    a_account, b_account = api_client(stack, new_account("acct-a")), api_client(stack, new_account("acct-b"))
    a_input = jsonl(*(chat_line(f"a{i}", f"GATE a{i}", model=SCRIPTED) for i in range(lines)))
    a = create(a_account, upload(a_account, a_input)).json()["id"]
    wait_until(lambda: len(upstream.arrivals) == 2, what="two of A's requests at the model")
    return a_account, b_account, a


def test_a_small_accounts_batch_overtakes_the_backlog_of_a_big_one(tmp_path: Path) -> None:
    # Delivery order alone: no per-account share (with 0.8 of 2 workers A would hold only one)
    overrides = {"ShardSize": "1", "RemoteShardSize": "1", "MaxShardWorkers": "2", "AccountShardShare": "1"}
    with stack_with_upstream(tmp_path, parameter_overrides=overrides) as (stack, upstream):
        # Given account A's batch of 30 one-line shards, each request waiting at the model for a pass:
        # both shard workers hold one of A's shards, its 28 others wait in the queue
        big_account, small_account, big = gated(stack, upstream, 30)
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


def test_an_accounts_third_shard_waits_while_another_accounts_shard_runs(tmp_path: Path) -> None:
    # Three shard workers, two of them at most for one account's shards (0.67 x 3)
    overrides = {
        "ShardSize": "1",
        "RemoteShardSize": "1",
        "MaxShardWorkers": "3",
        "AccountShardShare": "0.67",
    }
    with stack_with_upstream(tmp_path, parameter_overrides=overrides) as (stack, upstream):
        # Given account A's batch of three one-line shards, each request waiting at the model for a
        # pass: two of them at the model
        a_account, b_account, a = gated(stack, upstream, 3)
        # When account B's batch of one shard is created
        b_input = jsonl(chat_line("b0", "b0", model=SCRIPTED))
        b = create(b_account, upload(b_account, b_input)).json()["id"]
        # Then it completes while A's two requests are still held and A's third never reached the model
        done = wait_for(b_account, b, timeout=60)
        assert (done["status"], done["request_counts"]) == (
            "completed",
            {"total": 1, "completed": 1, "failed": 0},
        )
        # (the one of A's shards that waits is whichever the third worker got)
        [waiting] = [shard for shard in shards.query(a) if shard.lease_owner is None]
        held = sorted(f"GATE a{n}" for n in {0, 1, 2} - {waiting.shard})
        assert sorted(upstream.arrivals) == [*held, "b0"]
        assert (waiting.attempts, waiting.redrives, waiting.queued_at is not None) == (0, None, True)
        # And once A's two requests answer, its waiting shard runs (its message came back) and A completes
        upstream.admit(2)
        wait_until(lambda: len(upstream.arrivals) == 4, what="A's third request at the model")
        upstream.admit(1)
        finished = wait_for(a_account, a, timeout=60)
        assert (finished["status"], finished["request_counts"]) == (
            "completed",
            {"total": 3, "completed": 3, "failed": 0},
        )
        assert sorted(upstream.arrivals) == ["GATE a0", "GATE a1", "GATE a2", "b0"]
        after = shards.get(a, waiting.shard)
        assert (after.state, after.attempts, after.redrives) == ("done", 1, None)
