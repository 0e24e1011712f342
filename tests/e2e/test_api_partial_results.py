"""Cancel and expiry while requests run, through the HTTP API of the local stack.

Finished results are kept in output.jsonl; every request that never ran becomes one error.jsonl line
with `error.code` `batch_cancelled` / `batch_expired` (OpenAI Batch API semantics); every input line
is in exactly one of the two files and `request_counts.total == completed + failed`.
One request per shard, served by a `HoldableUpstream`: a `HOLD` prompt keeps its shard running until
the test releases it, so the moment of the cancel (or expiry) is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from batchinfer.data import batches
from batchinfer.data.items import BatchChanges
from batchinfer.data.table import now
from batchinfer.pipeline.sweep import sweep
from batchinfer_local import LocalStack
from support.api_stack import (
    SCRIPTED,
    HoldableUpstream,
    api_client,
    chat_line,
    create,
    jsonl,
    result_lines,
    stack_with_upstream,
    upload,
    wait_for,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, HoldableUpstream]]:
    with stack_with_upstream(
        tmp_path_factory.mktemp("registry"), parameter_overrides={"ShardSize": "1"}
    ) as pair:
        yield pair


@pytest.fixture
def http(running: tuple[LocalStack, HoldableUpstream]) -> Iterator[httpx.Client]:
    stack, upstream = running
    upstream.rearm()
    with api_client(stack, stack.api_key) as client:
        yield client
    upstream.release()
    stack.wait_idle(60)


PROMPTS = {"r1": "first", "r2": "second", "r3": "HOLD third", "r4": "fourth"}


def start_and_hold(
    http: httpx.Client, upstream: HoldableUpstream, tag: str
) -> tuple[dict[str, Any], list[str]]:
    """Create a 4-request batch and wait until its HOLD request is running and the other three have
    committed; (batch, ids that finished). The stack runs the four shards at once (MaxShardWorkers)."""
    lines = [chat_line(cid, f"{tag} {prompt}", model=SCRIPTED) for cid, prompt in PROMPTS.items()]
    batch = create(http, upload(http, jsonl(*lines))).json()
    finished = [cid for cid, prompt in PROMPTS.items() if "HOLD" not in prompt]
    wait_until(upstream.held.is_set, what="the HOLD request")
    wait_until(
        lambda: http.get(f"/batches/{batch['id']}").json()["request_counts"]["completed"] == len(finished),
        what="the other requests' commits",
    )
    current = http.get(f"/batches/{batch['id']}").json()
    assert current["status"] == "in_progress"
    assert current["request_counts"] == {"total": 4, "completed": len(finished), "failed": 0}
    assert upstream.held.is_set()  # still running
    return batch, finished


def check_results(http: httpx.Client, batch: dict[str, Any], finished: list[str], code: str) -> None:
    output = result_lines(http, batch["output_file_id"])
    errors = result_lines(http, batch["error_file_id"])
    assert [line["custom_id"] for line in output] == finished
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
    never_ran = [cid for cid in PROMPTS if cid not in finished]
    assert [line["custom_id"] for line in errors] == never_ran
    for line in errors:
        assert line["response"] is None
        assert line["error"]["code"] == code
    # Every input line in exactly one file, and the counts agree.
    assert sorted(line["custom_id"] for line in output + errors) == sorted(PROMPTS)
    assert batch["request_counts"] == {"total": 4, "completed": len(finished), "failed": len(never_ran)}


def test_cancel_keeps_finished_results_and_cancels_the_rest(
    running: tuple[LocalStack, HoldableUpstream], http: httpx.Client
) -> None:
    stack, upstream = running
    # Given a batch whose third request is running
    batch, finished = start_and_hold(http, upstream, "cancel")

    # When it is cancelled (twice)
    first = http.post(f"/batches/{batch['id']}/cancel")
    second = http.post(f"/batches/{batch['id']}/cancel")
    ended = wait_for(http, batch["id"], {"cancelled"})
    upstream.release()
    stack.wait_idle(60)

    # Then cancelling -> cancelled; both cancels answer 200; the held answer, arriving late, changes nothing
    assert first.status_code == 200 and first.json()["status"] == "cancelling"
    assert second.status_code == 200 and second.json()["status"] in ("cancelling", "cancelled")
    assert first.json()["cancelling_at"] is not None
    assert http.get(f"/batches/{batch['id']}").json() == ended
    assert ended["cancelled_at"] >= ended["cancelling_at"]
    check_results(http, ended, finished, "batch_cancelled")
    # Cancelling a cancelled batch answers the batch as it is.
    late = http.post(f"/batches/{batch['id']}/cancel")
    assert late.status_code == 200 and late.json()["status"] == "cancelled"


def test_expiry_keeps_finished_results_and_expires_the_rest(
    running: tuple[LocalStack, HoldableUpstream], http: httpx.Client
) -> None:
    stack, upstream = running
    # Given a batch whose third request is running, past its expires_at
    batch, finished = start_and_hold(http, upstream, "expiry")
    assert batches.update(batch["id"], BatchChanges(expires_at=now() - 1))

    # When the sweeper runs
    actions = sweep()
    ended = wait_for(http, batch["id"], {"expired"})
    upstream.release()
    stack.wait_idle(60)

    # Then the batch is expired with the finished results kept
    assert actions["expired"] == 1
    assert ended["expired_at"] is not None and ended["finalizing_at"] is not None
    assert http.get(f"/batches/{batch['id']}").json()["request_counts"] == ended["request_counts"]
    check_results(http, ended, finished, "batch_expired")
    cancel = http.post(f"/batches/{batch['id']}/cancel")
    assert cancel.status_code == 409
    assert cancel.json()["error"]["code"] == "batch_not_cancellable"


def test_completed_batch_with_failures_has_every_line_once(
    running: tuple[LocalStack, HoldableUpstream], http: httpx.Client
) -> None:
    # Given requests of which two fail at the model (HTTP 400 from the upstream)
    prompts = {"a": "one", "b": "FAIL two", "c": "three", "d": "FAIL four", "e": "five"}
    data = jsonl(*[chat_line(cid, prompt, model=SCRIPTED) for cid, prompt in prompts.items()])

    # When the batch runs to the end
    batch = wait_for(http, create(http, upload(http, data)).json()["id"])

    # Then it completes; successes in output.jsonl, failures in error.jsonl, each line once
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 5, "completed": 3, "failed": 2}
    assert batch["usage"]["input_tokens"] == 9 and batch["usage"]["output_tokens"] == 6
    output, errors = result_lines(http, batch["output_file_id"]), result_lines(http, batch["error_file_id"])
    assert [line["custom_id"] for line in output] == ["a", "c", "e"]
    assert [line["custom_id"] for line in errors] == ["b", "d"]
    for line in errors:
        assert line["error"] is None
        assert line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["code"] == "scripted"
