"""The TokenHub dialect of `POST /v1/batches` with plain HTTP: inputs and results in the user's own
storage (`s3://bucket/key`, `cos://bucket.region/key`), on the local stack and the real embedded model.

The account may only name buckets on its allowlist (403 otherwise, before any read), an unreadable
input is 400 `input_file_unavailable` at create time, results land under the output path in a folder
per batch, and `output_file_id` names that object, with a presigned download URL beside it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batchinfer.core.settings import get_settings
from batchinfer.data import locations
from batchinfer_local import LocalStack
from support.api_stack import api_client, chat_line, jsonl, new_account, wait_for
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(180), DEFAULT.mark]

USER_BUCKET, OTHER_BUCKET = "batchinfer-user-acme", "batchinfer-user-rival"
GHOST = "batchinfer-user-ghost"  # allowed, but never created
COS_BUCKET, COS_REGION = "userdata-1250000000", "ap-guangzhou"
LINES = jsonl(chat_line("q-1", "Say hi."), chat_line("q-2", "Say bye."))


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("tokenhub")) as shared:
        running = shared.stack
        for bucket in (USER_BUCKET, OTHER_BUCKET, COS_BUCKET):
            running.s3.create_bucket(Bucket=bucket)
        running.s3.put_object(Bucket=USER_BUCKET, Key="in/batch.jsonl", Body=LINES)
        running.s3.put_object(Bucket=OTHER_BUCKET, Key="in/batch.jsonl", Body=LINES)
        yield running


@pytest.fixture(scope="module")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    key = new_account("acme", allowed_buckets=[f"s3://{USER_BUCKET}", f"cos://{COS_BUCKET}", f"s3://{GHOST}"])
    with api_client(stack, key) as client:
        yield client


def tokenhub(**fields: Any) -> dict[str, Any]:
    return {
        "input_source": "user_s3",
        "input_file_id": f"s3://{USER_BUCKET}/in/batch.jsonl",
        "output_target": "user_s3",
        "output_user_s3_path": f"s3://{USER_BUCKET}/results/",
        "completion_window": "24h",
        "name": "nightly",
        **fields,
    }


def error_of(response: httpx.Response) -> tuple[int, str, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["param"]


def test_s3_paths_run_and_write_results_under_the_output_path(stack: LocalStack, http: httpx.Client) -> None:
    # When a TokenHub create names an s3:// input and output path
    created = http.post("/batches", json=tokenhub())
    assert created.status_code == 202, created.text  # TokenHub's create answers 202 (OpenAI's 200)
    batch = wait_for(http, created.json()["id"])

    # Then it runs like any batch, and its results are objects under the output path
    batch_id = batch["id"]
    assert created.json()["status"] == "validating"
    assert {
        k: batch[k]
        for k in (
            "status",
            "endpoint",
            "input_file_id",
            "input_source",
            "output_target",
            "output_user_s3_path",
            "name",
            "request_counts",
            "error_file_id",
        )
    } == {
        "status": "completed",
        "endpoint": "/v1/chat/completions",
        "input_file_id": f"s3://{USER_BUCKET}/in/batch.jsonl",
        "input_source": "user_s3",
        "output_target": "user_s3",
        "output_user_s3_path": f"s3://{USER_BUCKET}/results/",
        "name": "nightly",
        "request_counts": {"total": 2, "completed": 2, "failed": 0},
        "error_file_id": None,
    }
    assert batch["output_file_id"] == f"s3://{USER_BUCKET}/results/{batch_id}/output.jsonl"
    stored = stack.s3.get_object(Bucket=USER_BUCKET, Key=f"results/{batch_id}/output.jsonl")["Body"].read()
    downloaded = httpx.get(batch["output_file_url"], timeout=30)  # presigned: no API key
    assert downloaded.status_code == 200 and downloaded.content == stored
    lines = [json.loads(line) for line in stored.splitlines()]
    assert [line["custom_id"] for line in lines] == ["q-1", "q-2"]
    assert all(line["response"]["status_code"] == 200 for line in lines)

    # And a terminal batch can't be cancelled
    cancel = http.post(f"/batches/{batch_id}/cancel")
    assert error_of(cancel) == (409, "batch_not_cancellable", None)
    assert (
        cancel.json()["error"]["message"] == f"Batch {batch_id} is completed and can no longer be cancelled."
    )


def test_unreadable_input_is_400_input_file_unavailable(http: httpx.Client) -> None:
    missing = http.post("/batches", json=tokenhub(input_file_id=f"s3://{USER_BUCKET}/in/nope.jsonl"))
    assert error_of(missing) == (400, "input_file_unavailable", "input_file_id")
    assert missing.json()["error"]["message"] == (
        f"The input file s3://{USER_BUCKET}/in/nope.jsonl cannot be read (404)."
    )


def test_every_user_bucket_call_names_the_expected_owner(stack: LocalStack, http: httpx.Client) -> None:
    # Given the functions expecting the buckets to belong to another AWS account than they do
    stack.configure_functions(
        {"EXPECTED_BUCKET_OWNER": "999999999999"},
        call=["batchinfer.core.settings.get_settings.cache_clear"],
    )
    try:
        # When a TokenHub batch names the (allowed, readable) user bucket
        refused = http.post("/batches", json=tokenhub())
    finally:
        stack.configure_functions(
            {"EXPECTED_BUCKET_OWNER": "123456789012"},
            call=["batchinfer.core.settings.get_settings.cache_clear"],
        )
    # Then S3 refused the call (403), as it refuses a bucket name another account took over
    assert error_of(refused) == (400, "input_file_unavailable", "input_file_id")
    assert refused.json()["error"]["message"] == (
        f"The input file s3://{USER_BUCKET}/in/batch.jsonl cannot be read (403)."
    )
    assert stack.environment["EXPECTED_BUCKET_OWNER"] == "123456789012"  # the deployment's own account
    assert http.post("/batches", json=tokenhub()).status_code == 202


def test_an_allowed_bucket_that_does_not_exist_is_400(http: httpx.Client) -> None:
    no_input = http.post("/batches", json=tokenhub(input_file_id=f"s3://{GHOST}/in.jsonl"))
    no_output = http.post("/batches", json=tokenhub(output_user_s3_path=f"s3://{GHOST}/out/"))
    assert error_of(no_input) == (400, "input_file_unavailable", "input_file_id")
    assert error_of(no_output) == (400, "output_path_unavailable", "output_user_s3_path")
    assert no_output.json()["error"]["message"] == "The output path cannot be used (404)."


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"input_file_id": f"s3://{OTHER_BUCKET}/in/batch.jsonl"}, "input_file_id"),  # exists, not allowed
        ({"input_file_id": "s3://batchinfer-user-nowhere/in/batch.jsonl"}, "input_file_id"),  # doesn't exist
        ({"output_user_s3_path": f"s3://{OTHER_BUCKET}/results/"}, "output_user_s3_path"),
    ],
)
def test_buckets_off_the_allowlist_are_403_whether_or_not_they_exist(
    http: httpx.Client, fields: dict[str, str], param: str
) -> None:
    response = http.post("/batches", json=tokenhub(**fields))
    assert error_of(response) == (403, "bucket_not_allowed", param)


def test_the_service_bucket_is_never_a_user_bucket(stack: LocalStack) -> None:
    data_bucket = stack.environment["BUCKET_NAME"]
    key = new_account("greedy", allowed_buckets=[f"s3://{data_bucket}", f"s3://{USER_BUCKET}"])
    with api_client(stack, key) as http:
        response = http.post("/batches", json=tokenhub(input_file_id=f"s3://{data_bucket}/files/anything"))
    assert error_of(response) == (403, "bucket_not_allowed", "input_file_id")


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"input_file_id": "s3://"}, (400, "invalid_path", "input_file_id")),
        (
            {"input_file_id": f"cos://{COS_BUCKET}.{COS_REGION}/in.jsonl"},
            (400, "invalid_path", "input_file_id"),
        ),
        ({"input_file_id": f"s3://{USER_BUCKET}/in/"}, (400, "invalid_path", "input_file_id")),
        ({"output_user_s3_path": None}, (400, "missing_required_parameter", "output_user_s3_path")),
        (
            {"output_user_cos_path": f"cos://{COS_BUCKET}.{COS_REGION}/x/"},
            (400, "invalid_parameter", "output_user_cos_path"),
        ),
        ({"input_source": "user_ftp"}, (400, "invalid_request", "input_source")),
        ({"completion_window": "169h"}, (400, "invalid_completion_window", "completion_window")),
    ],
)
def test_bad_tokenhub_parameters_are_400_naming_the_field(
    http: httpx.Client, fields: dict[str, Any], expected: tuple[int, str, str]
) -> None:
    body = {k: v for k, v in tokenhub(**fields).items() if v is not None}
    assert error_of(http.post("/batches", json=body)) == expected


def test_cos_paths_resolve_against_the_configured_endpoint(
    stack: LocalStack, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {
        "input_source": "user_cos",
        "input_file_id": f"cos://{COS_BUCKET}.{COS_REGION}/in.jsonl",
        "output_target": "user_cos",
        "output_user_cos_path": f"cos://{COS_BUCKET}.{COS_REGION}/out",
        "completion_window": "1h",
    }
    # Given a deployment without COS, cos:// paths are refused
    disabled = http.post("/batches", json=body)
    assert error_of(disabled) == (400, "invalid_path", "input_file_id")
    assert disabled.json()["error"]["message"] == (
        "input_file_id: cos:// paths are not enabled on this deployment (COS_ENDPOINT_URL is not set)"
    )
    # Given COS at an S3-compatible endpoint (here moto, path-style) with its own credentials in Secrets
    # Manager (here the local admin's key: the functions' roles may not touch that bucket), the input there
    stack.client("secretsmanager").create_secret(
        Name="batchinfer/cos",
        SecretString=json.dumps({"access_key_id": "testing", "secret_access_key": "testing"}),
    )
    cos = {
        "COS_ENDPOINT_URL": stack.moto_endpoint,
        "COS_ADDRESSING_STYLE": "path",
        "COS_CREDENTIALS_SECRET": "batchinfer/cos",
    }
    resets = ["batchinfer.core.settings.get_settings.cache_clear"]
    for name, value in cos.items():
        monkeypatch.setenv(name, value)  # this process writes the input
    get_settings.cache_clear()
    stack.configure_functions(cos, call=resets)
    locations.s3_client(f"cos:{COS_REGION}").put_object(Bucket=COS_BUCKET, Key="in.jsonl", Body=LINES)
    try:
        # When the batch is created with cos:// paths and runs
        created = http.post("/batches", json=body)
        assert created.status_code == 202, created.text
        batch = wait_for(http, created.json()["id"])
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        stack.configure_functions(
            {name: stack.environment[name] for name in cos if name in stack.environment},
            unset=[name for name in cos if name not in stack.environment],
            call=resets,
        )
    # Then its results are in the COS bucket, named by cos:// paths
    assert batch["status"] == "completed" and batch["expires_at"] - batch["created_at"] == 3600
    assert batch["output_file_id"] == f"cos://{COS_BUCKET}.{COS_REGION}/out/{batch['id']}/output.jsonl"
    assert batch["output_user_cos_path"] == f"cos://{COS_BUCKET}.{COS_REGION}/out"
    stored = stack.s3.get_object(Bucket=COS_BUCKET, Key=f"out/{batch['id']}/output.jsonl")["Body"].read()
    assert [json.loads(line)["custom_id"] for line in stored.splitlines()] == ["q-1", "q-2"]
    assert httpx.get(batch["output_file_url"], timeout=30).content == stored
    # With COS switched off again, the batch is still served (its paths, without download URLs)
    later = http.get(f"/batches/{batch['id']}").json()
    assert (later["output_file_id"], later["output_file_url"]) == (batch["output_file_id"], None)
