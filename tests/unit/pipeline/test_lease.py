"""`lease.LeaseHeartbeat`: what a renewal's answer does to the lease, and when the beats stop."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError

from batchinfer.pipeline.lease import LeaseHeartbeat


def test_a_throttled_renewal_is_tried_again_and_only_another_owner_is_a_loss() -> None:
    # Renewals answer: throttled, renewed, a 500, renewed, another owner holds the lease
    throttled = ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "UpdateItem")
    failure = ClientError({"Error": {"Code": "InternalServerError"}}, "UpdateItem")
    answers: list[bool | Exception] = [throttled, True, failure, True, False]
    seen_lost: list[bool] = []

    def renew() -> bool:
        seen_lost.append(heartbeat.lost)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    heartbeat = LeaseHeartbeat(renew, 0.03, batch_id="b", shard=3)  # type: ignore[arg-type]
    with heartbeat:
        deadline = time.monotonic() + 5
        while not heartbeat.lost and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # no beat after the loss
    assert (answers, seen_lost) == ([], [False] * 5)
    assert heartbeat.lost and not heartbeat.held()


def test_the_heartbeat_stops_when_its_block_ends_whatever_ends_it() -> None:
    calls: list[str] = []
    with pytest.raises(RuntimeError), LeaseHeartbeat(lambda: calls.append("beat") or True, 0.06):  # type: ignore[arg-type]
        time.sleep(0.1)
        raise RuntimeError("crash")
    beats = len(calls)
    time.sleep(0.1)
    assert beats >= 2 and len(calls) == beats  # beat while it ran, never after
