"""Steering a batch with the official `openai` SDK on the local stack (the real embedded model): a dry
run through `extra_body`, the retry of the failed lines and the output read while the batch runs,
the extension routes called with the SDK's own `post` / `get`.

The failing lines fail at the model: a prompt longer than the model's context passes validation (the
worker answers it, `validation.file`) and the embedded backend refuses it, the same way every time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types import Batch

from batchinfer_local import LocalStack
from batchinfer_local.cli.steering import merged
from batchinfer_local.client import BatchClient
from support.api_stack import TERMINAL, chat_line, jsonl, new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(240), DEFAULT.mark]
ACCOUNT = "openai-sdk-steering"
# Over the default registry's 2,048-token context: refused at the model (context_length_exceeded).
TOO_LONG = "word " * 2500


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("openai-sdk-steering")) as shared:
        yield shared.stack


@pytest.fixture(scope="module")
def key(stack: LocalStack) -> str:
    # At most one active batch: a dry run must neither count against it nor be refused by it.
    return new_account(ACCOUNT, max_active_batches=1)


@pytest.fixture(scope="module")
def client(stack: LocalStack, key: str) -> OpenAI:
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)


def upload(client: OpenAI, tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(jsonl(*lines))
    return client.files.create(file=path.open("rb"), purpose="batch").id


def dry_run(client: OpenAI, file_id: str) -> dict[str, Any]:
    answer = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"dry_run": True},
    )
    return answer.to_dict()


def output_page(client: OpenAI, batch_id: str, after: int = 0) -> httpx.Response:
    return client.get(
        f"/batches/{batch_id}/output", cast_to=httpx.Response, options={"params": {"after": after}}
    )


def wait(client: OpenAI, batch_id: str, during: Any = None) -> Batch:
    """Retrieve until terminal, calling `during(batch)` at each look while it runs."""
    deadline = time.monotonic() + 150
    while (batch := client.batches.retrieve(batch_id)).status not in TERMINAL:
        if during is not None:
            during(batch)
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}"
        time.sleep(0.3)
    return batch


def content(client: OpenAI, file_id: str | None) -> bytes:
    return client.files.content(file_id).read() if file_id else b""


def test_a_dry_run_lists_every_error_and_queues_nothing(client: OpenAI, tmp_path: Path) -> None:
    # Given a file with errors on lines 2 and 4
    bad = upload(client, tmp_path, chat_line("a", "Hi."), "{oops", "", chat_line("a", "Hi again."))
    before = client.batches.list().data
    # When it is dry-run
    answer = dry_run(client, bad)
    # Then every error is listed, and no batch was created
    assert answer["object"] == "batch.dry_run" and answer["valid"] is False
    assert [(e["line"], e["code"]) for e in answer["errors"]["data"]] == [
        (2, "invalid_json_line"),
        (4, "duplicate_custom_id"),
    ]
    assert client.batches.list().data == before


def test_a_dry_run_counts_the_prompt_tokens_the_run_reports(client: OpenAI, tmp_path: Path) -> None:
    # Given a valid file
    lines = [chat_line(f"r{n}", text, max_tokens=4) for n, text in enumerate(("Hi.", "Name a colour."))]
    file_id = upload(client, tmp_path, *lines)
    # When it is dry-run, then run (the account's one active slot is free: the dry run took none)
    answer = dry_run(client, file_id)
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait(client, batch.id)
    # Then the dry run's input tokens are what the run reports, within 1%
    reported = sum(
        json.loads(line)["response"]["body"]["usage"]["prompt_tokens"]
        for line in content(client, done.output_file_id).splitlines()
    )
    assert answer["valid"] is True
    assert answer["usage"]["input_tokens_method"] == "tokenizer"
    assert answer["usage"]["output_tokens"] == 8
    assert abs(answer["usage"]["input_tokens"] - reported) <= reported / 100
    assert answer["estimated_cost"]["currency"] == "USD"


def test_a_retry_runs_the_failed_lines_and_merges_into_one_answer_each(
    stack: LocalStack, client: OpenAI, key: str, tmp_path: Path
) -> None:
    # Given a batch whose second line failed at the model
    lines = [chat_line("a", "Hi."), chat_line("b", TOO_LONG), chat_line("c", "Bye.")]
    first = client.batches.create(
        input_file_id=upload(client, tmp_path, *lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "steering"},
    )
    done = wait(client, first.id)
    assert done.request_counts.failed == 1
    # When its retry is asked twice
    retry = client.post(f"/batches/{first.id}/retry", cast_to=Batch)
    again = client.post(f"/batches/{first.id}/retry", cast_to=Batch)
    # Then one batch runs exactly the failed line, linked to the original
    assert again.id == retry.id
    assert retry.metadata == {"run": "steering", "retry_of": first.id}
    assert client.files.content(retry.input_file_id).read() == jsonl(lines[1])
    wait(client, retry.id)
    # And the merged results hold one line per custom_id
    data, retries = merged(BatchClient(f"{stack.base_url}/v1", key), done.to_dict())
    assert retries == 1
    assert sorted(json.loads(line)["custom_id"] for line in data.splitlines()) == ["a", "b", "c"]


def test_output_read_while_the_batch_runs_grows_and_is_the_final_files(
    client: OpenAI, tmp_path: Path
) -> None:
    # Given a batch of six short requests
    lines = [chat_line(f"r{n}", f"Say the number {n}.", max_tokens=8) for n in range(6)]
    batch = client.batches.create(
        input_file_id=upload(client, tmp_path, *lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    # When its output is read at every look while it runs
    reads: list[bytes] = []
    done = wait(client, batch.id, lambda _: reads.append(output_page(client, batch.id).content))
    # Then each read begins the next one and the final output.jsonl, byte for byte
    final = content(client, done.output_file_id)
    assert len(reads) >= 3
    for earlier, later in zip(reads, [*reads[1:], final], strict=True):
        assert later.startswith(earlier)
    assert final.count(b"\n") == 6
    last = output_page(client, batch.id, after=4)
    assert last.content == b"".join(final.splitlines(keepends=True)[4:])
    assert last.headers["x-batchinfer-complete"] == "true"
