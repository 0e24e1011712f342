"""Every sample event in events/ (for `sam local invoke -e`) drives its handler to a known answer."""

from __future__ import annotations

import json

import pytest

from batchinfer.data import accounts
from batchinfer.wire.webhooks import event_id
from support.moto_env import Aws, load_event

# The API events carry this key (for `sam local invoke`, store it with `batchinfer keys` or use your own).
SAMPLE_KEY = "sk-bi-sample-key-for-sam-local-invoke"


@pytest.fixture(autouse=True)
def _sample_key(moto_aws: Aws) -> None:
    accounts.create_key("default", secret=SAMPLE_KEY)


def test_api_create_batch_with_an_unknown_file_is_a_404_envelope(moto_aws: Aws) -> None:
    response = moto_aws.invoke("ApiFunction", load_event("api-create-batch.json"))
    assert response["statusCode"] == 404
    error = json.loads(response["body"])["error"]
    assert (error["message"], error["type"], error["code"]) == (
        "No such File object: file-0123456789abcdef01234567",
        "invalid_request_error",
        "file_not_found",
    )


def test_api_retrieve_batch_unknown_is_404(moto_aws: Aws) -> None:
    response = moto_aws.invoke("ApiFunction", load_event("api-retrieve-batch.json"))
    assert response["statusCode"] == 404
    assert json.loads(response["body"])["error"]["code"] == "batch_not_found"


def test_api_list_batches_is_an_empty_list(moto_aws: Aws) -> None:
    response = moto_aws.invoke("ApiFunction", load_event("api-list-batches.json"))
    assert (response["statusCode"], json.loads(response["body"])) == (
        200,
        {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False},
    )


def test_stage_events_for_an_unknown_batch_are_acknowledged(moto_aws: Aws) -> None:
    for function, event in [
        ("PrepareFunction", "prepare.json"),
        ("ShardWorkerFunction", "shard-worker.json"),
        ("AggregatorFunction", "aggregator.json"),
    ]:
        assert moto_aws.invoke(function, load_event(event)) == {"batchItemFailures": []}


def test_sweeper_event_with_nothing_open(moto_aws: Aws) -> None:
    assert moto_aws.invoke("SweeperFunction", load_event("sweeper.json")) == {
        "expired": 0,
        "prepare": 0,
        "shards": 0,
        "failed_shards": 0,
        "finalize": 0,
        "past_window": 0,
        "files_expired": 0,
        "uploads_expired": 0,
    }


def test_upload_trigger_event_starts_a_batch(moto_aws: Aws) -> None:
    event = load_event("upload-trigger.json")
    event["Records"][0]["body"] = event["Records"][0]["body"].replace(
        "batchinfer-123456789012-us-east-1-data", moto_aws.bucket
    )
    assert moto_aws.invoke("UploadTriggerFunction", event) == {"batchItemFailures": []}
    assert [m["batch_id"][:6] for m in moto_aws.messages("PrepareQueue")] == ["batch_"]


def test_status_events_event_publishes_the_failure_and_queues_its_webhook(moto_aws: Aws) -> None:
    assert moto_aws.invoke("StatusEventsFunction", load_event("status-events.json")) == {
        "batchItemFailures": []
    }
    [message] = moto_aws.messages("WebhookQueue")
    assert message == {
        "batch_id": "batch_0123456789abcdef01234567",
        "account_id": "default",
        "type": "batch.failed",
        "event_id": event_id("batch_0123456789abcdef01234567", "batch.failed"),
        "created_at": 1764480100,
    }


def test_webhook_event_for_an_account_without_a_url_sends_nothing(moto_aws: Aws) -> None:
    assert moto_aws.invoke("WebhookFunction", load_event("webhook.json")) == {"batchItemFailures": []}
