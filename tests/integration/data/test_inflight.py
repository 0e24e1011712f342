"""The `/v2` in-flight slots (data/inflight.py) in moto's copy of the template's table: the bound holds
under concurrent takers, a crashed holder's slot frees up when its lease ends, a release deletes only
its own slot."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from batchinfer.core import aws
from batchinfer.data import inflight, keys
from support.moto_env import Aws

ACCT = keys.infer_slots("acct")


def test_never_more_than_the_limit_hold_slots_at_once(moto_aws: Aws) -> None:
    # Given 12 concurrent takers of an account bounded to 3
    barrier = threading.Barrier(12)

    def take(n: int) -> int | None:
        barrier.wait()
        try:
            return inflight.acquire(ACCT, limit=3, owner=f"r{n}", lease_s=30)
        except inflight.NoSlot:
            return None

    with ThreadPoolExecutor(12) as pool:
        taken = list(pool.map(take, range(12)))

    # Then exactly 3 won, one per slot number, and the others were told the limit
    assert sorted(s for s in taken if s is not None) == [0, 1, 2]
    with pytest.raises(inflight.NoSlot) as refused:
        inflight.acquire(ACCT, limit=3, owner="late", lease_s=30)
    assert refused.value.limit == 3
    # Another account has slots of its own
    assert inflight.acquire(keys.infer_slots("other"), limit=1, owner="o", lease_s=30) == 0


def test_a_slot_whose_lease_ended_is_taken_and_its_old_owner_cannot_release_it(
    moto_aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a slot taken by a request that then crashed (never released)
    assert inflight.acquire(ACCT, limit=1, owner="crashed", lease_s=10) == 0
    with pytest.raises(inflight.NoSlot):
        inflight.acquire(ACCT, limit=1, owner="waiting", lease_s=10)
    stored = aws.table().get_item(Key=keys.infer_slot("acct", 0))["Item"]
    t0 = int(stored["lease_until"]) - 10
    assert stored == {
        "PK": "ACCOUNT#acct",
        "SK": "INFER#0000",
        "owner": "crashed",
        "lease_until": t0 + 10,
        "ttl": t0 + 10 + inflight.SLOT_TTL_S,
    }

    # When its lease has ended
    monkeypatch.setattr(inflight, "now", lambda: t0 + 11)

    # Then the next request takes it, and the crashed one's late release deletes nothing
    assert inflight.acquire(ACCT, limit=1, owner="next", lease_s=10) == 0
    assert inflight.release(ACCT, 0, owner="crashed") is False
    assert aws.table().get_item(Key=keys.infer_slot("acct", 0))["Item"]["owner"] == "next"
    assert inflight.release(ACCT, 0, owner="next") is True
    assert "Item" not in aws.table().get_item(Key=keys.infer_slot("acct", 0))


def test_holding_gives_the_slot_back_whatever_the_block_raised(moto_aws: Aws) -> None:
    with pytest.raises(RuntimeError), inflight.holding(ACCT, limit=1, owner="r1", lease_s=30):
        raise RuntimeError("the model failed")
    with inflight.holding(ACCT, limit=1, owner="r2", lease_s=30) as slot:
        assert slot == 0
    assert "Item" not in aws.table().get_item(Key=keys.infer_slot("acct", 0))


def test_shard_slots_are_one_set_per_account(moto_aws: Aws) -> None:
    # Given account a's one shard slot taken
    assert inflight.acquire(keys.shard_slots("a"), limit=1, owner="w1", lease_s=30) == 0
    # Then a has none left (whatever the model), while b's and a's /v2 slots are apart
    with pytest.raises(inflight.NoSlot):
        inflight.acquire(keys.shard_slots("a"), limit=1, owner="w2", lease_s=30)
    assert inflight.acquire(keys.shard_slots("b"), limit=1, owner="w3", lease_s=30) == 0
    assert inflight.acquire(keys.infer_slots("a"), limit=1, owner="r1", lease_s=30) == 0
    assert keys.shard_slots("a").key(0) == {"PK": "ACCOUNT#a", "SK": "WORKERS#0000"}


def test_taking_a_slot_reads_the_slots_once_whatever_the_limit(moto_aws: Aws) -> None:
    # Given a bound of 16 of which 2 are held
    for owner in ("a", "b"):
        inflight.acquire(ACCT, limit=16, owner=owner, lease_s=30)
    calls: list[str] = []
    events = aws.table().meta.client.meta.events
    events.register("before-call.dynamodb.*", lambda model, **_: calls.append(model.name), unique_id="n")
    try:
        # When a third holder takes one
        slot = inflight.acquire(ACCT, limit=16, owner="c", lease_s=30)
    finally:
        events.unregister("before-call.dynamodb.*", unique_id="n")
    # Then one Query found the free ones and one PutItem took one of them
    assert calls == ["Query", "PutItem"]
    assert 0 <= slot < 16
