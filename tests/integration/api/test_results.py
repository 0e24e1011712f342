"""`GET /v1/batches/{id}/output` (api/results.py, pipeline/partial.py) on the API function in-process,
the batch run shard by shard on the scripted model (prompts holding `FAIL` get a 400): the committed
output lines in input order as far as complete, each byte-equal to its line in the final output.jsonl,
paged by `after` and by size, never another account's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.api.test_retries import KEY, OTHER_KEY, call

from batchinfer.data import accounts, batches, files, s3
from batchinfer.pipeline import aggregate, partial, prepare
from support.api_stack import chat_line, jsonl
from support.moto_env import Aws
from support.pipeline import create, run_shard
from support.scripted import SCRIPTED, scripted_model

PROMPTS = ("one", "FAIL two", "three", "four", "five", "six")


@pytest.fixture
def running(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[Aws, str]]:
    """A batch of `PROMPTS` in three shards of two, prepared, no shard run yet."""
    accounts.create_key("default", secret=KEY)
    accounts.create_key("other", secret=OTHER_KEY)
    with scripted_model(tmp_path, monkeypatch):
        data = jsonl(*(chat_line(f"r{n}", p, model=SCRIPTED) for n, p in enumerate(PROMPTS, 1)))
        batch_id = create(moto_aws, data, monkeypatch)
        assert prepare.prepare_batch(batch_id) == "in_progress"
        moto_aws.messages("ShardsQueue")
        yield moto_aws, batch_id


def read(aws: Aws, batch_id: str, after: int = 0) -> tuple[bytes, str, str, str]:
    status, headers, body = call(aws, "GET", f"/v1/batches/{batch_id}/output", query=f"after={after}")
    assert status == 200
    assert headers["Content-Type"] == "application/jsonl"
    return (
        body,
        headers["X-Batchinfer-Next-After"],
        headers["X-Batchinfer-More"],
        headers["X-Batchinfer-Complete"],
    )


def test_output_grows_in_input_order_and_each_line_is_the_final_files(running: tuple[Aws, str]) -> None:
    aws, batch_id = running
    # Given nothing ran yet: nothing to read
    assert read(aws, batch_id) == (b"", "0", "false", "false")
    # When the last shard runs first: its lines wait for the shards before it
    run_shard(batch_id, 2)
    assert read(aws, batch_id)[:2] == (b"", "0")
    # When the first shard runs: its one success (r2 failed) is readable
    run_shard(batch_id, 0)
    early, after, _, _ = read(aws, batch_id)
    assert after == "1"
    # When the middle shard runs: every output line, the first ones not read again after 1
    run_shard(batch_id, 1)
    rest = read(aws, batch_id, after=1)
    assert rest[1:] == ("5", "false", "false")
    # Then, once the batch ends, the reads are exactly its output.jsonl
    aws.messages("FinalizeQueue")
    assert aggregate.finalize_batch(batch_id) == "completed"
    record = files.get(batches.get(batch_id).output_file_id)
    final = s3.get_bytes(record.bucket, record.key)
    assert early + rest[0] == final
    assert final.count(b"\n") == 5
    assert read(aws, batch_id, after=5) == (b"", "5", "false", "true")
    assert read(aws, batch_id)[0] == final


def test_a_large_output_comes_in_pages_to_its_owner_only(
    running: tuple[Aws, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    aws, batch_id = running
    for shard in range(3):
        run_shard(batch_id, shard)
    monkeypatch.setattr(partial, "MAX_PAGE_BYTES", 1)  # one line a page

    first, after, more, complete = read(aws, batch_id)

    assert (first.count(b"\n"), after, more, complete) == (1, "1", "true", "false")
    assert read(aws, batch_id, after=4)[1:] == ("5", "false", "false")
    status, _, body = call(aws, "GET", f"/v1/batches/{batch_id}/output", key=OTHER_KEY)
    assert (status, body["error"]["code"]) == (404, "batch_not_found")  # not another account's
