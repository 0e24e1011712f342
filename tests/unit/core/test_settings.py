"""Settings derived from others."""

from __future__ import annotations

import pytest

from batchinfer.core.settings import Settings


@pytest.mark.parametrize(
    ("workers", "share", "slots"),
    [(20, 0.8, 16), (4, 0.5, 2), (3, 0.67, 2), (3, 0.5, 1), (2, 0.9, 1), (20, 1.0, None), (20, 0.96, 19)],
)
def test_an_accounts_shard_slots_are_its_share_of_the_workers(
    workers: int, share: float, slots: int | None
) -> None:
    settings = Settings(table_name="t", bucket_name="b", max_shard_workers=workers, account_shard_share=share)
    assert settings.account_shard_slots == slots


def test_a_batchs_shard_size_is_by_where_its_model_runs() -> None:
    settings = Settings(table_name="t", bucket_name="b", shard_size=7, remote_shard_size=70)
    assert (settings.shard_size_for(in_process=True), settings.shard_size_for(in_process=False)) == (7, 70)
