"""`/v1/messages/batches` (api/anthropic.py) on the API function in-process, in moto's copy of the
template's resources, its batches run by the real pipeline stages on the scripted model: create,
results in input order (succeeded and errored), paging both ways, cancel, delete, the limits, both
auth headers, the error envelope and per-account isolation."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from batchinfer.api import anthropic
from batchinfer.core.settings import get_settings
from batchinfer.data import accounts, batches
from batchinfer.pipeline import aggregate, intake, prepare
from support.moto_env import Aws, load_event
from support.pipeline import run_shard
from support.scripted import SCRIPTED, scripted_model

KEY, OTHER_KEY = "sk-bi-sample-key-for-sam-local-invoke", "sk-bi-another-account-key-000000"


def params(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": SCRIPTED, "max_tokens": 4, "messages": [{"role": "user", "content": text}], **extra}


def counts(**states: int) -> dict[str, int]:
    """A MessageBatch's request_counts: `states` given, every other 0."""
    return {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0, **states}


class Api:
    """The API function of a moto account, called with Anthropic-shaped requests."""

    def __init__(self, aws: Aws) -> None:
        self.aws = aws

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: str = "",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        event = load_event("api-create-batch.json")
        event["rawPath"] = event["requestContext"]["http"]["path"] = path
        event["requestContext"]["http"]["method"] = method
        event["pathParameters"] = {"proxy": path.removeprefix("/v1/")}
        event["rawQueryString"] = query
        event["queryStringParameters"] = dict(p.split("=", 1) for p in query.split("&")) if query else None
        event["headers"] = (
            headers if headers is not None else {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
        )
        event["headers"]["content-type"] = "application/json"
        event["body"] = None if body is None else json.dumps(body)
        response = self.aws.invoke("ApiFunction", event)
        text = response["body"]
        if response.get("isBase64Encoded"):
            text = base64.b64decode(text).decode()
        try:
            parsed = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = text
        return response["statusCode"], response.get("headers") or {}, parsed

    def create(self, *entries: tuple[str, dict[str, Any]], **kw: Any) -> dict[str, Any]:
        requests = [{"custom_id": cid, "params": p} for cid, p in entries]
        status, _, body = self.call("POST", "/v1/messages/batches", {"requests": requests}, **kw)
        assert status == 200, body
        return body


@pytest.fixture
def api(moto_aws: Aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    accounts.create_key("default", secret=KEY)
    accounts.create_key("other", secret=OTHER_KEY)
    monkeypatch.setenv("SHARD_SIZE", "2")
    monkeypatch.setenv("REMOTE_SHARD_SIZE", "2")
    with scripted_model(tmp_path, monkeypatch) as upstream:
        get_settings.cache_clear()
        yield Api(moto_aws), upstream


def run(aws: Aws, batch_id: str) -> None:
    """Prepare, run every shard and aggregate the batch."""
    assert prepare.prepare_batch(batch_id) == "in_progress"
    for message in aws.messages("ShardsQueue"):
        run_shard(batch_id, message["shard"])
    aws.messages("FinalizeQueue")
    assert aggregate.finalize_batch(batch_id) == "completed"


def test_a_batch_runs_and_its_results_come_in_input_order(api: Any) -> None:
    # Given a batch of a good request, one with invalid params and another good one
    client, _ = api
    created = client.create(
        ("a", params("one")), ("b", params("two", temperature=2)), ("c", params("three", system="Be brief."))
    )
    # Then it is in progress, every request processing
    assert created["type"] == "message_batch"
    assert created["processing_status"] == "in_progress"
    assert created["request_counts"] == counts(processing=3)
    assert created["results_url"] is None
    assert created["created_at"].endswith("Z")
    # When it runs
    run(client.aws, created["id"])
    status, _, ended = client.call("GET", f"/v1/messages/batches/{created['id']}")
    # Then it ended with one errored request, the rest succeeded
    assert status == 200
    assert ended["processing_status"] == "ended"
    assert ended["request_counts"] == counts(succeeded=2, errored=1)
    assert ended["results_url"] == f"/v1/messages/batches/{created['id']}/results"
    status, _, text = client.call("GET", ended["results_url"])
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(line["custom_id"], line["result"]["type"]) for line in lines] == [
        ("a", "succeeded"),
        ("b", "errored"),
        ("c", "succeeded"),
    ]
    message = lines[0]["result"]["message"]
    assert (message["type"], message["role"], message["model"]) == ("message", "assistant", SCRIPTED)
    assert message["content"] == [{"type": "text", "text": "echo: one"}]
    assert (message["stop_reason"], message["usage"]) == ("end_turn", {"input_tokens": 3, "output_tokens": 2})
    assert lines[1]["result"]["error"] == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "params.temperature: Input should be less than or equal to 1",
        },
    }


def test_listing_pages_both_ways_newest_first(api: Any) -> None:
    client, _ = api
    ids_ = [client.create((f"r{i}", params("x")))["id"] for i in range(5)]
    newest = ids_[::-1]
    _, _, first = client.call("GET", "/v1/messages/batches", query="limit=2")
    assert [b["id"] for b in first["data"]] == newest[:2]
    assert (first["has_more"], first["first_id"], first["last_id"]) == (True, newest[0], newest[1])
    _, _, second = client.call("GET", "/v1/messages/batches", query=f"limit=2&after_id={newest[1]}")
    assert [b["id"] for b in second["data"]] == newest[2:4]
    _, _, last = client.call("GET", "/v1/messages/batches", query=f"limit=2&after_id={newest[3]}")
    assert ([b["id"] for b in last["data"]], last["has_more"]) == (newest[4:], False)
    _, _, back = client.call("GET", "/v1/messages/batches", query=f"limit=2&before_id={newest[4]}")
    assert ([b["id"] for b in back["data"]], back["has_more"]) == (newest[2:4], True)
    _, _, top = client.call("GET", "/v1/messages/batches", query=f"limit=2&before_id={newest[1]}")
    assert ([b["id"] for b in top["data"]], top["has_more"]) == (newest[:1], False)


def test_cancel_keeps_what_ran_and_cancels_the_rest(api: Any) -> None:
    client, _ = api
    batch = client.create(("a", params("one")), ("b", params("two")), ("c", params("three")))
    assert prepare.prepare_batch(batch["id"]) == "in_progress"
    shards = client.aws.messages("ShardsQueue")
    run_shard(batch["id"], shards[0]["shard"])  # a and b answered
    status, _, canceling = client.call("POST", f"/v1/messages/batches/{batch['id']}/cancel")
    assert (status, canceling["processing_status"]) == (200, "canceling")
    assert canceling["cancel_initiated_at"] is not None
    client.aws.messages("FinalizeQueue")
    assert aggregate.finalize_batch(batch["id"]) == "cancelled"
    _, _, ended = client.call("GET", f"/v1/messages/batches/{batch['id']}")
    assert ended["request_counts"] == counts(succeeded=2, canceled=1)
    _, _, text = client.call("GET", ended["results_url"])
    assert [json.loads(line)["result"]["type"] for line in text.splitlines()] == [
        "succeeded",
        "succeeded",
        "canceled",
    ]


def test_delete_only_once_ended(api: Any) -> None:
    client, _ = api
    batch = client.create(("a", params("one")))
    status, headers, body = client.call("DELETE", f"/v1/messages/batches/{batch['id']}")
    assert (status, headers["x-should-retry"], body["error"]["type"]) == (
        400,
        "false",
        "invalid_request_error",
    )
    run(client.aws, batch["id"])
    status, _, body = client.call("DELETE", f"/v1/messages/batches/{batch['id']}")
    assert (status, body) == (200, {"id": batch["id"], "type": "message_batch_deleted"})
    assert batches.get(batch["id"]) is None
    status, _, body = client.call("GET", f"/v1/messages/batches/{batch['id']}")
    assert (status, body["error"]["type"]) == (404, "not_found_error")


def test_keys_isolation_and_the_error_envelope(api: Any) -> None:
    # Given a Message Batch (created with x-api-key) and an OpenAI batch of the same account
    client, _ = api
    batch = client.create(("a", params("one")))
    openai_batch = intake.NewBatch(
        batch_id="batch_openai",
        account_id="default",
        input_file_id="file-x",
        input_bucket=client.aws.bucket,
        input_key="files/x",
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    intake.create_batch(openai_batch)
    bearer, other = {"authorization": f"Bearer {KEY}"}, {"authorization": f"Bearer {OTHER_KEY}"}
    # Then another account finds neither it nor any batch, in Anthropic's envelope
    status, headers, body = client.call("GET", f"/v1/messages/batches/{batch['id']}", headers=other)
    assert (status, body["type"], body["error"]["type"]) == (404, "error", "not_found_error")
    assert headers["request-id"] == body["request_id"]
    assert body["request_id"].startswith("req_")
    assert client.call("GET", "/v1/messages/batches", headers=other)[2]["data"] == []
    # And a bad key is an authentication error
    status, _, body = client.call("GET", "/v1/messages/batches", headers={"x-api-key": "sk-nope"})
    assert (status, body["error"]["type"]) == (401, "authentication_error")
    # And the Message Batch is a batch of /v1/batches too, while the OpenAI batch is no Message Batch
    openai_view = client.call("GET", f"/v1/batches/{batch['id']}", headers=bearer)[2]
    assert (openai_view["endpoint"], openai_view["request_counts"]["total"]) == ("/v1/messages", 1)
    status, _, body = client.call("GET", "/v1/messages/batches/batch_openai", headers=bearer)
    assert (status, body["error"]["type"]) == (404, "not_found_error")
    listed = client.call("GET", "/v1/messages/batches", headers=bearer)[2]
    assert [b["id"] for b in listed["data"]] == [batch["id"]]


INVALID_CREATES = [
    ([{"custom_id": "a b", "params": {}}], "custom_id"),
    ([{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}], "more than one request"),
    ([], "requests"),
]


def test_invalid_creates_are_invalid_request_errors_and_large_ones_413(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = api
    for requests, message in INVALID_CREATES:
        status, _, body = client.call("POST", "/v1/messages/batches", {"requests": requests})
        assert (status, body["type"], body["error"]["type"]) == (400, "error", "invalid_request_error")
        assert message in body["error"]["message"]
    monkeypatch.setattr(anthropic, "MAX_REQUESTS", 2)
    requests = [{"custom_id": f"r{i}", "params": params("x")} for i in range(3)]
    status, _, body = client.call("POST", "/v1/messages/batches", {"requests": requests})
    assert (status, body["error"]["type"]) == (413, "request_too_large")
    assert (
        body["error"]["message"]
        == "A message batch holds at most 2 requests and 209715200 bytes; this one has 3 requests in 389 "
        "bytes."
    )


def test_an_expired_batch_ends_with_expired_results(api: Any) -> None:
    # Given a batch whose window ends before anything ran
    client, _ = api
    batch = client.create(("a", params("one")), ("b", params("two")))
    assert prepare.prepare_batch(batch["id"]) == "in_progress"
    assert batches.begin_expiry(batch["id"]) is not None
    # When the aggregator ends it
    assert aggregate.finalize_batch(batch["id"]) == "expired"
    # Then every request is expired, in the counts and in the results
    _, _, ended = client.call("GET", f"/v1/messages/batches/{batch['id']}")
    assert ended["request_counts"] == counts(expired=2)
    _, _, text = client.call("GET", ended["results_url"])
    assert text.splitlines() == [
        '{"custom_id":"a","result":{"type":"expired"}}',
        '{"custom_id":"b","result":{"type":"expired"}}',
    ]


def test_large_results_are_a_redirect_to_s3(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = api
    batch = client.create(("a", params("one")))
    run(client.aws, batch["id"])
    monkeypatch.setattr(anthropic, "INLINE_CONTENT_BYTES", 10)

    status, headers, _ = client.call("GET", f"/v1/messages/batches/{batch['id']}/results")

    assert status == 302
    assert headers["Location"].startswith(
        f"https://{client.aws.bucket}.s3.amazonaws.com/files/{batch['id']}-results.jsonl?"
    )
