"""A batch seen while it runs, and cancelled or expired mid-run, on the real embedded model through the
HTTP API of the local stack.

- GET shows requests as they finish (the shard workers' live progress, published once per
  `PROGRESS_SECONDS`, default 1 s, 0.25 s here so a fast machine still shows several steps): counts
  move, never go down, and are exact at the end.
- A cancel or an expiry mid-run keeps every answer the model gave: output.jsonl holds exactly the
  completions the model's own log says it answered; every other request is a `batch_cancelled` /
  `batch_expired` line; the invariant holds.
- A Message Batch (the `anthropic` SDK), cancelled mid-run, shows the same live counts in its own
  dialect: `request_counts` move while it runs and always sum to its requests, `processing_status`
  only moves forward (in_progress, canceling, ended), and its results hold every answer once, the
  rest `canceled`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from anthropic import Anthropic

from batchinfer_local import LocalStack
from support.api_stack import MODEL, api_client, chat_line, create, jsonl, result_lines, upload
from support.invariant import assert_batch_invariant
from support.live import AnswerLog, assert_counts_monotonic, output_completion_ids, watch
from support.stacks import SharedStacks, StackConfig

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

# One "hour" of completion_window lasts this many seconds here: a "1h" batch expires mid-run.
HOUR_S = 12


LIVE = StackConfig(
    "live-batch",
    schedule_interval=1.0,
    # At most 4 shard workers (3 for the one account: AccountShardShare 0.8; the template's default
    # is 20): each environment loads the model, and at an expiry every request at the model still
    # runs to its end, so 16 workers spent most of the expiry test on model loads and answers.
    parameter_overrides={"ShardSize": "8", "RemoteShardSize": "8", "MaxShardWorkers": "4"},
    # Two requests in flight per shard worker (the engine would take every request of a shard at
    # once): a cancel or an expiry mid-run then finds requests that never reached the model.
    function_environment={
        "POWERTOOLS_LOG_LEVEL": "DEBUG",
        "WINDOW_HOUR_SECONDS": str(HOUR_S),
        "WORKER_CONCURRENCY": "2",
        "PROGRESS_SECONDS": "0.25",
    },
    heavy=True,
)
pytestmark = [*pytestmark, LIVE.mark]


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(LIVE, tmp_path_factory.mktemp("live-batch")) as shared:
        yield shared.stack


@pytest.fixture
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with api_client(stack, stack.api_key) as client:
        yield client
    stack.wait_idle(120)


def batch_file(tag: str, n: int, max_tokens: int) -> tuple[bytes, str]:
    lines = [
        chat_line(f"{tag}-{i:02d}", f"Write a line about the number {i}.", max_tokens=max_tokens)
        for i in range(n)
    ]
    data = jsonl(*lines)
    return data, data.decode()


def run(
    http: httpx.Client, data: bytes, on_poll: Any = None, **fields: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    """Create a batch and GET it until terminal; (every snapshot, completion ids the model answered)."""
    with AnswerLog() as answers:
        created = create(http, upload(http, data), **fields).json()
        series = watch(
            lambda: http.get(f"/batches/{created['id']}").raise_for_status().json(),
            on_poll=on_poll,
            timeout_s=500,
        )
    return series, answers.ids


def results(http: httpx.Client, batch: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return result_lines(http, batch["output_file_id"]), result_lines(http, batch["error_file_id"])


def raw(http: httpx.Client, file_id: str | None) -> bytes | None:
    return http.get(f"/files/{file_id}/content").content if file_id else None


def test_get_shows_requests_as_they_finish(http: httpx.Client) -> None:
    # Given a 24-request batch on the embedded model (three shards of 8)
    data, text = batch_file("live", 24, max_tokens=8)

    # When it runs, GET polled every 0.2 s
    series, answered = run(http, data)

    # Then GET showed at least 4 distinct partial completed counts, never going down, exact at the end
    final = series[-1]
    partial = {b["request_counts"]["completed"] for b in series if b["status"] == "in_progress"} - {0, 24}
    assert len(partial) >= 4, sorted(partial)
    assert_counts_monotonic(series)
    assert final["status"] == "completed"
    assert final["request_counts"] == {"total": 24, "completed": 24, "failed": 0}
    assert_batch_invariant(final, text, raw(http, final["output_file_id"]), raw(http, final["error_file_id"]))
    output, _ = results(http, final)
    assert sorted(output_completion_ids(output)) == sorted(answered)
    assert final["usage"]["output_tokens"] == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in output
    )


def test_cancel_mid_run_keeps_every_answer(http: httpx.Client) -> None:
    # Given a 64-request batch on the embedded model (far more than a fast machine answers between two
    # GETs, so the cancel finds it running)
    data, text = batch_file("cancel", 64, max_tokens=16)
    cancelled: list[dict[str, Any]] = []

    def cancel_after_some_answers(batch: dict[str, Any]) -> None:
        if not cancelled and batch["request_counts"]["completed"] >= 3:
            cancelled.append(http.post(f"/batches/{batch['id']}/cancel").raise_for_status().json())

    # When it is cancelled once GET shows 3 answers
    series, answered = run(http, data, on_poll=cancel_after_some_answers)

    # Then it ends cancelled with every answer the model gave in output.jsonl, the rest batch_cancelled
    final = series[-1]
    output, errors = results(http, final)
    assert cancelled[0]["status"] == "cancelling"
    assert final["status"] == "cancelled"
    assert sorted(output_completion_ids(output)) == sorted(answered)
    assert 3 <= len(output) < 64
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert all(line["response"] is None for line in errors)
    assert final["request_counts"] == {"total": 64, "completed": len(output), "failed": 64 - len(output)}
    assert final["cancelled_at"] >= final["cancelling_at"]
    assert_counts_monotonic([b for b in series if b["status"] != "cancelled"])
    assert_batch_invariant(final, text, raw(http, final["output_file_id"]), raw(http, final["error_file_id"]))


def test_expiry_mid_run_keeps_every_answer(http: httpx.Client) -> None:
    # Given a 192-request batch with a "1h" window that lasts HOUR_S seconds here (a quiet machine
    # answers about 50 of them in that time: the window ends mid-run on a fast one too, and the test
    # lasts about HOUR_S whatever the size, since what never ran ends at once)
    data, text = batch_file("expiry", 192, max_tokens=64)

    # When it runs past its window
    series, answered = run(http, data, completion_window="1h")

    # Then it ends expired with every answer the model gave in output.jsonl, the rest batch_expired
    final = series[-1]
    output, errors = results(http, final)
    assert final["status"] == "expired"
    assert final["expires_at"] - final["created_at"] == HOUR_S
    assert sorted(output_completion_ids(output)) == sorted(answered)
    assert 1 <= len(output) < 192
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}
    assert final["request_counts"] == {"total": 192, "completed": len(output), "failed": 192 - len(output)}
    assert_batch_invariant(final, text, raw(http, final["output_file_id"]), raw(http, final["error_file_id"]))


# ---- A Message Batch cancelled mid-run, through the anthropic SDK.

PROCESSING_ORDER = ("in_progress", "canceling", "ended")


@pytest.fixture
def sdk(stack: LocalStack) -> Iterator[Anthropic]:
    yield Anthropic(base_url=stack.base_url, api_key=stack.api_key, max_retries=0)
    stack.wait_idle(120)


def message_requests(tag: str, n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{tag}-{i:02d}",
            "params": {
                "model": MODEL,
                "max_tokens": max_tokens,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Write a line about the number {i}."}],
            },
        }
        for i in range(n)
    ]


def run_messages(
    sdk: Anthropic, requests: list[dict[str, Any]], on_poll: Any = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Create a Message Batch and retrieve it until ended; (every snapshot, completion ids answered)."""
    with AnswerLog() as answers:
        batch_id = sdk.messages.batches.create(requests=requests).id
        series = watch(
            lambda: sdk.messages.batches.retrieve(batch_id).model_dump(mode="json"),
            until=lambda batch: batch["processing_status"] == "ended",
            on_poll=on_poll,
            timeout_s=500,
        )
    return series, answers.ids


def assert_message_counts_live(series: list[dict[str, Any]], total: int) -> None:
    """Every snapshot's counts sum to `total`; `processing_status` never goes back; processing never
    goes up and no other count goes down from one retrieve to the next."""
    steps = [PROCESSING_ORDER.index(batch["processing_status"]) for batch in series]
    assert steps == sorted(steps), [batch["processing_status"] for batch in series]
    previous = None
    for batch in series:
        counts = batch["request_counts"]
        assert sum(counts.values()) == total, counts
        now = (-counts["processing"], counts["succeeded"], counts["errored"], counts["canceled"])
        if previous is not None:
            assert all(a <= b for a, b in zip(previous, now, strict=True)), (previous, now)
        previous = now


def message_ids(answered: list[str]) -> list[str]:
    return sorted(f"msg_{completion.removeprefix('chatcmpl-')}" for completion in answered)


def test_a_message_batch_cancelled_mid_run_keeps_every_answer(sdk: Anthropic) -> None:
    # Given a 64-request Message Batch (more than a fast machine answers between two retrieves)
    requests = message_requests("msg-cancel", 64, max_tokens=8)
    cancelled: list[str] = []

    def cancel_after_some_answers(batch: dict[str, Any]) -> None:
        if not cancelled and batch["request_counts"]["succeeded"] >= 3:
            cancelled.append(sdk.messages.batches.cancel(batch["id"]).processing_status)

    # When it is cancelled once retrieve shows 3 answers
    series, answered = run_messages(sdk, requests, on_poll=cancel_after_some_answers)

    # Then its counts moved while it ran (some succeeded, others processing), always summing to 64,
    # and it went in_progress -> (canceling) -> ended
    final = series[-1]
    assert cancelled == ["canceling"]
    running = [b["request_counts"] for b in series if b["processing_status"] == "in_progress"]
    assert any(counts["succeeded"] >= 3 and counts["processing"] > 0 for counts in running), running
    assert (series[0]["processing_status"], series[-1]["processing_status"]) == ("in_progress", "ended")
    assert_message_counts_live(series, 64)
    # And every answer the model gave is a succeeded result, once; the rest canceled
    lines = list(sdk.messages.batches.results(final["id"]))
    succeeded = [line for line in lines if line.result.type == "succeeded"]
    assert [line.custom_id for line in lines] == [r["custom_id"] for r in requests]
    assert sorted(line.result.message.id for line in succeeded) == message_ids(answered)
    assert 3 <= len(succeeded) < 64
    assert {line.result.type for line in lines} == {"succeeded", "canceled"}
    assert final["request_counts"] == {
        "processing": 0,
        "succeeded": len(succeeded),
        "errored": 0,
        "canceled": 64 - len(succeeded),
        "expired": 0,
    }
    assert final["ended_at"] >= final["cancel_initiated_at"]
