"""The status machine table (DESIGN.md, OpenAI batch statuses)."""

import pytest

from batchinfer.wire.status import TERMINAL, allowed_sources, can_transition, is_terminal
from batchinfer.wire.status import BatchStatus as S

EDGES = {
    (S.VALIDATING, S.IN_PROGRESS),
    (S.VALIDATING, S.FAILED),
    (S.VALIDATING, S.CANCELLING),
    (S.VALIDATING, S.EXPIRED),
    (S.IN_PROGRESS, S.FINALIZING),
    (S.IN_PROGRESS, S.CANCELLING),
    (S.FINALIZING, S.COMPLETED),
    (S.FINALIZING, S.EXPIRED),
    (S.FINALIZING, S.FAILED),
    (S.CANCELLING, S.CANCELLED),
}


@pytest.mark.parametrize("source", list(S))
@pytest.mark.parametrize("target", list(S))
def test_every_pair_follows_the_table(source: S, target: S) -> None:
    assert can_transition(source, target) is ((source, target) in EDGES)


def test_terminal_statuses() -> None:
    assert TERMINAL == {S.COMPLETED, S.FAILED, S.EXPIRED, S.CANCELLED}
    assert [s for s in S if is_terminal(s)] == [S.FAILED, S.COMPLETED, S.EXPIRED, S.CANCELLED]


def test_allowed_sources_are_the_conditions_of_each_write() -> None:
    assert allowed_sources(S.IN_PROGRESS) == {S.VALIDATING}
    assert allowed_sources(S.FAILED) == {S.VALIDATING, S.FINALIZING}
    assert allowed_sources(S.CANCELLING) == {S.VALIDATING, S.IN_PROGRESS}
    assert allowed_sources(S.CANCELLED) == {S.CANCELLING}
    assert allowed_sources(S.EXPIRED) == {S.VALIDATING, S.FINALIZING}
    assert allowed_sources(S.VALIDATING) == set()


def test_a_terminal_status_never_goes_back() -> None:
    for terminal in TERMINAL:
        assert not any(can_transition(terminal, target) for target in S)
