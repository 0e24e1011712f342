"""What the sweeper decides for each open batch and its shards, its data layer and queues faked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from batchinfer.core.settings import Settings
from batchinfer.data.items import BatchChanges, BatchHeader, Shard
from batchinfer.pipeline import sweep
from batchinfer.wire.status import BatchStatus
from support.data import batch_header

S = BatchStatus
AT = 1_900_000_000
STUCK = 900  # stuck_after_seconds
WAIT = 4 * 86400  # shard_wait_seconds
LONG_AGO = AT - 10 * STUCK
NO_ACTIONS = {"expired": 0, "prepare": 0, "shards": 0, "failed_shards": 0, "finalize": 0, "past_window": 0}


class Fake:
    """The open batches and their shards the sweeper finds, and everything it does to them."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        headers: list[BatchHeader],
        shards: dict[str, list[Shard]] | None = None,
        *,
        transition_ok: bool = True,
    ) -> None:
        self.shards = shards or {}
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.transitions: list[tuple[Any, ...]] = []
        self.failed: list[tuple[str, int, str]] = []
        self.redrives: dict[tuple[str, int], int] = {
            (batch_id, s.shard): s.redrives or 0 for batch_id, found in self.shards.items() for s in found
        }
        settings = Settings(
            table_name="t",
            bucket_name="b",
            prepare_queue_url="prepare",
            shards_queue_url="shards",
            finalize_queue_url="finalize",
            stuck_after_seconds=STUCK,
            max_shard_attempts=4,
            shard_wait_seconds=WAIT,
            prepare_wait_seconds=WAIT,
        )

        def transition(
            batch_id: str, target: BatchStatus, *, changes: BatchChanges | None = None, at: int
        ) -> Any:
            self.transitions.append((batch_id, target, changes, at))
            return next(h for h in headers if h.id == batch_id) if transition_ok else None

        def query(batch_id: str) -> Iterator[Shard]:
            return iter(self.shards.get(batch_id, []))

        def bump_redrives(batch_id: str, shard_no: int, *, at: int) -> int:
            assert at == AT  # the re-sent message is queued at the sweeper's time
            self.redrives[batch_id, shard_no] += 1
            return self.redrives[batch_id, shard_no]

        def send(queue_url: str, messages: list[Any], *, group_id: str) -> None:
            assert group_id == "acct"  # the batch's account: the fair queue's tenant
            self.sent += [(queue_url, m.model_dump()) for m in messages]

        def queue_prepare(batch_id: str, *, at: int) -> bool:
            assert at == AT  # the re-sent message is queued at the sweeper's time
            return True

        def fail_shard(batch_id: str, shard: Shard, reason: str) -> bool:
            self.failed.append((batch_id, shard.shard, reason))
            return True

        for target, name, fake in [
            (sweep, "get_settings", lambda: settings),
            (sweep.intake, "get_settings", lambda: settings),
            (sweep.batches, "queue_prepare", queue_prepare),
            (sweep, "now", lambda: AT),
            (sweep.batches, "open_headers", lambda: iter(headers)),
            (sweep.batches, "backfill_open_index", lambda: None),
            (sweep.batches, "transition", transition),
            (sweep.shards, "query", query),
            (sweep.shards, "bump_redrives", bump_redrives),
            (sweep.sqs, "send", send),
            (sweep, "fail_shard", fail_shard),
        ]:
            monkeypatch.setattr(target, name, fake)


def header(
    status: BatchStatus, *, created_at: int = LONG_AGO, expires_at: int = AT + 3600, **fields: Any
) -> BatchHeader:
    return batch_header(id="batch_1", status=status, created_at=created_at, expires_at=expires_at, **fields)


def shard(n: int, state: str = "pending", **fields: Any) -> Shard:
    return Shard(shard=n, size=2, first_line=2 * n + 1, input_key=f"k{n}", state=state, **fields)


RUNNING = {"in_progress_at": LONG_AGO, "shards_total": 3, "shards_done": 1}


def test_an_overdue_batch_begins_its_expiry_and_is_sent_to_the_aggregator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Due this very second, and busy (progress just now): expiry does not wait for a quiet batch
    fake = Fake(monkeypatch, [header(S.IN_PROGRESS, expires_at=AT, **RUNNING, progress_at=AT)])
    assert sweep.sweep() == {**NO_ACTIONS, "expired": 1, "past_window": 1}
    # Not sealed: the workers commit what they finish; the aggregator seals once they did
    assert fake.transitions == [("batch_1", S.FINALIZING, BatchChanges(final_status=S.EXPIRED), AT)]
    assert fake.sent == [("finalize", {"batch_id": "batch_1"})]


def test_an_expiry_that_lost_its_condition_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # A quiet overdue batch whose shard is lost: the failed seal means someone else moved it; no re-drive
    fake = Fake(
        monkeypatch,
        [header(S.IN_PROGRESS, expires_at=AT - 1, **RUNNING)],
        {"batch_1": [shard(1)]},
        transition_ok=False,
    )
    assert sweep.sweep() == {**NO_ACTIONS, "past_window": 1}
    assert (len(fake.transitions), fake.sent, fake.redrives) == (1, [], {("batch_1", 1): 0})


@pytest.mark.parametrize(
    ("batch", "queue", "action"),
    [
        (header(S.VALIDATING, created_at=AT - STUCK), "prepare", "prepare"),
        (
            header(S.IN_PROGRESS, in_progress_at=LONG_AGO, shards_total=2, shards_done=2),
            "finalize",
            "finalize",
        ),
        (
            header(
                S.FINALIZING,
                in_progress_at=LONG_AGO,
                finalizing_at=AT - STUCK,
                sealed=True,
                final_status=S.COMPLETED,
            ),
            "finalize",
            "finalize",
        ),
        (
            header(
                S.FINALIZING, expires_at=AT - 1, finalizing_at=LONG_AGO, sealed=True, final_status=S.COMPLETED
            ),
            "finalize",
            "finalize",
        ),
        (header(S.CANCELLING, cancelling_at=AT - STUCK), "finalize", "finalize"),
    ],
    ids=[
        "validating",
        "all-shards-done",
        "finalizing",
        "finalizing-overdue",
        "cancelling",
    ],
)
def test_a_quiet_batch_gets_its_lost_message_again(
    monkeypatch: pytest.MonkeyPatch, batch: BatchHeader, queue: str, action: str
) -> None:
    fake = Fake(monkeypatch, [batch])
    overdue = batch.expires_at < AT  # the "-overdue" cases: counted for BatchesPastWindowAlarm
    assert sweep.sweep() == {**NO_ACTIONS, action: 1, "past_window": int(overdue)}
    assert (fake.sent, fake.transitions) == ([(queue, {"batch_id": "batch_1"})], [])


def test_a_batch_still_validating_past_its_window_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    # A prepare that keeps dying must not hold one of the account's active slots forever
    fake = Fake(monkeypatch, [header(S.VALIDATING, expires_at=AT - 1)])
    assert sweep.sweep() == {**NO_ACTIONS, "expired": 1, "past_window": 1}
    assert (fake.sent, fake.transitions) == ([], [("batch_1", S.EXPIRED, None, AT)])


@pytest.mark.parametrize(
    "batch",
    [
        header(S.VALIDATING, created_at=AT - STUCK + 1),
        header(S.IN_PROGRESS, **RUNNING, progress_at=AT - STUCK + 1),  # created long ago, a commit just now
        header(S.IN_PROGRESS, in_progress_at=AT - 60, shards_total=2, shards_done=2),
        header(
            S.FINALIZING, in_progress_at=LONG_AGO, finalizing_at=AT - 1, sealed=True, final_status=S.EXPIRED
        ),
        header(S.CANCELLING, in_progress_at=LONG_AGO, cancelling_at=AT - STUCK + 1),
    ],
    ids=["validating", "in-progress", "all-shards-done", "finalizing", "cancelling"],
)
def test_a_batch_that_moved_lately_is_left_alone(monkeypatch: pytest.MonkeyPatch, batch: BatchHeader) -> None:
    fake = Fake(monkeypatch, [batch], {"batch_1": [shard(1)]})
    assert sweep.sweep() == NO_ACTIONS
    assert (fake.sent, fake.transitions, fake.redrives) == ([], [], {("batch_1", 1): 0})


def test_the_pending_shards_of_a_quiet_batch_are_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A done shard (its lease kept by a checkpointed commit), one never claimed, one whose lease ran out
    found = [shard(0, "done", lease_until=AT + 600), shard(1), shard(2, lease_until=AT - 1, redrives=2)]
    fake = Fake(monkeypatch, [header(S.IN_PROGRESS, **RUNNING)], {"batch_1": found})
    assert sweep.sweep() == {**NO_ACTIONS, "shards": 2}
    assert fake.sent == [
        ("shards", {"batch_id": "batch_1", "shard": 1}),
        ("shards", {"batch_id": "batch_1", "shard": 2}),
    ]
    assert fake.redrives == {("batch_1", 0): 0, ("batch_1", 1): 1, ("batch_1", 2): 3}
    assert fake.failed == []


def test_a_live_lease_means_slow_not_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    # Shard 1's lease lasts to this second; shard 2 looks lost, but the batch is running: no re-drive at all
    found = [shard(1, lease_until=AT), shard(2)]
    fake = Fake(monkeypatch, [header(S.IN_PROGRESS, **RUNNING)], {"batch_1": found})
    assert sweep.sweep() == NO_ACTIONS
    assert (fake.sent, fake.redrives) == ([], {("batch_1", 1): 0, ("batch_1", 2): 0})


def test_a_shard_redriven_past_max_shard_attempts_is_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Shard 1 reaches 5 re-drives (over 4): failed; shard 2 reaches 4: sent once more
    found = [shard(1, redrives=4), shard(2, redrives=3)]
    fake = Fake(monkeypatch, [header(S.IN_PROGRESS, **RUNNING)], {"batch_1": found})
    assert sweep.sweep() == {**NO_ACTIONS, "shards": 1, "failed_shards": 1}
    assert fake.failed == [("batch_1", 1, "The request was not processed after 4 re-drives.")]
    assert fake.sent == [("shards", {"batch_id": "batch_1", "shard": 2})]


def test_a_shard_whose_message_waits_in_the_queue_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Shard 1's message was sent a second short of the wait limit: waiting (a backlog), left alone;
    # shard 2's was sent WAIT seconds ago and never received: gone, sent again
    found = [shard(1, queued_at=AT - WAIT + 1), shard(2, queued_at=AT - WAIT)]
    fake = Fake(monkeypatch, [header(S.IN_PROGRESS, **RUNNING)], {"batch_1": found})
    assert sweep.sweep() == {**NO_ACTIONS, "shards": 1}
    assert fake.sent == [("shards", {"batch_id": "batch_1", "shard": 2})]
    assert fake.redrives == {("batch_1", 1): 0, ("batch_1", 2): 1}


def test_one_pass_acts_on_every_open_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [
        batch_header(
            id=f"batch_{n}",
            status=status,
            created_at=LONG_AGO,
            expires_at=expires_at,
            **({"in_progress_at": LONG_AGO, "shards_total": 1} if status == S.IN_PROGRESS else {}),
        )
        for n, (status, expires_at) in enumerate(
            [(S.VALIDATING, AT + 1), (S.IN_PROGRESS, AT - 1), (S.IN_PROGRESS, AT + 1), (S.VALIDATING, AT + 1)]
        )
    ]
    fake = Fake(monkeypatch, batches, {"batch_2": [shard(0)]})
    assert sweep.sweep() == {**NO_ACTIONS, "prepare": 2, "expired": 1, "shards": 1, "past_window": 1}
    assert fake.sent == [
        ("prepare", {"batch_id": "batch_0"}),
        ("finalize", {"batch_id": "batch_1"}),
        ("shards", {"batch_id": "batch_2", "shard": 0}),
        ("prepare", {"batch_id": "batch_3"}),
    ]


@pytest.mark.parametrize(
    ("batch", "sent"),
    [
        # A prepare streams the input (its lease renewed to this second): slow, not lost
        (header(S.VALIDATING, prepare_lease_until=AT), []),
        # Its message waits in a backlog of the prepare queue, a second short of the wait limit
        (header(S.VALIDATING, prepare_queued_at=AT - WAIT + 1), []),
        # Its message was sent WAIT seconds ago and never received: gone; its last prepare died
        (header(S.VALIDATING, prepare_queued_at=AT - WAIT, prepare_lease_until=AT - 1), ["prepare"]),
        # Running, its prepare died before its shard messages were all sent (its lease still present)
        (header(S.IN_PROGRESS, **RUNNING, prepare_lease_until=0), ["prepare"]),
    ],
    ids=["prepare-leased", "prepare-waiting", "prepare-lost", "in-progress-prepare-died"],
)
def test_a_prepare_is_sent_again_only_when_none_works_and_none_waits(
    monkeypatch: pytest.MonkeyPatch, batch: BatchHeader, sent: list[str]
) -> None:
    fake = Fake(monkeypatch, [batch], {"batch_1": [shard(1)]})
    assert sweep.sweep() == {**NO_ACTIONS, "prepare": len(sent)}
    assert fake.sent == [(queue, {"batch_id": "batch_1"}) for queue in sent]
    assert fake.redrives == {("batch_1", 1): 0}
