"""The retry of a batch's failed lines with the official `openai` SDK, after a model server refused some
lines for a while: `scripted-model` on the holdable upstream (support/api_stack.py) refuses its `FAIL`
prompts until the test lets it answer them, as an overloaded server recovers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from openai.types import Batch

from batchinfer_local import LocalStack
from batchinfer_local.cli.steering import merged
from batchinfer_local.client import BatchClient
from support.api_stack import SCRIPTED, TERMINAL, HoldableUpstream, chat_line, jsonl, new_account
from support.stacks import UPSTREAM, SharedStacks

pytestmark = [pytest.mark.timeout(240), UPSTREAM.mark]


@pytest.fixture(scope="module")
def running(
    shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalStack, HoldableUpstream]]:
    with shared_stacks.lease(UPSTREAM, tmp_path_factory.mktemp("openai-sdk-retry")) as shared:
        yield shared.stack, shared.upstream


def wait(client: OpenAI, batch_id: str) -> Batch:
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch_id)).status not in TERMINAL:
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}"
        time.sleep(0.3)
    return batch


def test_a_retry_after_the_server_recovered_answers_every_line_once(
    running: tuple[LocalStack, HoldableUpstream], tmp_path: Path
) -> None:
    stack, upstream = running
    key = new_account("openai-sdk-retry")
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    # Given a batch of which the server refused two lines
    prompts = {"a": "one", "b": "FAIL two", "c": "three", "d": "FAIL four"}
    lines = [chat_line(custom_id, prompt, model=SCRIPTED) for custom_id, prompt in prompts.items()]
    path = tmp_path / "batch.jsonl"
    path.write_bytes(jsonl(*lines))
    file_id = client.files.create(file=path.open("rb"), purpose="batch").id
    first = wait(
        client,
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id,
    )
    assert (first.status, first.request_counts.completed, first.request_counts.failed) == ("completed", 2, 2)

    # When the server has recovered and the retry is asked twice
    upstream.failing = False
    retry = client.post(f"/batches/{first.id}/retry", cast_to=Batch)
    again = client.post(f"/batches/{first.id}/retry", cast_to=Batch)

    # Then one batch runs exactly the refused lines, and answers them
    assert again.id == retry.id
    assert retry.metadata == {"retry_of": first.id}
    assert client.files.content(retry.input_file_id).read() == jsonl(lines[1], lines[3])
    done = wait(client, retry.id)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 2, 0)
    # And the merged results hold one answer per custom_id, each the server's answer to its prompt
    data, retries = merged(BatchClient(f"{stack.base_url}/v1", key), first.to_dict())
    answers = {
        line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
        for line in map(json.loads, data.splitlines())
    }
    assert retries == 1
    assert answers == {custom_id: f"echo: {prompt}" for custom_id, prompt in prompts.items()}
