"""Fixtures of the moto-backed integration tests."""

from collections.abc import Iterator

import pytest

from support.moto_env import Aws, moto_account


@pytest.fixture
def moto_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    with moto_account(monkeypatch) as account:
        yield account
