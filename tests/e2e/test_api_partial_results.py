"""Cancel and expiry while requests run, through the HTTP API of the local stack.

Work in flight finishes and is kept: a cancelled batch stays `cancelling` while its workers' requests
at the model finish (within `CANCEL_GRACE_SECONDS`), then ends `cancelled` with every answer in
output.jsonl (OpenAI Batch API semantics); a request still at the model when the grace ends is an
error line `batch_cancelled_in_flight`; every input line is in exactly one of the two files and
`request_counts.total == completed + failed`. One request per shard, served by a
`HoldableUpstream`: a `HOLD` prompt keeps its shard running until the test releases it, so the
moment of the cancel (or expiry) is exact.
"""

from __future__ import annotations

import time
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
    upload,
    wait_for,
    wait_until,
)
from support.stacks import ONE_LINE_SHARDS, SharedStacks

pytestmark = [pytest.mark.timeout(120), ONE_LINE_SHARDS.mark]
GRACE_S = 4


@pytest.fixture(scope="module")
def running(
    shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalStack, HoldableUpstream]]:
    with shared_stacks.lease(
        ONE_LINE_SHARDS, tmp_path_factory.mktemp("registry"), {"CANCEL_GRACE_SECONDS": str(GRACE_S)}
    ) as shared:
        yield shared.stack, shared.upstream


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


def check_results(
    http: httpx.Client, batch: dict[str, Any], answered: list[str], errors: dict[str, str]
) -> None:
    """`answered` ids in output.jsonl (status 200), the `errors` ids in error.jsonl with their codes, in
    input order, each line once, counts agreeing."""
    output = result_lines(http, batch["output_file_id"])
    failed = result_lines(http, batch["error_file_id"])
    assert [line["custom_id"] for line in output] == answered
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
    assert {line["custom_id"]: line["error"]["code"] for line in failed} == errors
    assert all(line["response"] is None for line in failed)
    assert sorted(line["custom_id"] for line in output + failed) == sorted(PROMPTS)
    assert batch["request_counts"] == {"total": 4, "completed": len(answered), "failed": len(errors)}


def test_cancel_waits_for_the_request_in_flight_and_keeps_its_answer(
    running: tuple[LocalStack, HoldableUpstream], http: httpx.Client
) -> None:
    stack, upstream = running
    # Given a batch whose third request is running
    batch, _ = start_and_hold(http, upstream, "cancel")

    # When it is cancelled (twice), and its held request answers within the grace
    first = http.post(f"/batches/{batch['id']}/cancel")
    second = http.post(f"/batches/{batch['id']}/cancel")
    time.sleep(1.0)  # five progress intervals: every worker knows
    during = http.get(f"/batches/{batch['id']}").json()
    upstream.release()
    ended = wait_for(http, batch["id"], {"cancelled"})
    stack.wait_idle(60)

    # Then it stayed `cancelling` while the request was at the model, and its answer is kept
    assert first.status_code == 200 and first.json()["status"] == "cancelling"
    assert second.status_code == 200 and second.json()["status"] == "cancelling"
    assert during["status"] == "cancelling"
    assert first.json()["cancelling_at"] is not None
    assert http.get(f"/batches/{batch['id']}").json() == ended
    assert ended["cancelled_at"] >= ended["cancelling_at"]
    check_results(http, ended, list(PROMPTS), {})
    assert sorted(upstream.arrivals) == sorted(f"cancel {prompt}" for prompt in PROMPTS.values())
    # Cancelling a cancelled batch answers the batch as it is.
    late = http.post(f"/batches/{batch['id']}/cancel")
    assert late.status_code == 200 and late.json()["status"] == "cancelled"


def test_cancel_cuts_a_request_still_running_after_the_grace(
    running: tuple[LocalStack, HoldableUpstream], http: httpx.Client
) -> None:
    _, upstream = running
    # Given a batch whose third request is running and never answers
    batch, finished = start_and_hold(http, upstream, "cut")

    # When it is cancelled
    started = time.monotonic()
    http.post(f"/batches/{batch['id']}/cancel").raise_for_status()
    ended = wait_for(http, batch["id"], {"cancelled"})

    # Then the batch ends once the grace ran out, that request's line saying so
    assert time.monotonic() - started >= GRACE_S
    check_results(http, ended, finished, {"r3": "batch_cancelled_in_flight"})
    line = result_lines(http, ended["error_file_id"])[0]
    assert "did not finish within the cancel grace" in line["error"]["message"]


def test_expiry_waits_for_the_request_in_flight_and_keeps_its_answer(
    running: tuple[LocalStack, HoldableUpstream], http: httpx.Client
) -> None:
    stack, upstream = running
    # Given a batch whose third request is running, past its expires_at
    batch, _ = start_and_hold(http, upstream, "expiry")
    assert batches.update(batch["id"], BatchChanges(expires_at=now() - 1))

    # When the sweeper runs, and the held request answers
    actions = sweep()
    time.sleep(1.0)
    during = http.get(f"/batches/{batch['id']}").json()
    upstream.release()
    ended = wait_for(http, batch["id"], {"expired"})
    stack.wait_idle(60)

    # Then the batch waited for it and is expired with every answer kept
    assert actions["expired"] == 1
    assert during["status"] == "finalizing"
    assert ended["expired_at"] is not None and ended["finalizing_at"] is not None
    assert http.get(f"/batches/{batch['id']}").json()["request_counts"] == ended["request_counts"]
    check_results(http, ended, list(PROMPTS), {})
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
