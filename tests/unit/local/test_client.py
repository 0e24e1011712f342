"""`BatchClient` (local/batchinfer_local/client.py) against a scripted HTTP answer: a 5xx is retried
after its Retry-After with the same Idempotency-Key unless it says `x-should-retry: false`; 4xx errors
are not retried."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from batchinfer_local.client import UNAVAILABLE_ATTEMPTS, ApiError, BatchClient

UNAVAILABLE = httpx.Response(
    503,
    headers={"Retry-After": "1"},
    json={"error": {"message": "retry", "type": "server_error", "code": "service_unavailable"}},
)


def scripted(answers: list[httpx.Response], seen: list[httpx.Request]) -> BatchClient:
    def answer(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return answers.pop(0)

    batch_client = BatchClient("http://api/v1", "key")
    batch_client.http = httpx.Client(base_url="http://api/v1", transport=httpx.MockTransport(answer))
    return batch_client


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds slept between attempts (tenacity's default sleep is `time.sleep`), not slept."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return slept


def test_a_503_is_retried_after_its_retry_after_with_the_same_idempotency_key(
    waits: list[float], tmp_path: Path
) -> None:
    seen: list[httpx.Request] = []
    created = {"id": "batch_1", "status": "validating"}
    batch_client = scripted([UNAVAILABLE, UNAVAILABLE, httpx.Response(200, json=created)], seen)

    assert batch_client.create("file-1") == created
    assert waits == [1.0, 1.0]
    keys = [request.headers["Idempotency-Key"] for request in seen]
    assert len(keys) == 3 and len(set(keys)) == 1
    assert [json.loads(request.content)["input_file_id"] for request in seen] == ["file-1"] * 3


def test_an_upload_retried_sends_its_bytes_again(waits: list[float], tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"custom_id": "a"}\n')
    seen: list[httpx.Request] = []
    batch_client = scripted([UNAVAILABLE, httpx.Response(200, json={"id": "file-1"})], seen)

    assert batch_client.upload(path) == {"id": "file-1"}
    assert [request.content.count(b'{"custom_id": "a"}\n') for request in seen] == [1, 1]
    assert seen[0].headers["Idempotency-Key"] == seen[1].headers["Idempotency-Key"]


def test_503s_past_the_attempts_and_other_errors_raise(waits: list[float]) -> None:
    seen: list[httpx.Request] = []
    batch_client = scripted([UNAVAILABLE] * UNAVAILABLE_ATTEMPTS, seen)
    with pytest.raises(ApiError) as unavailable:
        batch_client.retrieve("batch_1")
    assert (unavailable.value.status, unavailable.value.retry_after, len(seen)) == (503, 1.0, 5)

    seen.clear()
    bad = httpx.Response(400, json={"error": {"message": "bad", "code": "invalid_request"}})
    batch_client = scripted([bad], seen)
    with pytest.raises(ApiError) as refused:
        batch_client.retrieve("batch_1")
    assert (refused.value.status, refused.value.code, len(seen)) == (400, "invalid_request", 1)

    seen.clear()
    final = httpx.Response(500, headers={"x-should-retry": "false"}, json={"error": {"message": "no"}})
    batch_client = scripted([final], seen)
    with pytest.raises(ApiError) as failed:
        batch_client.retrieve("batch_1")
    assert (failed.value.status, failed.value.should_retry, len(seen)) == (500, False, 1)


@pytest.mark.parametrize("status", [500, 502, 504])
def test_a_failed_invocation_is_retried_as_the_openai_sdk_does(waits: list[float], status: int) -> None:
    """API Gateway's 500 (a function that failed or timed out), 502 and 504: a GET is tried again."""
    seen: list[httpx.Request] = []
    failed = httpx.Response(status, json={"message": "Internal Server Error"})
    batch = {"id": "batch_1", "status": "in_progress"}
    batch_client = scripted([failed, httpx.Response(200, json=batch)], seen)

    assert batch_client.retrieve("batch_1") == batch
    assert (waits, len(seen)) == ([1.0], 2)
