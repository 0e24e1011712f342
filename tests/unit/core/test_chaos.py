"""Chaos mode's random choices (core/chaos.py): one stream per fault and per execution environment."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from batchinfer.core import chaos


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    chaos.reset()
    yield
    chaos.reset()


def draws(
    monkeypatch: pytest.MonkeyPatch, environment: str | None, n: int = 400, **config: object
) -> list[bool]:
    """The first `n` rolls of `crash_before_commit` at 5%, seed 1440, in `environment`'s process."""
    faults = {"seed": 1440, "crash_before_commit": 0.05, **config}
    monkeypatch.setenv("BATCHINFER_CHAOS", json.dumps(faults))
    if environment is None:
        monkeypatch.delenv("AWS_LAMBDA_LOG_STREAM_NAME", raising=False)
    else:
        monkeypatch.setenv("AWS_LAMBDA_LOG_STREAM_NAME", environment)
    chaos.reset()
    return [chaos.roll("crash_before_commit") for _ in range(n)]


def test_each_environment_draws_faults_of_its_own_and_the_same_seed_repeats_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = draws(monkeypatch, "2026/12/02/[$LATEST]aaaa")
    other = draws(monkeypatch, "2026/12/02/[$LATEST]bbbb")
    # Two environments of one function, same seed: their crashes come at different rolls
    assert one != other
    assert [i for i, fired in enumerate(one) if fired] != [i for i, fired in enumerate(other) if fired]
    # The same environment and seed give the same draws; so does a process outside any environment
    assert draws(monkeypatch, "2026/12/02/[$LATEST]aaaa") == one
    assert draws(monkeypatch, None) == draws(monkeypatch, None)
    assert chaos.injected["crash_before_commit"] == sum(draws(monkeypatch, None))


def test_without_per_environment_draws_every_environment_draws_the_seeds_sequence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    same = [draws(monkeypatch, env, per_environment=False) for env in ("[$LATEST]aaaa", "[$LATEST]bbbb")]
    assert same[0] == same[1] == draws(monkeypatch, None)
