"""One account's share of a model's shard workers is bounded (issue 12, `AccountShardShare`), with the
local stack's shard workers in execution-environment processes of their own, concurrency from the
template: once account A's shards hold A's two slots, its third waits without reaching the model and
the free worker runs account B's shard; A's waiting shard then completes with one attempt.

The scripted model answers a `GATE` prompt only when the test hands out a pass (`admit`), so what has
run when is read from the stack (the model's arrivals, request counts), never from timings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from batchinfer.data import shards
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


def test_an_accounts_third_shard_waits_while_another_accounts_shard_runs(tmp_path: Path) -> None:
    # Three shard workers, two of them at most for one account's shards on one model (0.67 x 3)
    overrides = {"ShardSize": "1", "MaxShardWorkers": "3", "AccountShardShare": "0.67"}
    with stack_with_upstream(tmp_path, parameter_overrides=overrides) as (stack, upstream):
        a_account, b_account = (
            api_client(stack, new_account("acct-a")),
            api_client(stack, new_account("acct-b")),
        )
        # Given account A's batch of three one-line shards, each request waiting at the model for a pass
        a_input = jsonl(*(chat_line(f"a{i}", f"GATE a{i}", model=SCRIPTED) for i in range(3)))
        a = create(a_account, upload(a_account, a_input)).json()["id"]
        wait_until(lambda: len(upstream.arrivals) == 2, what="two of A's requests at the model")
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
