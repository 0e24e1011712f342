"""`POST /v1/batches/{id}/retry` (api/retries.py, pipeline/rerun.py) on the API function in-process, in
moto's copy of the template's resources, the batches run by the real pipeline stages on the scripted
model (prompts holding `FAIL` get a 400): the retry's input is exactly the failed and unrun lines, a
second call returns the same batch, and the limits and isolation of any create hold."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchinfer.core import ids
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, batches, files, s3
from batchinfer.pipeline import aggregate, prepare
from support.api_stack import chat_line, jsonl
from support.moto_env import Aws, load_event
from support.pipeline import create, run_shard
from support.scripted import SCRIPTED, scripted_model

KEY, OTHER_KEY = "sk-bi-sample-key-for-sam-local-invoke", "sk-bi-another-account-key-000000"
PROMPTS = ("one", "FAIL two", "three", "FAIL four", "five")
INPUT = jsonl(*(chat_line(f"r{n}", p, model=SCRIPTED) for n, p in enumerate(PROMPTS, 1)))


def call(aws: Aws, method: str, path: str, *, key: str = KEY, query: str = "") -> tuple[int, dict, Any]:
    """One request to the API function: (status, headers, body: parsed JSON, else bytes)."""
    event = load_event("api-create-batch.json")
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["requestContext"]["http"]["method"] = method
    event["pathParameters"] = {"proxy": path.removeprefix("/v1/")}
    event["rawQueryString"] = query
    event["queryStringParameters"] = dict(p.split("=", 1) for p in query.split("&")) if query else None
    event["headers"] = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    event["body"] = None
    response = aws.invoke("ApiFunction", event)
    raw = response["body"].encode()
    if response.get("isBase64Encoded"):
        raw = base64.b64decode(raw)
    content_type = (response.get("headers") or {}).get("Content-Type", "")
    body = json.loads(raw) if content_type == "application/json" else raw
    return response["statusCode"], response.get("headers") or {}, body


@pytest.fixture
def scripted(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Aws]:
    accounts.create_key("default", secret=KEY)
    accounts.create_key("other", secret=OTHER_KEY)
    with scripted_model(tmp_path, monkeypatch):
        yield moto_aws


def ran(aws: Aws, monkeypatch: pytest.MonkeyPatch, data: bytes = INPUT, *, shards: int | None = None) -> str:
    """A batch of `data` in shards of 2, prepared, its first `shards` shards run (None: all), then
    aggregated when all ran; its id."""
    batch_id = create(aws, data, monkeypatch, metadata={"project": "demo"})
    assert prepare.prepare_batch(batch_id) == "in_progress"
    for message in aws.messages("ShardsQueue")[:shards]:
        run_shard(batch_id, message["shard"])
    if shards is None:
        aws.messages("FinalizeQueue")
        assert aggregate.finalize_batch(batch_id) == "completed"
    return batch_id


def input_of(batch: dict[str, Any]) -> bytes:
    record = files.get(batch["input_file_id"])
    return s3.get_bytes(record.bucket, record.key)


def test_a_retry_runs_exactly_the_failed_lines_once(scripted: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a batch that completed with two failed lines
    batch_id = ran(scripted, monkeypatch)
    scripted.messages("PrepareQueue")
    # When its retry is asked twice
    status, _, first = call(scripted, "POST", f"/v1/batches/{batch_id}/retry")
    again = call(scripted, "POST", f"/v1/batches/{batch_id}/retry")[2]
    # Then one batch runs the failed lines as they were, with the original's endpoint, window and metadata
    assert status == 200
    assert first == again
    assert first["id"] == ids.retry_batch_id(batch_id)
    assert first["status"] == "validating"
    assert (first["endpoint"], first["completion_window"]) == ("/v1/chat/completions", "24h")
    assert first["metadata"] == {"project": "demo", "retry_of": batch_id}
    assert input_of(first) == jsonl(*INPUT.decode().splitlines()[1::2])
    assert scripted.messages("PrepareQueue") == [{"batch_id": first["id"]}]
    assert batches.get(first["id"]).active_counted is True


def test_a_cancelled_batch_retries_its_failed_and_unrun_lines(
    scripted: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch cancelled after its first shard (r1 answered, r2 failed; r3 ... r5 never ran)
    batch_id = ran(scripted, monkeypatch, shards=1)
    assert call(scripted, "POST", f"/v1/batches/{batch_id}/cancel")[0] == 200
    assert aggregate.finalize_batch(batch_id) == "cancelled"
    # When it is retried
    status, _, retry = call(scripted, "POST", f"/v1/batches/{batch_id}/retry")
    # Then every line but r1 runs again
    assert status == 200
    assert input_of(retry) == jsonl(*INPUT.decode().splitlines()[1:])


def test_a_batch_cancelled_before_it_ran_retries_every_line(
    scripted: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = create(scripted, b"\n" + INPUT, monkeypatch)
    assert call(scripted, "POST", f"/v1/batches/{batch_id}/cancel")[0] == 200
    assert aggregate.finalize_batch(batch_id) == "cancelled"

    retry = call(scripted, "POST", f"/v1/batches/{batch_id}/retry")[2]

    assert input_of(retry) == INPUT  # the blank line left out


def test_a_batch_without_lines_to_retry_is_a_conflict(scripted: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a batch still running, one with no failed line, one that failed validation, and a
    # cancelled one whose metadata is full (its retry could not name it)
    running = ran(scripted, monkeypatch, shards=1)
    fine = ran(scripted, monkeypatch, jsonl(chat_line("r1", "one", model=SCRIPTED)))
    invalid = create(scripted, b'{"custom_id": "x"}\n', monkeypatch)
    assert prepare.prepare_batch(invalid) == "failed"
    full = create(scripted, INPUT, monkeypatch, metadata={f"k{n}": "v" for n in range(16)})
    assert call(scripted, "POST", f"/v1/batches/{full}/cancel")[0] == 200
    assert aggregate.finalize_batch(full) == "cancelled"
    for batch_id, code in [
        (running, "batch_not_ended"),
        (fine, "nothing_to_retry"),
        (invalid, "batch_not_retryable"),
        (full, "metadata_full"),
    ]:
        # When its retry is asked, then it is a conflict saying why, and no batch is created
        status, _, body = call(scripted, "POST", f"/v1/batches/{batch_id}/retry")
        assert (status, body["error"]["code"]) == (409, code)
        assert batches.get(ids.retry_batch_id(batch_id)) is None


def test_a_retry_is_limited_and_isolated_as_any_create(
    scripted: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an account that may have one active batch, which it has
    batch_id = ran(scripted, monkeypatch)
    create(scripted, INPUT, monkeypatch)
    monkeypatch.setenv("MAX_ACTIVE_BATCHES", "1")
    get_settings.cache_clear()
    # When a retry is asked, then it is refused as any create would be
    status, _, body = call(scripted, "POST", f"/v1/batches/{batch_id}/retry")
    assert (status, body["error"]["code"]) == (429, "active_batch_limit_exceeded")
    # And another account's retry of it is not found
    status, _, body = call(scripted, "POST", f"/v1/batches/{batch_id}/retry", key=OTHER_KEY)
    assert (status, body["error"]["code"]) == (404, "batch_not_found")
    assert batches.get(ids.retry_batch_id(batch_id)) is None
