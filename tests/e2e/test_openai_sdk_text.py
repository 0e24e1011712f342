"""`/v1/completions` and `/v1/responses` batches with the official `openai` SDK on the shared default
stack (the embedded model): each batch's result bodies parse as the SDK's own `Completion` and
`Response`, and its usage counts the tokens of its lines."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from openai.types import Batch, Completion
from openai.types.responses import Response

from batchinfer_local import LocalStack
from support.api_stack import MODEL, jsonl, new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(180), DEFAULT.mark]
LINES = {
    "/v1/completions": [
        {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0},
        {"model": MODEL, "prompt": ["Once upon a time", "The sky is"], "max_tokens": 8, "temperature": 0},
    ],
    "/v1/responses": [
        {"model": MODEL, "input": "Say hello.", "max_output_tokens": 8, "temperature": 0},
        {
            "model": MODEL,
            "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}],
            "max_output_tokens": 8,
            "temperature": 0,
            "metadata": {"n": "2"},
        },
    ],
}


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("openai-sdk-text")) as shared:
        yield shared.stack


@pytest.fixture(scope="module")
def client(stack: LocalStack) -> OpenAI:
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=new_account("openai-sdk-text"), max_retries=0)


@pytest.fixture(scope="module")
def created(client: OpenAI, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Batch]:
    """One batch per endpoint, both created before either is awaited (they run side by side)."""
    batches = {}
    for endpoint, bodies in LINES.items():
        path = Path(tmp_path_factory.mktemp("in")) / "batch.jsonl"
        path.write_bytes(
            jsonl(
                *[
                    json.dumps({"custom_id": f"l{i}", "method": "POST", "url": endpoint, "body": body})
                    for i, body in enumerate(bodies, start=1)
                ]
            )
        )
        uploaded = client.files.create(file=path.open("rb"), purpose="batch")
        batches[endpoint] = client.batches.create(
            input_file_id=uploaded.id,
            endpoint=endpoint,  # type: ignore[arg-type]  (the SDK lists the endpoints it knows)
            completion_window="24h",
        )
    return batches


def finished(client: OpenAI, batch: Batch) -> tuple[Batch, list[dict[str, Any]]]:
    """The batch once it ended, and its result bodies in custom_id order."""
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status not in {
        "completed",
        "failed",
        "expired",
        "cancelled",
    }:
        assert time.monotonic() < deadline, f"{batch.id} still {batch.status}"
        time.sleep(0.2)
    assert batch.status == "completed" and batch.output_file_id is not None, batch.errors
    lines = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    return batch, [line["response"]["body"] for line in sorted(lines, key=lambda line: line["custom_id"])]


def test_a_completions_batch_gives_sdk_completions_one_choice_per_prompt(
    client: OpenAI, created: dict[str, Batch]
) -> None:
    batch, bodies = finished(client, created["/v1/completions"])

    completions = [Completion.model_validate(body) for body in bodies]
    assert [len(c.choices) for c in completions] == [1, 2]
    assert [choice.index for choice in completions[1].choices] == [0, 1]
    assert completions[0].choices[0].text == " 4, 5, 6"
    assert {(c.object, c.model) for c in completions} == {("text_completion", MODEL)}
    assert all(c.usage is not None and c.usage.completion_tokens <= 16 for c in completions)
    assert batch.usage is not None
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (
        sum(c.usage.prompt_tokens for c in completions if c.usage),
        sum(c.usage.completion_tokens for c in completions if c.usage),
    )


def test_a_responses_batch_gives_sdk_responses_and_counts_their_tokens(
    client: OpenAI, created: dict[str, Batch]
) -> None:
    batch, bodies = finished(client, created["/v1/responses"])

    responses = [Response.model_validate(body) for body in bodies]
    assert [(r.object, r.model) for r in responses] == [("response", MODEL)] * 2
    assert all(r.output_text and r.usage is not None and r.usage.output_tokens <= 8 for r in responses)
    assert (responses[1].instructions, responses[1].metadata) == ("Be brief.", {"n": "2"})
    assert batch.usage is not None
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (
        sum(r.usage.input_tokens for r in responses if r.usage),
        sum(r.usage.output_tokens for r in responses if r.usage),
    )
    assert batch.usage.input_tokens > 0
