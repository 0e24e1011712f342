"""The official `openai` Python SDK against the local stack, changing nothing but the base URL and key.

Drives the whole batch flow (files, uploads, batches: create, retrieve, list with paging, cancel,
result content) on the real embedded model and parses everything with the SDK's own types.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion

from batchinfer_local import LocalStack
from support.api_stack import chat_line, jsonl, new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(180), DEFAULT.mark]
TERMINAL = {"completed", "failed", "expired", "cancelled"}
PROMPTS = {"greet": "Say hello.", "count": "Count to three.", "color": "Name a colour."}


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # IAM as strict as AWS, whatever BATCHINFER_LOCAL_IAM says (DEFAULT.iam)
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("openai-sdk")) as shared:
        yield shared.stack


@pytest.fixture(scope="module")
def client(stack: LocalStack) -> OpenAI:
    # The module's own account on the shared stack: its files and batches only.
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=new_account("openai-sdk"), max_retries=0)


def wait(client: OpenAI, batch_id: str, timeout: float = 120.0) -> tuple[Batch, list[Batch]]:
    """Retrieve until terminal: (the final batch, every batch seen on the way)."""
    seen, deadline = [], time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        seen.append(batch)
        if batch.status in TERMINAL:
            return batch, seen
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}"
        time.sleep(0.2)


def test_the_whole_batch_flow_with_the_openai_sdk(client: OpenAI, tmp_path) -> None:
    # Given an input file uploaded with files.create
    path = tmp_path / "batch.jsonl"
    path.write_bytes(jsonl(*[chat_line(cid, prompt, max_tokens=3) for cid, prompt in PROMPTS.items()]))
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    assert isinstance(uploaded, FileObject)
    assert (uploaded.purpose, uploaded.filename, uploaded.bytes) == (
        "batch",
        "batch.jsonl",
        path.stat().st_size,
    )
    assert client.files.retrieve(uploaded.id) == uploaded

    # When a batch is created and retrieved until it ends
    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "sdk"},
    )
    batch, seen = wait(client, created.id)

    # Then it is completed, with live counts on the way and one SDK-typed completion per request
    assert created.status == "validating" and created.metadata == {"run": "sdk"}
    assert batch.status == "completed" and batch.model == "smollm2-135m-instruct"
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert all(b.request_counts.total in (0, 3) and b.request_counts.completed <= 3 for b in seen)
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.expires_at == batch.created_at + 24 * 3600
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens > 0
    assert batch.error_file_id is None and batch.errors is None
    content = client.files.content(batch.output_file_id)
    lines = [json.loads(line) for line in content.text.splitlines()]
    assert [line["custom_id"] for line in lines] == list(PROMPTS)
    for line in lines:
        assert line["error"] is None and line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == "smollm2-135m-instruct"
        assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 3
    output_file = client.files.retrieve(batch.output_file_id)
    assert (output_file.purpose, output_file.bytes) == ("batch_output", len(content.content))

    # And a batch cancelled while validating answers 200 and ends cancelled within seconds (the cancel's
    # own FinalizeQueue message, which the API function's role may send: the sweeper would take 5 minutes),
    # and a terminal one can't be cancelled
    doomed = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="1h"
    )
    answer = client.batches.with_raw_response.cancel(doomed.id)
    cancelling = answer.parse()
    cancelled, _ = wait(client, doomed.id, timeout=30)
    assert answer.status_code == 200
    assert cancelling.status == "cancelling" and cancelled.status == "cancelled"
    assert (
        cancelled.request_counts.total == cancelled.request_counts.completed + cancelled.request_counts.failed
    )
    with pytest.raises(openai.ConflictError) as conflict:
        client.batches.cancel(batch.id)
    assert conflict.value.code == "batch_not_cancellable"

    # And batches.list pages newest first
    third = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    first_page = client.batches.list(limit=2)
    assert [b.id for b in first_page.data] == [third.id, doomed.id] and first_page.has_more
    assert [b.id for b in first_page.get_next_page().data] == [created.id]
    assert [b.id for b in client.batches.list(limit=1)] == [third.id, doomed.id, created.id]  # auto-paging
    client.batches.cancel(third.id)
    wait(client, third.id)


def test_a_large_file_goes_through_a_presigned_upload(client: OpenAI) -> None:
    # Given an Upload announced with the SDK
    data = jsonl(*[chat_line(f"id-{n}", "x" * 200) for n in range(50)])
    upload = client.uploads.create(
        bytes=len(data), filename="big.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    assert upload.status == "pending" and upload.file is None
    extra = upload.model_extra or {}

    # When the bytes are PUT to its presigned URL and the upload is completed
    put = httpx.put(extra["upload_url"], content=data, headers=extra["upload_headers"], timeout=30)
    done = client.uploads.complete(upload.id, part_ids=[])

    # Then the file exists with exactly those bytes
    assert put.status_code == 200
    assert done.status == "completed" and done.file is not None
    assert (done.file.bytes, done.file.filename, done.file.purpose) == (len(data), "big.jsonl", "batch")
    assert client.files.content(done.file.id).content == data
    assert client.uploads.complete(upload.id, part_ids=[]).file == done.file  # completing twice is harmless


def test_files_list_pages_and_delete(client: OpenAI) -> None:
    ids = [client.files.create(file=(f"f{n}.jsonl", b"{}\n"), purpose="batch").id for n in range(3)]
    newest = client.files.list(limit=2, purpose="batch")
    assert [f.id for f in newest.data] == ids[::-1][:2] and newest.has_more
    assert [f.id for f in client.files.list(limit=2, order="asc", after=ids[0])] == ids[1:]
    deleted = client.files.delete(ids[0])
    assert (deleted.id, deleted.deleted) == (ids[0], True)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(ids[0])
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=str(client.base_url), api_key="sk-wrong", max_retries=0).files.list()


def test_output_expires_after_sets_the_result_files_expiry_and_the_sweeper_may_delete_them(
    client: OpenAI, stack: LocalStack
) -> None:
    # Given a batch created with the SDK's output_expires_after, unchanged
    uploaded = client.files.create(
        file=("in.jsonl", jsonl(chat_line("e-1", "Say hi.", max_tokens=2))), purpose="batch"
    )
    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )

    # When it completes
    batch, _ = wait(client, created.id)

    # Then its output file expires an hour after the batch was created
    assert batch.status == "completed"
    output = client.files.retrieve(batch.output_file_id)
    assert output.expires_at == created.created_at + 3600
    assert client.files.retrieve(uploaded.id).expires_at is None  # the input is the user's: kept
    # And the sweeper's own role may delete it (what pipeline.retention does once it is due)
    bucket = stack.buckets["DataBucket"]
    key = f"batches/{batch.id}/output.jsonl"
    stack.function_client("SweeperFunction", "s3").delete_object(Bucket=bucket, Key=key)
    assert stack.s3.list_objects_v2(Bucket=bucket, Prefix=key)["KeyCount"] == 0


@pytest.mark.parametrize(
    "value, message",
    [
        (
            {"anchor": "created_at", "seconds": 60},
            "output_expires_after.seconds: Input should be greater than or equal to 3600",
        ),
        (
            {"anchor": "completed_at", "seconds": 3600},
            "output_expires_after.anchor: Input should be 'created_at'",
        ),
    ],
)
def test_output_expires_after_outside_openais_rules_is_a_400(
    client: OpenAI, value: dict, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.batches.create(
            input_file_id="file-000000000000000000000000",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            output_expires_after=value,  # type: ignore[arg-type]
        )
    assert raised.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": message.split(":")[0],
        "code": "invalid_request",
    }
