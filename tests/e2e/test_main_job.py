"""The main job end to end through the HTTP API of the local stack, on the real embedded model.

Upload a 3-line batch file, create the batch, poll until it is terminal, download the results:
every request has exactly one answer from SmolLM2, in input order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchinfer_local.client import BatchClient
from support.api_stack import new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(300), DEFAULT.mark]


@pytest.fixture(scope="module")
def client(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BatchClient]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("main-job")) as shared:
        yield BatchClient(f"{shared.stack.base_url}/v1", new_account("main-job"))


def test_a_three_line_batch_completes_with_real_answers(client: BatchClient, tmp_path: Path) -> None:
    # Given a 3-line batch file (one of them in Chinese)
    prompts = {"req-001": "你好,请介绍一下你自己", "req-002": "Name a colour.", "req-003": "What is 2 + 2?"}
    path = tmp_path / "batch.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": cid,
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "smollm2-135m-instruct",
                        "max_tokens": 12,
                        "temperature": 0,
                        "seed": 1,
                        "messages": [{"role": "user", "content": prompt}],
                    },
                },
                ensure_ascii=False,
            )
            + "\n"
            for cid, prompt in prompts.items()
        ),
        encoding="utf-8",
    )

    # When it is uploaded, created and waited for through the HTTP API
    uploaded = client.upload(path)
    created = client.create(uploaded["id"], metadata={"suite": "e2e"})
    batch = client.wait(created["id"], poll_s=0.5, timeout_s=240)

    # Then it is completed with one real answer per request
    assert created["status"] == "validating"
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert batch["error_file_id"] is None
    assert batch["metadata"] == {"suite": "e2e"}
    assert batch["created_at"] <= batch["in_progress_at"] <= batch["finalizing_at"] <= batch["completed_at"]
    lines = [json.loads(line) for line in client.content(batch["output_file_id"]).splitlines()]
    assert [line["custom_id"] for line in lines] == list(prompts)
    for line in lines:
        assert line["error"] is None
        assert line["id"].startswith("batch_req_")
        assert line["response"]["status_code"] == 200
        completion = line["response"]["body"]
        assert completion["object"] == "chat.completion"
        assert completion["model"] == "smollm2-135m-instruct"
        assert completion["choices"][0]["message"]["content"].strip() != ""
        usage = completion["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert 0 < usage["completion_tokens"] <= 12
    assert batch["usage"]["output_tokens"] == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in lines
    )


def test_a_create_retried_with_the_same_idempotency_key_returns_the_first_batch(
    client: BatchClient, tmp_path: Path
) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text(
        json.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "smollm2-135m-instruct",
                    "max_tokens": 2,
                    "messages": [{"role": "user", "content": "Hi"}],
                },
            }
        )
        + "\n"
    )
    body = {
        "input_file_id": client.upload(path)["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    first = client.http.post("/batches", json=body, headers={"Idempotency-Key": "retry-7"})
    second = client.http.post("/batches", json=body, headers={"Idempotency-Key": "retry-7"})
    other = client.http.post("/batches", json=body, headers={"Idempotency-Key": "retry-8"})
    assert (first.status_code, second.status_code, other.status_code) == (200, 200, 200)
    assert second.json()["id"] == first.json()["id"] != other.json()["id"]
    listed = [b["id"] for b in client.http.get("/batches", params={"limit": 100}).json()["data"]]
    assert listed.count(first.json()["id"]) == 1
    bad = client.http.post("/batches", json=body, headers={"Idempotency-Key": "x" * 256})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "Idempotency-Key")
    for batch_id in (first.json()["id"], other.json()["id"]):
        assert client.wait(batch_id, poll_s=0.5, timeout_s=120)["status"] == "completed"
