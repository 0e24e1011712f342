"""The batch table's keys: one shape per item kind (data/keys.py's table)."""

from __future__ import annotations

import re

import pytest

from batchinfer.data import keys


def test_table_keys_of_every_item_kind() -> None:
    assert keys.batch("batch_1") == {"PK": "BATCH#batch_1", "SK": "META"}
    assert keys.shard("batch_1", 0) == {"PK": "BATCH#batch_1", "SK": "SHARD#00000"}
    assert keys.shard("batch_1", 12345) == {"PK": "BATCH#batch_1", "SK": "SHARD#12345"}
    assert keys.file("file-1") == {"PK": "FILE#file-1", "SK": "META"}
    assert keys.upload("upload_1") == {"PK": "UPLOAD#upload_1", "SK": "META"}
    assert keys.api_key("ab12") == {"PK": "KEY#ab12", "SK": "META"}
    assert keys.key_pointer("key_1") == {"PK": "KEYID#key_1", "SK": "META"}
    assert keys.account("acct") == {"PK": "ACCOUNT#acct", "SK": "META"}
    assert keys.active_counter("acct") == {"PK": "ACCOUNT#acct", "SK": "LIMITS"}
    assert keys.rate_counter("acct", 1_800_000_000) == {"PK": "ACCOUNT#acct", "SK": "RATE#1800000000"}


def test_a_batchs_shards_share_its_partition_and_sort_in_shard_order() -> None:
    shard_keys = [keys.shard("b", n) for n in (10, 2, 9999, 0)]
    assert {k["PK"] for k in shard_keys} == {keys.batch("b")["PK"]} == {keys.batch_partition("b")}
    assert sorted(k["SK"] for k in shard_keys) == ["SHARD#00000", "SHARD#00002", "SHARD#00010", "SHARD#09999"]
    assert all(k["SK"].startswith(keys.SHARD_PREFIX) for k in shard_keys)
    assert keys.batch("b")["PK"].startswith(keys.BATCH_PREFIX)


def test_index_keys() -> None:
    assert (keys.account_batches("acct"), keys.account_files("acct"), keys.account_keys("acct")) == (
        "ACCOUNT#acct",
        "FILES#acct",
        "KEYS#acct",
    )
    assert keys.key_order(1_800_000_000, "key_1") == "1800000000#key_1"
    assert keys.key_order(5, "key_1") == "0000000005#key_1"
    assert re.fullmatch(r"0000000005#\d{19}#batch_1", keys.creation_order(5, "batch_1"))
    assert keys.indexed({"PK": "FILE#f", "SK": "META"}, "FILES#a", "0000000005#x") == {
        "PK": "FILE#f",
        "SK": "META",
        "GSI1PK": "FILES#a",
        "GSI1SK": "0000000005#x",
    }


def test_creation_order_sorts_by_second_then_by_write_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([1_800_000_000_000_000_001, 1_800_000_000_000_000_002, 1_799_999_999_000_000_000])
    monkeypatch.setattr(keys.time, "time_ns", lambda: next(clock))
    first, second, third = (
        keys.creation_order(100, "z"),
        keys.creation_order(100, "a"),
        keys.creation_order(101, "a"),
    )
    assert first == "0000000100#1800000000000000001#z"
    # Within one second the later write sorts later whatever its id; a later second sorts later still.
    assert first < second < third


def test_index_position_is_the_table_and_index_keys_of_an_item() -> None:
    item = {"PK": "BATCH#b", "SK": "META", "GSI1PK": "ACCOUNT#a", "GSI1SK": "s", "status": "validating"}
    assert keys.index_position(item) == {"PK": "BATCH#b", "SK": "META", "GSI1PK": "ACCOUNT#a", "GSI1SK": "s"}
